"""Hand-written passes on the IR, each one `Pass` value: ``run(step) -> {what: how many changes}`` (in place).

They hold what cannot be a DSL rule: evaluation with torch (folding), structure (inlining a branch),
content hashing (constant de-duplication), the matcher for rules with computed replacements, and the
finishing passes: what the e-graph may not decide (aliasing and layouts at a graph's edges, in-place
updates, layouts measured at the graph's shapes). The contract is `pass_type.py`'s; each module also
keeps its work as a function on the graph (``graph -> number of changes``), which tests and
`rewrite.testing` call. `rewrite.optimizer.SCHEDULE` lists the `Pass` values and says when each runs;
DSL rulesets live in `rewrite.rules`.

    pass_type.py       Pass, Step
    dead_edge.py       DEAD_EDGE          eliminate_dead_edges
    folding.py         FOLD_SIZES, FOLD   fold_sizes, fold_constants
    restrides.py       TRIVIAL_RESTRIDES  drop_trivial_restrides
    computed_rules.py  COMPUTED_RULES     apply_computed_rules
    dedup.py           DEDUP              dedup_constants
    prune.py           PRUNE              (Graph.prune)
    boundary.py        VIEWS_AS_RESHAPES, FRESH_OUTPUTS   views_as_reshapes, keep_outputs_fresh, alias_base
    reinplace.py       REINPLACE          reinplace_buffer_updates
    channels_last.py   CHANNELS_LAST      channels_last_convolutions
"""
from .boundary import FRESH_OUTPUTS, VIEWS_AS_RESHAPES, alias_base, keep_outputs_fresh, views_as_reshapes
from .channels_last import CHANNELS_LAST, channels_last_convolutions
from .computed_rules import COMPUTED_RULES, apply_computed_rules
from .dead_edge import DEAD_EDGE, eliminate_dead_edges
from .dedup import DEDUP, dedup_constants
from .folding import FOLD, FOLD_SIZES, fold_constants, fold_sizes
from .pass_type import Pass, Step
from .prune import PRUNE
from .reinplace import REINPLACE, reinplace_buffer_updates
from .restrides import TRIVIAL_RESTRIDES, drop_trivial_restrides

__all__ = ["Pass", "Step",
           "DEAD_EDGE", "FOLD_SIZES", "FOLD", "TRIVIAL_RESTRIDES", "COMPUTED_RULES", "DEDUP", "PRUNE",
           "VIEWS_AS_RESHAPES", "FRESH_OUTPUTS", "REINPLACE", "CHANNELS_LAST",
           "alias_base", "apply_computed_rules", "channels_last_convolutions", "eliminate_dead_edges",
           "dedup_constants", "drop_trivial_restrides", "fold_constants", "fold_sizes", "keep_outputs_fresh",
           "reinplace_buffer_updates", "views_as_reshapes"]
