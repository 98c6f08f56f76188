"""Hand-written passes on the IR: each a function ``graph -> number of changes`` (in place).

They hold what cannot be a DSL rule: evaluation with torch (folding), structure (inlining a branch),
content hashing (constant de-duplication) and the matcher for rules with computed replacements.
`rewrite.optimizer.SCHEDULE` says when each runs; DSL rulesets live in `rewrite.rules`.
"""
from .channels_last import channels_last_convolutions
from .computed_rules import apply_computed_rules
from .dead_edge import eliminate_dead_edges
from .dedup import dedup_constants
from .folding import fold_constants, fold_sizes
from .reinplace import reinplace_buffer_updates

__all__ = ["apply_computed_rules", "channels_last_convolutions", "eliminate_dead_edges", "dedup_constants", "fold_constants", "fold_sizes",
           "reinplace_buffer_updates"]
