"""Sizes as the cost model counts them: elements and bytes of a meta, a symbolic size at a stand-in.

Shared by the model (work and bytes moved per op) and by the kernel timer (an input too large to
time), so both count a symbolic size the same way: at `SYMBOL_SIZE`.
"""
from __future__ import annotations

import functools

import sympy

from ..ir import TensorMeta, iter_metas

__all__ = ["SYMBOL_SIZE", "concrete", "numel", "nbytes"]

SYMBOL_SIZE = 64         # what a symbolic size counts as


@functools.lru_cache(maxsize=65_536)
def concrete(expr) -> int:
    """A size expression as a number: symbols at `SYMBOL_SIZE`, never below 0."""
    e = sympy.sympify(expr)
    if e.is_Integer:
        return int(e)
    try:
        return max(0, int(e.subs({s: SYMBOL_SIZE for s in e.free_symbols})))
    except (TypeError, ValueError):
        return SYMBOL_SIZE


def numel(meta) -> int:
    """Elements of a tensor meta (symbols at `SYMBOL_SIZE`; unknown rank: 0)."""
    if not isinstance(meta, TensorMeta) or meta.shape is None:
        return 0
    n = 1
    for s in meta.shape:
        n *= concrete(s)
    return n


def nbytes(meta) -> int:
    """Bytes of a meta or a nested structure of metas."""
    return sum(numel(m) * m.dtype.itemsize for m in iter_metas(meta) if isinstance(m, TensorMeta))
