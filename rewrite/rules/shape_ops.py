"""Shape and layout ops that do nothing, or chains of them that collapse into one.

Read a rule as ``left -> right when conditions``; tables of literal permutations and dtypes are
expanded by the comprehensions at the bottom of each ruleset. Beyond the conditions written here,
the engine accepts a replacement only where its dtype and shape equal the matched expression's:
that is what makes ``squeeze.dim(x, d) -> x`` (dim d is not of size 1), ``slice(x, d, 0, e) -> x``
(e reaches the end) and ``expand(expand(x, a), b) -> expand(x, b)`` (no -1 that would read a
different size) sound, and check_rule models the same guard.

Views and copies: every replacement here computes the same values; whether the result is a view
of an input or a fresh tensor may change (``cat([x]) -> x``). In functional ATen graphs that is
only observable through graph outputs and through inputs the graph mutates (copy_), which the
optimizer guards at the graph boundary, and through later ``view`` ops that need a viewable
layout: so a fresh copy is never replaced by a bare ``view`` of something else, only by
``reshape`` (which copies when it must).

Deliberately left out: ``clone(x) -> x`` in general. AOTAutograd emits ``clone`` exactly where a
later ``view`` needs a contiguous layout (``expand -> clone -> view``), so dropping it breaks
that view; ``_unsafe_view(clone(x)) -> reshape(x)`` below keeps the values and the safety. What is
sound is dropping a layout-preserving clone of a value that a compute op has just produced
(FRESH_CLONES): that value is already a dense tensor nobody else holds or mutates, and the clone
would copy it with the same strides.
"""
from __future__ import annotations

import itertools
import operator

import sympy
import torch

from ..dsl import RuleSet, aten, dim_is, dtype_is, made_by, prims, rule, same_shape, shape_is, variables
from ..ops import ALL_DTYPES as ALL
from ..ops import GEMMS, INTS, target_name

__all__ = ["NOOPS", "VIEW_CHAINS", "PERMUTES", "CASTS", "FRESH_CLONES", "FRESH_COPIES", "POINTWISE_RESHAPES", "RULESETS"]

x, s, a, b, d, e, m, dt, v, y = variables("x s a b d e m dt v y")


def tensor(v):
    return dtype_is(v, *ALL)


# -- shape ops that return their input unchanged --------------------------------------------------
NOOPS = RuleSet("shape.noops", [
    rule(aten.view.default(x, s),                x, when=[shape_is(x, s)], name="view_same_shape"),
    rule(aten.reshape.default(x, s),             x, when=[shape_is(x, s)], name="reshape_same_shape"),
    rule(aten._unsafe_view.default(x, s),        x, when=[shape_is(x, s)], name="unsafe_view_same_shape"),
    rule(aten.expand.default(x, s),              x, when=[shape_is(x, s)], name="expand_same_shape"),
    rule(aten.transpose.int(x, d, d),            x, when=[tensor(x)],      name="transpose_same_dim"),
    rule(aten.slice.Tensor(x, d, 0, e, 1),       x, when=[tensor(x)],      name="slice_full_from_0"),
    rule(aten.slice.Tensor(x, d, None, e, 1),    x, when=[tensor(x)],      name="slice_full_from_none"),
    rule(aten.squeeze.dims(x, []),               x, when=[tensor(x)],      name="squeeze_no_dims"),
    rule(aten.squeeze.dim(x, d),                 x, when=[tensor(x)],      name="squeeze_dim_not_one"),
    rule(aten.squeeze.default(x),                x, when=[tensor(x)],      name="squeeze_no_ones"),
    rule(aten.squeeze.dims(x, s),                x, when=[tensor(x)],      name="squeeze_dims_not_one"),
    rule(aten.cat.default([x], d),               x, when=[tensor(x)],      name="cat_single"),
    rule(aten.alias.default(x),                  x, when=[tensor(x)],      name="alias"),
    rule(aten._to_copy.default(x),               aten.clone.default(x), when=[tensor(x)], name="to_copy_is_clone"),
    rule(aten.repeat.default(x, s),              x, when=[tensor(x)],      name="repeat_once"),
    rule(aten.slice_scatter.default(x, y, d, 0, e, 1),    y, when=[same_shape(x, y)], name="slice_scatter_full_from_0"),
    rule(aten.slice_scatter.default(x, y, d, None, e, 1), y, when=[same_shape(x, y)], name="slice_scatter_full_from_none"),
] + [
    rule(aten.constant_pad_nd.default(x, [0] * (2 * k), v), x, when=[tensor(x)], name=f"pad_zero_{k}d")
    for k in range(1, 4)
] + [
    rule(getattr(aten, f).default(x), x, when=[dtype_is(x, *INTS)], name=f"{f}_of_integers")
    for f in ("ceil", "floor", "round", "trunc")
] + [
    rule(prims.convert_element_type.default(x, t), x, when=[dtype_is(x, t)],
         name=f"convert_same_dtype_{str(t).replace('torch.', '')}")
    for t in ALL
] + [
    rule(aten.permute.default(x, list(range(r))), x, when=[tensor(x)], name=f"permute_identity_rank{r}")
    for r in range(0, 6)
] + [
    rule(aten._to_copy.default(x, dtype=t), aten.clone.default(x), when=[dtype_is(x, t)],
         name=f"to_copy_same_dtype_{str(t).replace('torch.', '')}")
    for t in ALL
], description="view/reshape/expand/repeat to the same shape, identity permute, full slice and slice_scatter, zero pad, "
                "single cat, casts to the same dtype, rounding of integers")

# -- chains of view-like ops collapse into the last one ---------------------------------------------
# view needs a viewable layout; if view(view(x, a), b) ran then view(x, b) runs too (both split and
# merge the same contiguous runs of x). Anything involving reshape or a copy becomes reshape.
view, reshape, unsafe_view = aten.view.default, aten.reshape.default, aten._unsafe_view.default
VIEW_CHAINS = RuleSet("shape.view_chains", [
    rule(view(view(x, a), b),                  view(x, b),        when=[tensor(x)], name="view_view"),
    rule(unsafe_view(unsafe_view(x, a), b),    unsafe_view(x, b), when=[tensor(x)], name="unsafe_view_unsafe_view"),
    rule(view(unsafe_view(x, a), b),           view(x, b),        when=[tensor(x)], name="view_unsafe_view"),
    rule(unsafe_view(view(x, a), b),           unsafe_view(x, b), when=[tensor(x)], name="unsafe_view_view"),
    rule(reshape(reshape(x, a), b),            reshape(x, b),     when=[tensor(x)], name="reshape_reshape"),
    rule(reshape(view(x, a), b),               reshape(x, b),     when=[tensor(x)], name="reshape_view"),
    rule(view(reshape(x, a), b),               reshape(x, b),     when=[tensor(x)], name="view_reshape"),
    rule(unsafe_view(aten.clone.default(x, memory_format=m), s), reshape(x, s), when=[tensor(x)], name="unsafe_view_clone"),
    rule(aten.expand.default(aten.expand.default(x, a), b), aten.expand.default(x, b), when=[tensor(x)], name="expand_expand"),
    rule(aten.squeeze.dim(aten.unsqueeze.default(x, d), d),     x, when=[tensor(x)], name="squeeze_unsqueeze"),
    rule(aten.squeeze.dims(aten.unsqueeze.default(x, d), [d]),  x, when=[tensor(x)], name="squeeze_dims_unsqueeze"),
    rule(aten.unsqueeze.default(aten.squeeze.dim(x, d), d),     x, when=[tensor(x)], name="unsqueeze_squeeze"),
    rule(aten.transpose.int(aten.transpose.int(x, a, b), a, b), x, when=[tensor(x)], name="transpose_transpose"),
    rule(aten.transpose.int(aten.transpose.int(x, a, b), b, a), x, when=[tensor(x)], name="transpose_transpose_swapped"),
    rule(aten.t.default(aten.t.default(x)),                     x, when=[tensor(x)], name="t_t"),
], description="view/reshape/expand chains, squeeze/unsqueeze and transpose pairs")


# -- permute of permute ---------------------------------------------------------------------------
def _compose(p: tuple, q: tuple) -> list[int]:
    """permute(permute(x, p), q) == permute(x, [p[i] for i in q])."""
    return [p[i] for i in q]


def _inverse(p: tuple) -> list[int]:
    inv = [0] * len(p)
    for i, j in enumerate(p):
        inv[j] = i
    return inv


def _permute_rules() -> list:
    permute = aten.permute.default
    rules = []
    for rank in (2, 3, 4):
        identity = tuple(range(rank))
        perms = [p for p in itertools.permutations(range(rank)) if p != identity]
        for p in perms:
            # An inverse pair cancels (every rank up to 4, which covers attention's [0, 2, 1, 3]).
            rules.append(rule(permute(permute(x, list(p)), _inverse(p)), x, when=[tensor(x)],
                              name=f"permute_inverse_{''.join(map(str, p))}"))
            if rank > 3:
                continue  # 23 x 22 rank-4 compositions are not worth their matching cost
            for q in perms:
                composed = _compose(p, q)
                if tuple(composed) != identity:
                    rules.append(rule(permute(permute(x, list(p)), list(q)), permute(x, composed), when=[tensor(x)],
                                      name=f"permute_compose_{''.join(map(str, p))}_{''.join(map(str, q))}"))
    return rules


# -- a permute that only moves dims of size 1 is a reshape -------------------------------------------
# Size-1 dims hold no elements of their own: if the other dims keep their relative order, the
# permuted tensor has the same elements in the same row-major order, i.e. it is a reshape (a view:
# adding and removing size-1 dims is always viewable). Symbolic dims count as not 1 (Dynamo
# specializes 1), which only makes the rule fire less. One rule per permutation and minimal set of
# size-1 dims it moves (rank <= 4; the table is expanded below); the replacement is computed because
# it needs the permuted sizes: numbers, or the sizes read off x (aten.sym_size.int) when symbolic.
def _as_reshape(perm: tuple):
    def reshape_to_permuted_shape(x):
        shape = tuple(x.shape)
        return reshape(_X, [int(shape[d]) if sympy.sympify(shape[d]).is_Integer else aten.sym_size.int(_X, d)
                            for d in perm])
    return reshape_to_permuted_shape


def _size_one_sets(perm: tuple) -> list:
    """The minimal sets of dims that, being of size 1, make ``perm`` keep the other dims in order."""
    found: list = []
    for k in range(1, len(perm)):
        for ones in itertools.combinations(range(len(perm)), k):
            kept = [d for d in perm if d not in ones]
            if kept == sorted(kept) and not any(set(f) < set(ones) for f in found):
                found.append(ones)
    return found


def _size_one_permute_rules(max_rank: int = 4) -> list:
    return [
        rule(aten.permute.default(x, list(p)), _as_reshape(p), when=[tensor(x)] + [dim_is(x, i, 1) for i in ones],
             name=f"permute_{''.join(map(str, p))}_moves_ones_{''.join(map(str, ones))}")
        for r in range(2, max_rank + 1) for p in itertools.permutations(range(r)) if list(p) != list(range(r))
        for ones in _size_one_sets(p)
    ]


_X = x
PERMUTES = RuleSet("shape.permutes", _permute_rules() + _size_one_permute_rules(),
                   description="permute of permute: inverse pairs cancel (rank <= 4), others compose (rank <= 3); "
                               "a permute moving only size-1 dims is a reshape (rank <= 4)")

# -- casts through a dtype that holds every value of the source exactly ---------------------------
# ``_to_copy(_to_copy(x, mid), dst) -> _to_copy(x, dst)`` when ``mid`` represents every value of
# x's dtype exactly: the first cast loses nothing, so casting x directly gives the same result.
# (Combined with to_copy_same_dtype, a round trip f32 -> f64 -> f32 becomes a clone of x.)
EXACT_IN = {
    torch.float64: (torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool),
    torch.float32: (torch.float16, torch.bfloat16, torch.int16, torch.int8, torch.uint8, torch.bool),
    torch.float16: (torch.int8, torch.uint8, torch.bool),
    torch.bfloat16: (torch.int8, torch.uint8, torch.bool),
    torch.int64: (torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool),
    torch.int32: (torch.int16, torch.int8, torch.uint8, torch.bool),
    torch.int16: (torch.int8, torch.uint8, torch.bool),
}
CASTS = RuleSet("shape.casts", [
    rule(aten._to_copy.default(aten._to_copy.default(x, dtype=mid), dtype=dt), aten._to_copy.default(x, dtype=dt),
         when=[dtype_is(x, *sources)], name=f"cast_through_{str(mid).replace('torch.', '')}")
    for mid, sources in EXACT_IN.items()
], description="a cast through a wider dtype that loses nothing collapses into one cast")

# -- a clone of a value just computed is a copy nobody needs -----------------------------------------
# Compute ops (TensorIterator kernels) return a fresh, dense tensor; clone with the default
# (preserve) memory format copies it with the same strides. Only the graph can see that value, and
# functional graphs mutate nothing but their inputs, so the copy changes nothing.
_UNARY_COMPUTE = ("neg", "abs", "relu", "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "sin", "cos", "reciprocal")
_BINARY_COMPUTE = (("add", "Tensor"), ("sub", "Tensor"), ("mul", "Tensor"), ("div", "Tensor"),
                   ("maximum", "default"), ("minimum", "default"))
FRESH_CLONES = RuleSet("shape.fresh_clones", [
    rule(aten.clone.default(getattr(aten, name).default(x)), getattr(aten, name).default(x), when=[tensor(x)],
         name=f"clone_of_{name}")
    for name in _UNARY_COMPUTE
] + [
    rule(aten.clone.default(getattr(getattr(aten, name), overload)(x, y)), getattr(getattr(aten, name), overload)(x, y),
         when=[tensor(x)], name=f"clone_of_{name}")
    for name, overload in _BINARY_COMPUTE
], description="clone (preserve format) of a freshly computed elementwise result is dropped")

# -- copies of what a GEMM, softmax, GELU or layer norm just produced ----------------------------------
# The same argument as FRESH_CLONES, also for the producers transformer graphs clone (dropout in
# eval mode becomes ``clone``), in any memory format and through the view that reshaped the result: the
# values are the same, the copy would be as dense as its source, and views are rewritten as
# reshapes once a rule fired (rewrite.passes.boundary). ``made_by`` says the value is such a result
# (``getitem``: an output of a multi-output kernel, e.g. layer norm's normalized tensor).
_FRESH = (*sorted(GEMMS, key=target_name), aten._softmax.default, aten.gelu.default,
          operator.getitem, *(getattr(aten, n).default for n in _UNARY_COMPUTE),
          *(getattr(getattr(aten, n), o) for n, o in _BINARY_COMPUTE))
FRESH_COPIES = RuleSet("shape.fresh_copies", [
    rule(aten.clone.default(x, memory_format=m), x, when=[tensor(x), made_by(x, *_FRESH)], name="copy_of_fresh"),
    rule(aten.clone.default(view(x, s), memory_format=m), reshape(x, s), when=[tensor(x), made_by(x, *_FRESH)],
         name="copy_of_viewed_fresh"),
], description="clone (any format) of a fresh GEMM/softmax/GELU/multi-output result, or of its view, is dropped")

# -- a unary pointwise op does not care how its input is shaped ---------------------------------------
# f(view(y, s)) is reshape(f(y), s): the reshape moves out, where it meets the next reshape and the
# two collapse (the view-GELU-view sandwiches between the GEMMs of transformer MLPs). AOT graphs
# spell reshapes as views, so the rules match views.
_UNARY_POINTWISE = {
    "gelu": aten.gelu.default, "gelu_tanh": lambda v: aten.gelu.default(v, approximate="tanh"), "relu": aten.relu.default,
}
# (GELU rounds by layout: bfloat16 gelu of a strided view differs in the last bit from gelu of
# the dense tensor, so its rules are exact=False.)
POINTWISE_RESHAPES = RuleSet("shape.pointwise_reshapes", [
    rule(f(view(y, s)), reshape(f(y), s), when=[tensor(y)], exact=not name.startswith("gelu"), name=f"{name}_of_view")
    for name, f in _UNARY_POINTWISE.items()
], description="a unary pointwise op of a view is the view of the op (so reshape pairs around it collapse)")

RULESETS = [NOOPS, VIEW_CHAINS, PERMUTES, CASTS, FRESH_CLONES, FRESH_COPIES, POINTWISE_RESHAPES]
