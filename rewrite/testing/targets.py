"""Compilers under test for `check_backend`: how each compiles a function, how often it is called, how
a reproduction script spells it.

A target compiles a ``torch.nn.Module`` (a variant's GraphModule) and is called ``calls`` times on
each input (rewrite's default mode tiers up after its first calls, so the calls that matter come
later). Named targets:

=========================  ===============================================================================
``eager``                  ``torch.compile(backend="eager")``: Dynamo alone (a check of the checker)
``inductor``               ``torch.compile(backend="inductor")`` (Dynamo's automatic dynamic shapes)
``inductor-dynamic``       ``torch.compile(backend="inductor", dynamic=True)``
``inductor-freezing``      Inductor with ``torch._inductor.config.freezing = True`` (constants folded)
``rewrite``                rewrite's default mode past its tier-up (``exec.tier_up_calls = 1``, 3 calls:
                           ATen code, then planned memory and static C kernels)
``rewrite-reduce-overhead`` reduce-overhead with static per-shape kernels in a private build folder
``rewrite-dynamic``        rewrite, ``dynamic=True``: the symbolic graph
``rewrite-gears``          rewrite with gears on every dynamic dimension (dynamic graphs only): the gear
                           sizes are the drawn sizes' edges, 1 and the largest among them
=========================  ===============================================================================

Any other ``backend`` (a string torch.compile knows, or a backend callable) becomes a target that
calls ``torch.compile(module, backend=backend, dynamic=...)``.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import shutil
import tempfile
from typing import Callable

import torch

__all__ = ["Target", "TARGETS", "target_for", "CAMPAIGN_TARGETS"]


@dataclasses.dataclass
class Target:
    """A compiler under test. ``compile(module, dynamic) -> callable``; ``context()`` is entered around
    compiling and calling (a config patch); ``repro(dynamic)`` gives the lines of a script that make
    ``compiled`` from ``model``; ``gears``: inputs get `set_dim_gears` on their dynamic dimensions."""

    name: str
    compile: Callable
    calls: int = 1
    repro: Callable[[bool], list[str]] = lambda dynamic: []
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext
    gears: bool = False
    dynamic_only: bool = False
    cleanup: Callable[[], None] = lambda: None
    backends: list = dataclasses.field(default_factory=list)  # rewrite targets: each RewriteBackend made (reports)

    def __str__(self):
        return self.name


def _torch_compile(backend, dynamic_default=None, force_dynamic: bool = False):
    def compile_(module, dynamic: bool):
        dyn = True if force_dynamic else (dynamic_default if not dynamic else None)
        return torch.compile(module, backend=backend, dynamic=dyn)
    return compile_


def _repro_torch(backend_expr: str, dynamic_default=None, force_dynamic: bool = False, setup=()):
    def lines(dynamic: bool) -> list[str]:
        dyn = True if force_dynamic else (dynamic_default if not dynamic else None)
        return [*setup, f"compiled = torch.compile(model, backend={backend_expr}, dynamic={dyn!r})"]
    return lines


def _freezing():
    import torch._inductor.config as inductor_config

    return inductor_config.patch(freezing=True)


def _rewrite_target(name: str, *, mode: str | None = None, static_kernels: bool = False, gears: bool = False,
                    force_dynamic: bool = False) -> Target:
    folder: list[str] = []
    made: list = []

    def config():
        import rewrite

        cfg = rewrite.CompilerConfig()
        if mode:
            cfg.mode = mode
        else:
            cfg.exec.tier_up_calls = 1
        if static_kernels:
            if not folder:
                folder.append(tempfile.mkdtemp(prefix="rewrite-check-backend-kernels-"))
            cfg.experimental_config.aclgraph._aclnn_static_shape_kernel = True
            cfg.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = folder[0]
        return cfg

    def compile_(module, dynamic: bool):
        import rewrite

        backend = rewrite.get_backend(config())
        made.append(backend)
        del made[:-8]  # the last few, for their reports
        return torch.compile(module, backend=backend,
                             dynamic=True if force_dynamic else (False if not dynamic and not gears else None))

    def repro(dynamic: bool) -> list[str]:
        lines = ["import rewrite", "config = rewrite.CompilerConfig()"]
        if mode:
            lines.append(f"config.mode = {mode!r}")
        else:
            lines.append("config.exec.tier_up_calls = 1  # ATen code on the first call, tiered up after")
        if static_kernels:
            lines += ["import tempfile",
                      "config.experimental_config.aclgraph._aclnn_static_shape_kernel = True",
                      "config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir = tempfile.mkdtemp()"]
        dyn = True if force_dynamic else (False if not dynamic and not gears else None)
        lines.append(f"compiled = torch.compile(model, backend=rewrite.get_backend(config), dynamic={dyn!r})")
        return lines

    def cleanup():
        while folder:
            shutil.rmtree(folder.pop(), ignore_errors=True)

    return Target(name, compile_, calls=1 if mode else 3, repro=repro, gears=gears, dynamic_only=gears,
                  cleanup=cleanup, backends=made)


def _named() -> dict[str, Callable[[], Target]]:
    return {
        "eager": lambda: Target("eager", _torch_compile("eager"), repro=_repro_torch('"eager"')),
        "inductor": lambda: Target("inductor", _torch_compile("inductor"), repro=_repro_torch('"inductor"')),
        "inductor-dynamic": lambda: Target("inductor-dynamic", _torch_compile("inductor", force_dynamic=True),
                                           repro=_repro_torch('"inductor"', force_dynamic=True)),
        "inductor-freezing": lambda: Target(
            "inductor-freezing", _torch_compile("inductor"), context=_freezing,
            repro=_repro_torch('"inductor"', setup=["import torch._inductor.config",
                                                     "torch._inductor.config.freezing = True"])),
        "rewrite": lambda: _rewrite_target("rewrite"),
        "rewrite-reduce-overhead": lambda: _rewrite_target("rewrite-reduce-overhead", mode="reduce-overhead",
                                                           static_kernels=True),
        "rewrite-dynamic": lambda: _rewrite_target("rewrite-dynamic", force_dynamic=True),
        "rewrite-gears": lambda: _rewrite_target("rewrite-gears", gears=True),
    }


TARGETS = tuple(_named())
# What `make check-backends` runs: Inductor three ways, rewrite three ways (the list).
CAMPAIGN_TARGETS = ("inductor", "inductor-dynamic", "inductor-freezing", "rewrite", "rewrite-reduce-overhead",
                    "rewrite-gears")


def _importable_name(fn) -> tuple[str, str] | None:
    """``(module, qualname)`` when ``fn`` can be imported by that name (a script can then use it)."""
    module, qualname = getattr(fn, "__module__", None), getattr(fn, "__qualname__", None)
    if not module or not qualname or "<" in qualname or module == "__main__":
        return None
    try:
        obj = importlib.import_module(module)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    return (module, qualname) if obj is fn else None


def target_for(backend) -> Target:
    """A `Target` for ``backend``: a `Target`, a name in `TARGETS`, or anything ``torch.compile`` takes."""
    if isinstance(backend, Target):
        return backend
    named = _named()
    if isinstance(backend, str):
        if backend in named:
            return named[backend]()
        if backend == "rewrite-default":
            return named["rewrite"]()
        return Target(backend, _torch_compile(backend), repro=_repro_torch(repr(backend)))
    if not callable(backend):
        raise ValueError(f"backend={backend!r}: name one of {list(TARGETS)}, a torch.compile backend name, or pass "
                         "a backend callable")
    name = getattr(backend, "__qualname__", None) or type(backend).__name__
    path = _importable_name(backend)
    if path is not None:
        module, qualname = path
        setup, expr = [f"from {module} import {qualname.split('.')[0]}"], qualname
    else:
        setup = ["backend = ...  # the backend under test (a callable that could not be imported by name)"]
        expr = "backend"
    return Target(name, _torch_compile(backend), repro=_repro_torch(expr, setup=setup))
