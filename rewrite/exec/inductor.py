"""Kernel backend that hands a static graph to Inductor (``config.exec.kernels = "inductor"``)."""
from __future__ import annotations

import torch

from ..fx_bridge import to_fx
from ..ir import Graph, TensorMeta

__all__ = ["compile_with_inductor"]


def _example(meta):
    if isinstance(meta, TensorMeta):
        return torch.empty([int(s) for s in meta.shape], dtype=meta.dtype, device=meta.device)
    raise TypeError(f"inductor kernels need tensor inputs with static shapes, got {meta}")


def compile_with_inductor(graph: Graph):
    from torch._inductor.compile_fx import compile_fx_inner

    gm = to_fx(graph)
    examples = [_example(p.meta) for p in graph.placeholders]
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch._guards import TracingContext, tracing

    fake_mode = FakeTensorMode()
    with tracing(TracingContext(fake_mode)):
        fake = [fake_mode.from_tensor(t) for t in examples]
        from torch.fx.passes.fake_tensor_prop import FakeTensorProp

        FakeTensorProp(gm, fake_mode).propagate(*fake)
        compiled = compile_fx_inner(gm, fake)
    return lambda *args: compiled(list(args))
