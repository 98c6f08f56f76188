"""Call an inference graph without AOTAutograd's per-call runtime wrapper.

AOTAutograd puts every compiled graph behind a runtime wrapper that regenerates outputs aliasing
inputs or intermediates, applies input mutations made outside the graph, bumps version counters
autograd watches, wraps tensor subclasses, threads RNG state and effect tokens, and turns grad
mode and autocast off around the call. For an inference graph that needs none of that, the
wrapper and the boxing layers around it are pure per-call cost: on the overhead-bound models of
`benchmarks/reduce_overhead.py` they take a noticeable share of a call (see RESULTS.md).

`direct_call` decides from AOTAutograd's own metadata of the graph (``TracingContext.fw_metadata``,
set before the backend's compiler runs) whether the wrapper would do anything; if not, it returns
the compiled function behind what still matters: grad mode off during the call (an inference
graph may be called with grad on when no input requires grad), the dynamic-dimension marks
AOTAutograd puts on outputs for later Dynamo frames, and Dynamo's ``disable``. Anything unusual
keeps AOTAutograd's wrapper.
"""
from __future__ import annotations

import torch

__all__ = ["direct_call", "why_wrapped"]


def why_wrapped(example_inputs) -> str | None:
    """Why AOTAutograd's runtime wrapper is needed for the graph being compiled (None: it is not)."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None:
        return "no AOTAutograd metadata"
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and type(x) not in (torch.Tensor, torch.nn.Parameter, torch.nn.Buffer) \
                and not isinstance(x, torch._subclasses.FakeTensor):
            return f"input of type {type(x).__name__}"
    checks = {
        "inputs mutated outside the graph": meta.num_mutated_inp_runtime_indices,
        "outputs aliasing inputs or intermediates": meta.num_outputs_aliased,
        "intermediate bases": meta.num_intermediate_bases,
        "version counters to bump": getattr(meta, "mutated_graph_handled_indices_seen_by_autograd", ()),
        "effect tokens": meta.tokens,
        "functionalized RNG": meta.is_rng_op_functionalized or getattr(meta, "num_graphsafe_rng_states", 0),
        "grad mode set by the graph": meta.grad_enabled_mutation is not None,
        "autocast": torch._C._is_any_autocast_enabled(),
    }
    for why, present in checks.items():
        if present:
            return why
    return None


def direct_call(fn, example_inputs):
    """``fn`` (``fn(*inputs) -> outputs``) as Dynamo calls a compiled graph, or None if AOT's wrapper is needed."""
    if why_wrapped(example_inputs) is not None:
        return None
    meta = torch._guards.TracingContext.try_get().fw_metadata
    dynamic = [(i, o.dynamic_dims) for i, o in enumerate(meta.output_info) if o.dynamic_dims]
    if dynamic:
        try:
            from torch._functorch._aot_autograd.runtime_wrappers import mark_dynamo_propagated_dynamic_indices as mark
        except ImportError:  # a torch older than the pinned one (2.11 has no such helper): AOT's wrapper marks them
            return None
    set_grad = torch._C._set_grad_enabled
    is_grad = torch.is_grad_enabled

    def call(*args):
        if is_grad():
            set_grad(False)
            try:
                out = fn(*args)
            finally:
                set_grad(True)
        else:
            out = fn(*args)
        for i, dims in dynamic:
            mark(out[i], dims)
        return out

    call.__rewrite_direct__ = True
    return torch._dynamo.disable(call, reason="rewrite: compiled graph")
