"""The rule library: DSL rulesets, one module per family.

* ``shape_ops`` - view/reshape/permute/expand/slice/cat/cast identities, copies of fresh values (family ``shape``)
* ``algebra``   - algebraic identities (family ``algebra``)
* ``gemm``      - GEMMs with frozen weights: parallel ones merged, scales and batch norms folded (family ``gemm``)
* ``fused``     - fused ATen kernels as alternatives: tanh GELU, oneDNN linear with post-ops (family ``fused``)

A rule module contributes ``RULESETS: list[RuleSet]`` (and ``LEFT_OUT``, the rules this build
lacks, with why). A ruleset's name is ``family.name``. `LIBRARY` is the rulesets, as values, in the
order the schedule runs them (the order's one home: `rewrite.optimizer.SCHEDULE` runs them in it and says
how often each runs per round); this package knows nothing of the schedule (egglog's separation: rulesets carry rules). Hand-written passes (folding, dedup, dead
edges) live in `rewrite.passes`. `library.py` holds `LIBRARY` and what a compile does with it. Users add rulesets through
``CompilerConfig().rules.extra`` and switch rules off by name (a rule, a ruleset or a whole family)
through ``CompilerConfig().rules.disabled`` (`without`).
"""
from __future__ import annotations

from . import algebra, fused, gemm, shape_ops
from .library import LIBRARY, check_user_rulesets, default_rulesets, left_out, ruleset_family, without

__all__ = ["LIBRARY", "default_rulesets", "check_user_rulesets", "without", "ruleset_family", "left_out"]
