"""Shapes from torch's own meta kernels: the shape function of every op without a hand rule.

Inputs become FakeTensors under a ShapeEnv that knows the graph's symbols (same sympy symbols,
same ranges), the op runs, and the fake outputs' sizes are read back as sympy expressions.
ShapeEnv needs a "hint" (an example value) per symbol to decide the branches a kernel takes; we
give every symbol a distinct prime inside its range, so no two symbols (or products of symbols)
look equal by accident, which would make torch record a false equality.
"""
from __future__ import annotations

import logging

import sympy
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv
from torch.fx.node import map_aggregate
from torch.utils._sympy.numbers import int_oo
from torch.utils._sympy.value_ranges import ValueRanges

from ..ir import MIN_INT64, SymMeta, TensorMeta, iter_metas
from ..ops import is_nondeterministic, is_pointwise, target_name
from .context import ShapeInferenceError, to_expr

log = logging.getLogger("rewrite")

__all__ = ["KernelRunner", "probe_dtype"]

_PRIMES = [p for p in range(11, 2000) if all(p % d for d in range(2, int(p ** 0.5) + 1))]


class KernelRunner:
    """Runs ops on FakeTensors whose sizes are the graph's symbols."""

    def __init__(self, ctx):
        self.ctx = ctx
        self.shape_env = ShapeEnv()
        self.mode = FakeTensorMode(shape_env=self.shape_env, allow_non_fake_inputs=True)
        # FakeTensor results are cached per process; our throwaway ShapeEnvs must not leave
        # entries that a later Dynamo trace could hit.
        self.mode.cache_enabled = False
        self.hints: dict[sympy.Symbol, int] = {}

    # -- symbols -----------------------------------------------------------------------------
    def _declare(self, s: sympy.Symbol) -> None:
        if s in self.hints:
            return
        lo, hi = self.ctx.range_of(s)
        used = set(self.hints.values())
        hint = next((p for p in _PRIMES if p >= max(lo, 2) and (hi is None or p <= hi) and p not in used), None)
        if hint is None:  # a tight range: any value inside it
            hint = max(lo, 0) if hi is None else hi
        self.hints[s] = hint
        self.shape_env.add_backed_var_to_val(s, hint)
        # (private, but the one call that also records where the bounds came from)
        self.shape_env._update_var_to_range(s, ValueRanges(lo, int_oo if hi is None else hi))

    def _int(self, expr):
        expr = to_expr(expr)
        if expr.is_Integer:
            return int(expr)
        for s in expr.free_symbols:
            self._declare(s)
        hint = expr.xreplace({s: sympy.Integer(v) for s, v in self.hints.items()})
        return self.shape_env.create_symintnode(expr, hint=int(hint))

    def _scalar(self, meta: SymMeta):
        expr = to_expr(meta.expr)
        if not expr.free_symbols:
            return meta.pytype(expr) if meta.pytype is not bool else bool(expr)
        if meta.pytype is int:
            return self._int(expr)
        for s in expr.free_symbols:
            self._declare(s)
        hint = expr.xreplace({s: sympy.Integer(v) for s, v in self.hints.items()})
        if meta.pytype is bool:
            return self.shape_env.create_symboolnode(expr) if hasattr(self.shape_env, "create_symboolnode") else bool(hint)
        return self.shape_env.create_symfloatnode(expr, hint=float(hint))

    def _tensor(self, meta: TensorMeta):
        if meta.shape is None:
            raise ShapeInferenceError("unknown rank")
        size = [self._int(s) for s in meta.shape]
        return torch.empty(size, dtype=meta.dtype, device=meta.device)

    def _lift(self, x):
        """An argument leaf as the kernel takes it: metas and sizes become fake tensors and SymInts."""
        if isinstance(x, TensorMeta):
            return self._tensor(x)
        if isinstance(x, SymMeta):
            return self._scalar(x)
        if isinstance(x, sympy.Expr):
            return self._int(x)
        return x

    # -- running -----------------------------------------------------------------------------
    def run(self, target, args, kwargs):
        """The op's output metas, computed by its meta kernel."""
        before = dict(self.shape_env.replacements)
        with self.mode:
            fake_args, fake_kwargs = map_aggregate((args, kwargs), self._lift)
            out = target(*fake_args, **fake_kwargs)
        self._check_no_specialization(target, before)
        return self._rename_data_dependent(self._metas(out))

    def _rename_data_dependent(self, metas):
        """Sizes only the data knows (``nonzero``, ``item``) come out as torch's ``u0, u1...``; those
        names are per ShapeEnv and would collide with the graph's own. They get fresh graph symbols."""
        new = {s for s in _free_symbols(metas) if s not in self.hints}
        if not new:
            return metas
        renames = {}
        for s in sorted(new, key=str):
            r = self.shape_env.var_to_range.get(s)
            lower = r.lower if r is not None else 0
            # item() may be negative; a data-dependent size (nonzero) is not.
            lower = int(lower) if getattr(lower, "is_Integer", False) or isinstance(lower, int) else MIN_INT64
            fresh = self.ctx.symbol_at_site(len(renames), lower=lower)
            self.ctx.data_dependent.append(fresh)
            renames[s] = fresh
        return _xreplace(metas, renames)

    def _check_no_specialization(self, target, before) -> None:
        """A kernel that fixed one of our symbols to its example value would give a wrong shape."""
        for s, v in self.shape_env.replacements.items():
            if s in before or s not in self.hints:
                continue
            if to_expr(v).is_Number:
                raise ShapeInferenceError(
                    f"{target_name(target)}: its meta kernel only works when {s} == {v}; the shape is "
                    "not symbolic in that size (give the op a hand rule or make the size static)")

    def _metas(self, out):
        if isinstance(out, torch.Tensor):
            return TensorMeta(out.dtype, tuple(self._expr(s) for s in out.shape), out.device)
        if isinstance(out, (tuple, list)):
            return tuple(self._metas(o) for o in out)
        if isinstance(out, (torch.SymBool, bool)):
            return SymMeta(self._expr(out), bool)
        if isinstance(out, (torch.SymInt, int)):
            return SymMeta(self._expr(out), int)
        if isinstance(out, (torch.SymFloat, float)):
            return SymMeta(self._expr(out), float)
        if out is None:
            return None
        raise ShapeInferenceError(f"meta kernel returned an unsupported value of type {type(out).__name__}")

    def _expr(self, v):
        if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return self.ctx.simplify(self.shape_env.simplify(v.node.expr))
        return to_expr(v)


def _free_symbols(metas) -> set:
    syms = set()
    for m in iter_metas(metas):
        if isinstance(m, TensorMeta):
            syms.update(*(to_expr(d).free_symbols for d in m.shape or ()))
        elif isinstance(m, SymMeta):
            syms.update(to_expr(m.expr).free_symbols)
    return syms


def _xreplace(metas, mapping):
    def leaf(m):
        if isinstance(m, TensorMeta):
            return TensorMeta(m.dtype, tuple(to_expr(d).xreplace(mapping) for d in m.shape), m.device)
        if isinstance(m, SymMeta):
            return SymMeta(to_expr(m.expr).xreplace(mapping), m.pytype)
        return m
    return map_aggregate(metas, leaf)


def probe_dtype(target, args, kwargs, unknown_rank: int | None = None):
    """Run ``target`` on small meta tensors with the inputs' dtypes; returns its output (for dtypes).

    Elementwise ops have shapes that a hand rule computes best (broadcasting), but dtype promotion
    has many special cases (comparisons, true division, integer pow, ``dtype=`` kwargs); the op's
    own meta kernel on 1-element tensors gets them all right. Rank 0 stays rank 0, because 0-dim
    tensors take part in promotion differently.

    With ``unknown_rank=r`` the probe instead keeps known ranks (static sizes as they are, symbolic
    sizes as 1) and gives tensors of unknown rank ``r`` dimensions of size 1.

    A dtype probe of a deterministic pointwise op (1-element tensors) runs its CPU kernel on ones first, and its meta kernel
    only where that fails (no CPU kernel for a dtype, a value check): many meta kernels are Python
    references whose first call imports torch._dynamo (over a second), which a process that only
    loads an export would otherwise pay. Promotion does not depend on the device.
    """
    key = _probe_key(target, args, kwargs, unknown_rank)
    if key is not None and key in _probe_cache:
        return _probe_cache[key]
    out = None
    if unknown_rank is None and is_pointwise(target) and not is_nondeterministic(target):  # never touch the RNG
        try:
            out = _run_probe(target, args, kwargs, unknown_rank, "cpu")
        except Exception:  # noqa: BLE001 - the meta kernel below decides
            out = None
    if out is None:
        out = _run_probe(target, args, kwargs, unknown_rank, "meta")
    if key is not None and len(_probe_cache) < 4096:
        _probe_cache[key] = out
    return out


def _run_probe(target, args, kwargs, unknown_rank: int | None, device: str):
    """``target`` on stand-ins of ``args``: tensors of ones on ``device`` with the inputs' dtypes."""
    def lift(x):
        if isinstance(x, TensorMeta):
            if unknown_rank is None:
                shape = (1,) * (1 if x.shape is None else min(len(x.shape), 1))
            elif x.shape is None:
                shape = (1,) * unknown_rank
            else:
                shape = tuple(int(s) if to_expr(s).is_Integer else 1 for s in x.shape)
            return torch.ones(shape, dtype=x.dtype, device=device)
        if isinstance(x, SymMeta):
            e = to_expr(x.expr)
            if unknown_rank is not None and e.is_Number:
                return x.pytype(e) if x.pytype is not bool else bool(e)
            return {int: 1, float: 1.0, bool: True}[x.pytype]
        if isinstance(x, sympy.Expr):
            return int(x) if x.is_Integer else 1
        if isinstance(x, torch.device):
            return torch.device(device)
        return x

    probe_args, probe_kwargs = map_aggregate((tuple(args), kwargs), lift)
    with torch.no_grad():
        return target(*probe_args, **probe_kwargs)


_probe_cache: dict = {}


def _probe_key(target, args, kwargs, unknown_rank):
    """What a dtype probe depends on (dtypes, rank 0 or not, scalar types), or None if unhashable."""
    def part(x):
        if isinstance(x, TensorMeta):
            return ("T", x.dtype, x.shape if unknown_rank is not None else (x.shape is not None and len(x.shape) == 0))
        if isinstance(x, SymMeta):
            return ("S", x.pytype, x.expr if unknown_rank is not None else None)
        if isinstance(x, (tuple, list)):
            return (type(x).__name__,) + tuple(part(v) for v in x)
        return ("V", type(x).__name__, x)

    key = (target, unknown_rank, part(tuple(args)), tuple(sorted((k, part(v)) for k, v in kwargs.items())))
    try:
        hash(key)
    except TypeError:
        return None
    return key
