"""Calls that skip the guards a declared function does not need (opt-in): Dynamo checks only the inputs.

On every call of a compiled function Dynamo evaluates its guards: about 770 of them for a 2-layer
Llama (the hooks dict of every submodule, every attribute the forward read, every parameter's
metadata), about 100 us of a 300 us call on this machine (benchmarks/RESULTS.md, "Calls without the
model's guards"). A served model does not change its code, its submodules or its weights between
calls; what changes is its inputs. TorchAir's ``cache_compile`` and vLLM's compile wrapper drop the
guards for that reason. Here the user opts in per function through Dynamo's own door::

    compiled = torch.compile(model, backend="rewrite", dynamic=False,
                             options={"guard_filter_fn": rewrite.inference.input_guards})

(transformers: ``CompileConfig(backend=rewrite.get_backend(config), mode=None, options={"guard_filter_fn": ...})``:
torch.compile takes a mode or options, not both, so a mode goes into rewrite's config). `input_guards`
keeps, and Dynamo still checks on every call in its C++ guard tree (about 1 us):

* every tensor reached from the call's arguments (not through a module): dtype, device, rank, the
  sizes that are static, strides, ``requires_grad``; the gears of a geared dim are checked by the
  gear dispatch (`rewrite.gears.GearError`), a declared range by its shape guard;
* the call's other arguments (Python numbers, strings, None, the keys of a ``**kwargs`` dict, the type
  and tensors of an object such as a KV cache);
* the global state a graph was traced under (grad mode, autocast, deterministic algorithms, the
  default device, torch function modes).

It drops the guards on the model itself (its submodules, attributes, parameters and buffers) and on
globals: they are taken to stay what they were at the first call, the promise a frozen model makes.
A call that fails a kept check gets what it would get without the filter: Dynamo traces the function
again for those inputs, a correct graph, and every later call picks its graph by the kept checks (about
1 us per graph). rewrite counts each such retrace (`rewrite.stats(compiled).recompiles`, with Dynamo's
reason naming the failed check), and ``config.strict = True`` makes it a `rewrite.SlowPathError` on the
call. (Refusing every retrace was tried and dropped: ``generate`` calls ``forward`` at two static shapes,
the prompt's prefill and the one-token step, so a decode function legitimately has two graphs.)
"""
from __future__ import annotations

import torch

__all__ = ["input_guards", "STATE_GUARDS"]

# Guard types on the global state a graph was traced under: cheap, and kept.
STATE_GUARDS = frozenset({
    "GLOBAL_STATE", "GRAD_MODE", "DETERMINISTIC_ALGORITHMS", "TORCH_FUNCTION_STATE", "DEFAULT_DEVICE",
    "AUTOGRAD_SAVED_TENSORS_HOOKS", "SHAPE_ENV", "TORCH_FUNCTION_MODE_STACK",
})


def _in_model(entry) -> bool:
    """Whether a guard's source lies inside an nn.Module (its attributes, submodules, parameters, buffers)."""
    if isinstance(entry.value, torch.nn.Parameter):
        return True
    source = getattr(entry.orig_guard, "source", None)
    inside = getattr(source, "is_unspecialized_nn_module", None)
    if inside is not None:
        return bool(inside())
    name = entry.name  # a torch without the method: Dynamo's source names spell module attributes so
    return any(part in name for part in ("._modules[", "._parameters[", "._buffers[", "L['self']"))


def input_guards(entries) -> list[bool]:
    """A ``guard_filter_fn`` for ``torch.compile(options=...)``: keep the guards on the call's inputs and on
    the global state, drop those on the model and on globals (see the module doc)."""
    return [e.guard_type in STATE_GUARDS or not (e.is_global or _in_model(e)) for e in entries]
