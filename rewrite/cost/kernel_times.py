"""The compute kernels' seconds at the exact shapes of a graph, measured on this machine.

`rewrite.cost.calibration` fits one rate per op family on a few sizes. That is close enough to order
most choices, but the forms the speed rules produce (a merged QKV GEMM and its split, oneDNN's
fused linear, an attention kernel) win or lose against the rules-off form by a few percent at the
graph's own shapes, where a fitted rate can be off by more (issue 28: rules on vs off measured
0.93x where the model predicted 1.16x). So where the shapes are static and the kernel's inputs
are all tensors, the cost model asks this module: the kernel is run on random tensors of those
shapes, on the process's threads, and timed by `rewrite.cost.timing` (the fastest of a few short
batches); extraction then compares the merged and the separate forms by what they take here.

Convolutions are measured for one choice only, their image's layout (`convolution_seconds`, used by
`rewrite.passes.channels_last`): the same call with a contiguous and with a channels-last input.

What is measured: `MEASURED` (GEMMs, fused linears, attention), on the CPU, float dtypes, inputs
of at most `MAX_BYTES`; anything else, symbolic sizes, or a call whose tensors cannot be told
apart from its metas alone (``mm(x, x)``) is left to the family model (`seconds` returns None).
A fused linear is measured without its post-op (which operands alone do not name): the model
charges the post-op's pass over its output (`WITHOUT_POST_OP`); its weight is packed first, as the
generated code binds it.

Each kernel is measured once per machine: the figures are kept in the per-machine figures file
beside the rates (`rewrite.cost.machine`, which reads it as hostile input: a damaged file is logged
and measured again). A process measures for at most `BUDGET_S` seconds in all; after that the model
answers.
"""
from __future__ import annotations

import functools
import logging
import os
import threading
import time

import torch

from .. import ops
from ..ir import TensorMeta
from . import machine
from .sizes import nbytes
from .timing import fastest

log = logging.getLogger("rewrite")

__all__ = ["KernelTimes", "MEASURED", "WITHOUT_POST_OP", "CONVOLUTION_PARAMS", "BUDGET_S", "MAX_BYTES", "signature",
           "convolution_signature"]

BUDGET_S = 10.0             # a process's measuring time in all (the first compiles on a machine pay it)
MAX_BYTES = 256 << 20       # inputs and output of one measured call
_BATCH_S = 0.5e-3           # one timed batch at least this long (short kernels: several calls)
_BATCHES = 5                # of them (at least timing.MIN_BATCHES, however slow the kernel)

aten = torch.ops.aten
_FLASH_CPU = aten._scaled_dot_product_flash_attention_for_cpu.default
_LINEAR_POINTWISE = next((t for t in ops.FUSED_LINEARS if ops.target_name(t).endswith("_linear_pointwise.default")),
                         None)  # oneDNN's fused linear, where this build has it


def _linear_pointwise(x, w, b=None):
    return _LINEAR_POINTWISE(x, w, b, "none", [], "")


def _packed_weight(args: list) -> list:
    """oneDNN's linear is timed as generated code runs it: on its weight packed once (`ops.packed_linear_weight`)."""
    return [args[0], ops.packed_linear_weight(args[1]), *args[2:]]


def _attention(q, k, v, mask=None):
    return aten.scaled_dot_product_attention.default(q, k, v, attn_mask=mask)


# target -> (function of the input tensors, how many tensors it may take): what this module measures
_CALLS = {
    **{t: (t, (2,)) for t in (aten.mm.default, aten.bmm.default, aten.matmul.default)},
    **{t: (t, (3,)) for t in (aten.addmm.default, aten.baddbmm.default)},
    aten.linear.default: (aten.linear.default, (2, 3)),
    **({_LINEAR_POINTWISE: (_linear_pointwise, (2, 3))} if _LINEAR_POINTWISE is not None else {}),
    **{t: (_attention, (3, 4)) for t in (aten.scaled_dot_product_attention.default, _FLASH_CPU)},
}
MEASURED = frozenset(_CALLS)
_PREPARE = {_LINEAR_POINTWISE: _packed_weight} if _LINEAR_POINTWISE is not None else {}  # inputs made once, untimed
# measured without the post-op they fuse: `seconds` is the kernel's alone
WITHOUT_POST_OP = frozenset(t for t in (_LINEAR_POINTWISE,) if t is not None)
# aten.convolution's arguments after its tensors, as `convolution_seconds` takes them
CONVOLUTION_PARAMS = ("stride", "padding", "dilation", "transposed", "output_padding", "groups")


def signature(target, in_metas: list) -> str | None:
    """The file's key of one call (op and input metas), or None when it is not measured here."""
    if target not in MEASURED or not in_metas:
        return None
    parts = _tensor_parts(in_metas)
    return None if parts is None else f"{ops.target_name(target)}({';'.join(parts)})"


def convolution_signature(in_metas: list, params: tuple, channels_last: bool) -> str | None:
    """The file's key of one 2-d convolution (input, weight[, bias]; `CONVOLUTION_PARAMS`) with its input
    in channels-last or contiguous layout, or None when it is not measured here."""
    parts = _tensor_parts(in_metas) if len(in_metas) in (2, 3) else None
    if parts is None or len(params) != len(CONVOLUTION_PARAMS) or not _plain_ints(params) \
            or any(m.rank != 4 for m in in_metas[:2]):
        return None
    return (f"aten.convolution.default({';'.join(parts)};{params!r};"
            f"{'channels_last' if channels_last else 'contiguous'})".replace(" ", ""))


def _plain_ints(value) -> bool:
    if isinstance(value, (list, tuple)):
        return all(_plain_ints(v) for v in value)
    return isinstance(value, int)  # bool is an int too: ``transposed``


def _tensor_parts(in_metas: list) -> list[str] | None:
    parts = []
    for m in in_metas:
        if not isinstance(m, TensorMeta) or not m.is_static() or m.device.type != "cpu" \
                or not (m.dtype.is_floating_point or m.dtype == torch.bool):
            return None
        parts.append(f"{ops.dtype_str(m.dtype)}[{','.join(str(int(s)) for s in m.shape)}]")
    return parts


class KernelTimes:
    """Measured seconds per call signature; one per process (the process's calibration holds it), thread-safe.

    ``path``: the figures file the times are read from and saved to (None: kept in memory only);
    ``times``: the times already read from it (else read now)."""

    def __init__(self, path: str | None, budget_s: float = BUDGET_S, times: dict | None = None):
        self.path = path
        self.budget_s = budget_s
        self.spent_s = 0.0
        self.lock = threading.Lock()
        self.times: dict[str, float] = dict(times) if times is not None else self._read() if path else {}
        self.unsaved = 0

    def seconds(self, target, out_meta, in_metas: list) -> float | None:
        """Measured seconds of ``target`` on tensors of ``in_metas`` (None: not measured here)."""
        key = signature(target, in_metas)
        if key is None:
            return None
        fn, counts = _CALLS[target]
        if len(in_metas) not in counts or nbytes(in_metas) + nbytes(out_meta) > MAX_BYTES:
            return None
        return self._known_or_measured(key, fn, in_metas, _PREPARE.get(target))

    def convolution_seconds(self, in_metas: list, params: tuple, channels_last: bool) -> float | None:
        """Measured seconds of one ``aten.convolution`` of a 2-d image on tensors of ``in_metas`` (input,
        weight[, bias]) with ``params`` (`CONVOLUTION_PARAMS`), the input in channels-last or contiguous
        layout (oneDNN's output follows its input's); None: not measured here. Which layout is faster
        depends on the shape (measured here: a depthwise 3x3 of 48 channels at 16x16 took 123 us
        contiguous, 71 us channels-last; a 3-channel stem conv 23 us against 55 us)."""
        key = convolution_signature(in_metas, params, channels_last)
        if key is None or 2 * nbytes(in_metas) > MAX_BYTES:
            return None

        def call(x, w, b=None):
            return aten.convolution.default(x, w, b, *params)

        prepare = (lambda args: [args[0].contiguous(memory_format=torch.channels_last), *args[1:]]) \
            if channels_last else None
        return self._known_or_measured(key, call, in_metas, prepare)

    def _known_or_measured(self, key: str, fn, in_metas: list, prepare=None) -> float | None:
        t = self.times.get(key)
        if t is not None:
            return t
        with self.lock:
            t = self.times.get(key)
            if t is None and self.spent_s < self.budget_s:
                t = self._measure(key, fn, in_metas, prepare)
        return t

    def _measure(self, key: str, fn, in_metas: list, prepare=None) -> float | None:
        start = time.perf_counter()
        try:
            with torch.no_grad(), torch._subclasses.fake_tensor.unset_fake_temporarily():
                gen = torch.Generator().manual_seed(0)
                args = [torch.rand([int(s) for s in m.shape], generator=gen) < 0.9 if m.dtype == torch.bool
                        else torch.randn([int(s) for s in m.shape], generator=gen, dtype=m.dtype) for m in in_metas]
                if prepare is not None:
                    args = prepare(args)
                best = fastest([functools.partial(fn, *args)], _BATCH_S * _BATCHES, _BATCHES)[0]
        except Exception as e:  # noqa: BLE001 - a kernel that refuses random inputs is priced by the model
            log.debug("kernel times: %s not measured (%s: %s)", key, type(e).__name__, e)
            return None
        finally:
            self.spent_s += time.perf_counter() - start
        best = min(max(best, machine.SECONDS[0]), machine.SECONDS[1])  # what the figures file accepts
        self.times[key] = best
        self.unsaved += 1
        return best

    def save(self) -> None:
        """Merge the new figures into the file (atomically); a failure is logged, the figures stay in memory."""
        with self.lock:
            if not self.path or not self.unsaved:
                return
            try:
                machine.update(self.path, kernel_times=self.times)
                self.unsaved = 0
            except OSError as e:
                log.info("kernel times: cannot write %s (%s); kept for this process", self.path, e)

    def _read(self) -> dict[str, float]:
        if not os.path.lexists(self.path):
            return {}
        try:
            return machine.read(self.path).kernel_times
        except machine.FiguresError as e:
            log.warning("kernel times: ignoring %s; measuring again", e)
            return {}
