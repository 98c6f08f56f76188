"""`rewrite.explain(fn_or_module, *args, config=None)`: compile, run once, report what happened."""
from __future__ import annotations

import torch

from .backend import RewriteBackend, rewrite_backend
from .config import CompilerConfig, ConfigError
from .ledger import Stats
from .report import CompileReport

__all__ = ["explain", "stats"]


def stats(compiled) -> Stats:
    """The slow-path counts of what ``torch.compile(..., backend=<rewrite's>)`` returned (`rewrite.ledger`):
    ``.pads``, ``.padded_rows``, ``.splits``, ``.dynamic_fallbacks``, ``.recompiles``, ``.uncaptured``,
    ``.tier_up_refused``, ``.tier_up_pending``, ``.aten_fallbacks``, ``.refreezes``, ``.tokens_computed``, and
    ``.gears`` (calls per gear); not slow paths, ``.regroups`` and ``.skipped_tokens`` (``padded_tokens="skip"``). Also takes the backend itself,
    a module compiled in place (``module.compile(backend=...)``, torch's `nn.Module.compile`), and a module that
    holds exactly one compiled module (a model whose submodule was compiled in place or replaced by what
    torch.compile returned). A SentenceTransformer compiled with its ``.compile(backend=...)`` is the first case.
    Cheap: a snapshot of counters, nothing is compiled or run."""
    if isinstance(compiled, RewriteBackend):
        return compiled.ledger.stats()
    holder = _compiled_holder(compiled)
    callback = getattr(_dynamo_context(holder), "callback", None)
    if callback is None:
        inside = ", and nothing in it was compiled" if isinstance(compiled, torch.nn.Module) else ""
        raise TypeError(f"rewrite.stats(): expected what torch.compile(..., backend=rewrite's backend) returned, a "
                        f"module compiled with module.compile(backend=...) or holding one, or the backend; got "
                        f"{type(compiled).__name__}{inside}")
    from torch._dynamo.eval_frame import innermost_backend

    from .compat.entry_point import npugraph_ex as npugraph_ex_entry  # compat/ is below this layer: imported when needed

    inner = innermost_backend(callback)
    backend = getattr(inner, "compiler_fn", inner)
    if isinstance(backend, RewriteBackend):
        return backend.ledger.stats()
    if backend in (rewrite_backend, npugraph_ex_entry) or getattr(backend, "__module__", "").startswith("rewrite."):
        # backend="rewrite" / "npugraph_ex": the backend of this torch.compile call, once it has compiled a graph
        made = getattr(inner, "_rewrite_backend", None)
        return made.ledger.stats() if made is not None else Stats()
    name = getattr(inner, "compiler_name", None) or getattr(backend, "__name__", None) or type(backend).__name__
    raise TypeError(f"rewrite.stats(): this function was compiled with backend {name!r}, not rewrite's")


def explain(fn_or_module, *args, config: CompilerConfig | None = None, fullgraph: bool = False, **kwargs) -> CompileReport:
    """Compile ``fn_or_module`` with `rewrite`, call it on ``args``, return the `CompileReport`.

    The report prints op counts before and after optimization (per gear), the passes and rules
    that fired and the time spent per stage. ``report.result`` holds what the call returned.

    Gears: when the arguments carry `rewrite.inference.set_dim_gears` marks, the compiled function is
    also called once at each of the other gears (the marked dims cut or repeated to the gear's size,
    unmarked), as later calls would be, so the report says how many Dynamo graphs serve all the gears
    and, for each graph after the first, which guard failed and the source line that raised it
    (``report.gear_graphs``, a line ``gears: forward: ...`` in the printout). A gear call that fails is
    noted in ``report.notes``.

    ``fn_or_module`` may be what ``torch.compile(..., backend=...)`` returned: its original function
    or module is compiled again with that backend's config (a `RewriteBackend`, ``backend="rewrite"``
    with its ``mode``/``options``, or ``"npugraph_ex"``), so switched-off rules stay off and the gear
    policy stays the user's. ``config=`` overrides it. A model compiled with another backend
    (Inductor...) needs ``config=``: explaining it with rewrite's defaults would report a compile the
    user never asked for.
    """
    if config is not None and not isinstance(config, CompilerConfig):
        raise TypeError(f"explain(..., config=): expected a rewrite.CompilerConfig, got {type(config).__name__}")
    target, backend = _unwrap_compiled(fn_or_module, config_given=config is not None)
    ctx = _dynamo_context(fn_or_module)
    if config is not None or backend is None:
        backend = RewriteBackend(config)
    compiled = torch.compile(target, backend=backend, fullgraph=fullgraph or bool(getattr(ctx, "fullgraph", False)),
                             dynamic=getattr(ctx, "_dynamic", None))  # as the user compiled it
    result = compiled(*args, **kwargs)
    report = backend.report
    report.result = result
    for label, gear_args, gear_kwargs in _other_gears(args, kwargs, backend.config):
        try:
            compiled(*gear_args, **gear_kwargs)
        except Exception as e:  # noqa: BLE001 - the report says which gear could not run, and why
            report.note(f"gear {label} not run: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
    report.stats = backend.ledger.stats()
    return report


def _other_gears(args: tuple, kwargs: dict, config: CompilerConfig) -> list:
    """(gear label, args, kwargs) for each gear declared on the arguments other than their own sizes:
    the marked tensors with each geared dim cut (or repeated) to the gear's size, without marks."""
    from .gears import get_dim_gears, merge_gears
    from .gears.spec import InputGears

    flat, spec = torch.utils._pytree.tree_flatten((args, kwargs))
    inputs = [InputGears(i, f"input {i}", get_dim_gears(x), tuple(x.shape))
              for i, x in enumerate(flat) if isinstance(x, torch.Tensor) and get_dim_gears(x)]
    if not inputs:
        return []
    own = {(i.index, d): i.shape[d] for i in inputs for d in i.dims}
    out = []
    for gear in merge_gears(inputs, config.inference_config.dynamic_gears_merge_policy):
        if gear == own:
            continue
        leaves = list(flat)
        for (index, dim), size in sorted(gear.items()):
            leaves[index] = _resized(leaves[index], dim, size)
        gear_args, gear_kwargs = torch.utils._pytree.tree_unflatten(leaves, spec)
        values = [gear[k] for k in sorted(gear)]
        out.append((values[0] if len(values) == 1 else tuple(values), gear_args, gear_kwargs))
    return out


def _resized(t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
    """``t`` with dimension ``dim`` of length ``size``: its leading slices, repeated when it is shorter."""
    with torch.no_grad():
        n = t.shape[dim]
        if n == 0:
            out = t.new_zeros(t.shape[:dim] + (size,) + t.shape[dim + 1:])
        else:
            out = torch.cat([t] * -(-size // n), dim).narrow(dim, 0, size).clone()
    return out.requires_grad_() if t.requires_grad and t.is_leaf else out


def _compiled_holder(obj):
    """What holds the Dynamo context of ``obj``: ``obj`` itself when torch.compile returned it; for a module
    compiled in place (`nn.Module.compile` keeps torch.compile's result in ``_compiled_call_impl``) that
    result; for a module that is neither, the one compiled module inside it (a child that torch.compile
    returned, or one compiled in place). Several compiled modules inside: a TypeError naming them, since
    each has its own ledger. Nothing compiled: ``obj`` (the caller says what it expected)."""
    if _dynamo_context(obj) is not None or not isinstance(obj, torch.nn.Module):
        return obj
    if getattr(obj, "_compiled_call_impl", None) is not None:
        return obj._compiled_call_impl
    found, skip = [], set()
    for name, sub in obj.named_modules():
        if name == "" or any(name.startswith(outer + ".") for outer in skip):
            continue  # a compiled module's own submodules are its graph's, not separate compiles
        held = sub._compiled_call_impl if getattr(sub, "_compiled_call_impl", None) is not None else sub
        if _dynamo_context(held) is not None:
            found.append((name, held))
            skip.add(name)
    if len(found) > 1:
        raise TypeError(f"rewrite.stats(): {type(obj).__name__} holds {len(found)} compiled modules, each with its "
                        f"own counts: {', '.join(name for name, _ in found)}; pass one of them")
    return found[0][1] if found else obj


def _dynamo_context(obj):
    """The Dynamo context of what torch.compile returned (it holds the backend), or None."""
    ctx = getattr(obj, "dynamo_ctx", None)  # torch.compile(module): an OptimizedModule
    if ctx is None and hasattr(obj, "_torchdynamo_orig_callable") and getattr(obj, "__closure__", None):
        cells = dict(zip(obj.__code__.co_freevars, obj.__closure__))  # torch.compile(function)
        ctx = cells["self"].cell_contents if "self" in cells else None
    return ctx


def _unwrap_compiled(obj, config_given: bool):
    """(the original function or module, a fresh backend with its config) for what torch.compile
    returned; (obj, None) for anything else. Raises when the backend is not rewrite's and no config
    was given."""
    ctx = _dynamo_context(obj)
    callback = getattr(ctx, "callback", None)
    if callback is None:
        return obj, None
    original = getattr(obj, "_orig_mod", None) or obj._torchdynamo_orig_callable
    from torch._dynamo.eval_frame import innermost_backend

    if config_given:
        return original, None
    inner = innermost_backend(callback)
    fn, options = getattr(inner, "compiler_fn", inner), getattr(inner, "kwargs", {})
    if isinstance(fn, RewriteBackend):  # copy its config and decompositions, not its report
        return original, type(fn)(fn.config, decompositions=fn.decompositions)
    if fn is rewrite_backend:  # backend="rewrite", mode=, options=: the config rewrite_backend builds
        from .backend import torch_compile_config

        return original, RewriteBackend(torch_compile_config(options.get("mode"), options.get("options")))
    from .compat.entry_point import npugraph_ex as npugraph_ex_entry  # compat/ is below this layer: imported when needed

    if fn is npugraph_ex_entry or getattr(fn, "__name__", "") == "npugraph_ex" \
            and getattr(fn, "__module__", "").startswith("rewrite."):
        from .compat.torchair import npugraph_ex_config

        return original, RewriteBackend(npugraph_ex_config(options.get("options")))
    name = getattr(inner, "compiler_name", None) or getattr(fn, "__name__", None) or type(fn).__name__
    raise ConfigError(f"explain(): this model was compiled with backend {name!r}, not rewrite's, so there is no "
                      "rewrite config to explain it with; name one: rewrite.explain(model, *args, "
                      "config=rewrite.CompilerConfig())")
