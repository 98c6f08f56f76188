"""How many Dynamo graphs serve a geared function's gears, and why each graph after the first was traced.

The backend (`rewrite.backend.RewriteBackend`) is called once per Dynamo graph. For a function that
was compiled with gears, `GearFunctions.compiled` counts its graphs (per Python code object) and, for
the second and later ones, reads the reason Dynamo recorded for tracing again: the guard of an earlier
graph that the call failed, with the source line that raised it (``if x.shape[0] == 1:``). The result
is a `rewrite.report.GearGraphs` in the backend's `CompileReport` (``report.gear_graphs``), which
`rewrite.explain` prints and the backend logs at INFO from the second graph on.

Only the two small functions `dynamo_code` and `recompile_reasons` read Dynamo's state; both degrade
to "unknown" (None, []) rather than fail, so a torch that moved them loses the reason, not the compile.
"""
from __future__ import annotations

import dataclasses
import inspect
import os
import re
import types

import torch

from ..report import CompileReport, GearGraphs, Retrace

__all__ = ["GearFunctions", "Frame", "dynamo_code", "recompile_reasons", "parse_reason", "guard_origin", "gear_values"]

UNKNOWN = "reason unknown"


@dataclasses.dataclass(frozen=True)
class Frame:
    """The user's function Dynamo is compiling, as `GearFunctions` keys and names it."""

    code: types.CodeType  # the frame's code: Dynamo's recompile reasons are recorded per code object
    key: object  # what one compiled function is: the code, with what it wraps when it is a wrapper
    name: str  # ``forward``; ``Sequential.forward``, ``BertModel.forward`` when Dynamo entered through a wrapper
    where: str  # file name and first line
    compile_id: str  # Dynamo's ``frame/attempt``, the prefix of its recompile reasons


def dynamo_code() -> Frame | None:
    """The user's function Dynamo is compiling, or None outside a Dynamo compile.

    Written for torch 2.13: no public API names the frame a backend is called for. Dynamo's
    ``InstructionTranslator.current_tx()`` (a thread-local set while it translates a frame, since torch
    2.1) holds its ``f_code`` and ``f_locals``; the compile id (``frame/attempt``) is
    ``torch._guards.CompileContext.current_compile_id()``. A frame that wraps a module or its method
    (`_wrapped_method`) is named, and told apart from the same wrapper's other frames, by what it wraps.
    """
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        tx = InstructionTranslator.current_tx()
        code = tx.f_code
        compile_id = torch._guards.CompileContext.current_compile_id()
    except Exception:  # noqa: BLE001 - not inside Dynamo, or a torch that moved these: no report, same compile
        return None
    if not isinstance(code, types.CodeType):
        return None
    key, name = code, code.co_name
    where = f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"
    try:
        wrapped = _wrapped_method(code, tx.f_locals)
    except Exception:  # noqa: BLE001 - named after the wrapper's code, then
        wrapped = None
    if wrapped is not None:
        key, name, where = (code, id(wrapped[0])), wrapped[1], _def_site(wrapped[2], where)
    return Frame(code, key, name, where, str(compile_id) if compile_id is not None else "")


def _wrapped_method(code: types.CodeType, f_locals: dict):
    """(the wrapped object, its name, its function) when ``code`` is a wrapper around a module or a
    module's method, else None. Dynamo enters a function through its decorators: ``torch.compile`` of a
    torch.nn container compiles ``torch._dynamo.external_utils.wrap_inline``'s ``inner`` (its free
    variable ``fn`` is the module); transformers' ``forward`` is ``can_return_tuple``'s ``wrapper``
    (``func`` is the method, ``self`` the module). One wrapper code serves every object it wraps."""
    owner = f_locals.get("self")
    for var in code.co_freevars:
        value = f_locals.get(var)
        if isinstance(value, torch.nn.Module):
            return value, f"{type(value).__name__}.forward", type(value).forward
        if isinstance(owner, torch.nn.Module) and inspect.isfunction(value) \
                and getattr(type(owner), value.__name__, None) is not None:
            return value, f"{type(owner).__name__}.{value.__name__}", inspect.unwrap(value)
    return None


def _def_site(fn, default: str) -> str:
    code = getattr(fn, "__code__", None)
    if code is None:
        return default
    return f"{os.path.basename(code.co_filename)}:{code.co_firstlineno}"


def recompile_reasons(code: types.CodeType) -> list[str]:
    """The guard failures Dynamo recorded for ``code`` (oldest first): one line per cached graph whose
    guards a call failed, appended before Dynamo traces the next graph; what ``TORCH_LOGS=recompiles``
    prints, e.g. ``0/0: x.size()[0] != 1  # if x.shape[0] == 1:  # model.py:12 in forward (...)``.

    Written for torch 2.13: ``torch._dynamo.guard_failures`` ({original code: [reason, ...]}, exported
    by ``torch._dynamo`` since torch 2.0 and cleared by ``torch._dynamo.reset()``), filled by
    ``torch._dynamo.guards.get_guard_fail_reason`` from ``get_and_maybe_log_recompilation_reasons``.
    [] when it is missing.
    """
    try:
        failures = torch._dynamo.guard_failures
        found = failures.get(code, ())  # .get: it is a defaultdict, and a lookup must not add the code
        return [str(r) for r in found]
    except Exception:  # noqa: BLE001 - a torch without it: the reason is unknown, nothing fails
        return []


# "0/0: " or "[0/1]: " or "!0/0/1: ": the compile id of the cached graph whose guard failed
_COMPILE_ID = re.compile(r"^\s*\[?(?P<id>[!\w/]*\d+/\d+[\w/]*)\]?:\s*")
# "model.py:12 in forward" (torch shortens the path)
_LOCATION = re.compile(r"(?P<file>[^\s()]+):(?P<line>\d+) in \S+")


def parse_reason(text: str, graph: int) -> Retrace:
    """A `Retrace` from one of Dynamo's recompile reasons (`recompile_reasons`).

    A shape guard reads ``{compile id}: {guard}  # {source line}  # {file}:{line} in {function}
    ({torch's own location})``; other guards (a tensor's dtype or size that Dynamo specialized) are
    the guard's text alone. Only the first line and the first failed guard are read."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    m = _COMPILE_ID.match(first)
    body = first[m.end():] if m else first
    body = body.split("; ")[0]  # several failed guards are joined by "; "
    if not body:
        return Retrace(graph, UNKNOWN)
    parts = [p.strip() for p in body.split("  # ")]
    guard, where, source, in_torch = parts[0], None, None, False
    for part in parts[1:]:
        loc = _LOCATION.match(part)
        if loc and where is None:
            where = f"{os.path.basename(loc['file'])}:{loc['line']}"
        elif where is None and part.startswith("(") and part.endswith(")") and _LOCATION.match(part[1:]):
            # no line of the user's code was recorded, only torch's own: "(_meta_registrations.py:681 in meta_copy_)"
            loc = _LOCATION.match(part[1:])
            where, in_torch = f"{os.path.basename(loc['file'])}:{loc['line']}", True
        elif source is None and not loc:
            source = part
    return Retrace(graph, first, guard or None, where, source, in_torch)


def guard_origin(guard) -> str | None:
    """Where a guard of Dynamo's shape environment was raised, as ``model.py:12 `if x.shape[0] == 1:```
    (the user's line torch recorded in the guard's ``sloc``), or None when it recorded none."""
    user = getattr(getattr(guard, "sloc", None), "maybe_user_loc", None)
    if not isinstance(user, str) or not user.strip():
        return None
    source, _, loc = user.rpartition("  # ")
    m = _LOCATION.match(loc.strip())
    where = f"{os.path.basename(m['file'])}:{m['line']}" if m else loc.strip()
    return f"{where} `{source.strip()}`" if source.strip() else where


def gear_values(spec) -> list:
    """The declared gears of a `GearSpec` for a report: sizes for one geared dim, tuples for several."""
    keys = sorted({k for g in spec.gears for k in g})
    if len(keys) == 1:
        return [g[keys[0]] for g in spec.gears]
    return [tuple(g[k] for k in keys) for g in spec.gears]


@dataclasses.dataclass
class _Function:
    report: GearGraphs
    first_id: str  # compile id of its first geared graph (the reasons name the graph whose guard failed)
    seen: int  # how many of Dynamo's reasons for its code had been read when its last graph was compiled


class GearFunctions:
    """The geared functions one backend compiled: their Dynamo graphs, in ``report.gear_graphs``."""

    def __init__(self, report: CompileReport):
        self.report = report
        self._functions: dict = {}  # code object -> _Function

    def compiled(self, frame: tuple | None, gear_spec) -> GearGraphs | None:
        """Record one Dynamo graph compiled for ``frame`` (`dynamo_code`'s answer, taken during the compile).

        A function counts from its first graph with gears; later graphs of it count whether or not
        their own inputs carry gears (TorchAir marks the first call's only). Returns the function's
        report when this graph is its second or later (the backend logs it), else None. The caller
        holds the backend's lock."""
        if frame is None:
            return None
        fn = self._functions.get(frame.key)
        if fn is None:
            if gear_spec is None:
                return None
            report = GearGraphs(frame.name, frame.where, gear_values(gear_spec))
            self._functions[frame.key] = _Function(report, frame.compile_id, len(recompile_reasons(frame.code)))
            self.report.gear_graphs.append(report)
            return None
        fn.report.graphs += 1
        reasons = recompile_reasons(frame.code)
        new, fn.seen = reasons[fn.seen:], len(reasons)
        fn.report.retraces.append(self._why(new, fn.first_id, fn.report.graphs))
        return fn.report

    @staticmethod
    def _why(reasons: list[str], first_id: str, graph: int) -> Retrace:
        """This graph's reason: the failure of the function's first graph's guards (what the gears were
        traced for), else the latest failure recorded."""
        if not reasons:
            return Retrace(graph, UNKNOWN)
        against_first = [r for r in reasons if (m := _COMPILE_ID.match(r)) and m["id"] == first_id]
        return parse_reason((against_first or reasons)[-1], graph)
