"""Fused groups: neighbouring pointwise steps and inference batch norms of one shape in one loop."""
from __future__ import annotations

from .core import C_TYPE, PARALLEL_MIN, Unsupported, arg_values, broadcast_strides, kernel_function, emit_loops, element_count
from .norms import BATCH_NORM, batch_norm_prologue, batch_norm_terms, channel_strides
from .pointwise import POINTWISE_FORMULAS, Loads, pointwise_value


def gen_fused(sig, symbol):
    """Steps of one shape in one loop (`rewrite.kernels.fusion`): pointwise ops and inference batch norms,
    each step's result a register the later steps read, so the values between them never reach memory.

    ``sig``'s ``steps`` argument lists the steps in order, each its own signature and, per input of it,
    its source: ``["input", k]`` (input k of the fused signature) or ``["step", j]`` (an earlier step).
    Every step computes what its own kernel would, converted to its result's type as a store would, so
    the result is bit for bit that of the steps run one by one; only transcendental functions may differ
    in the last bits, as between any two loops: their vector (libmvec) and scalar versions differ, and the
    loop's shape decides which one an element gets."""
    steps = arg_values(sig).get("steps")
    if not steps or len(sig["outputs"]) != 1:
        raise Unsupported
    out = sig["outputs"][0]
    size = out["size"]
    last = steps[-1]["signature"]["outputs"][0]
    if last["dtype"] != out["dtype"] or last["size"] != size:
        raise Unsupported
    prologue, in_loop, channel = [], set(), None  # in_loop: the inputs the loop reads (not only per channel)
    normed = {}  # step index of a batch norm -> (its C type, the index of its input x)
    for j, step in enumerate(steps):
        step_sig = step["signature"]
        if step_sig["outputs"][0]["size"] != size:
            raise Unsupported
        for k, (kind, at) in enumerate(step["sources"]):  # what a step reads is what its source holds
            source = sig["inputs"][at] if kind == "input" else steps[at]["signature"]["outputs"][0]
            if (source["dtype"], source["size"]) != (step_sig["inputs"][k]["dtype"], step_sig["inputs"][k]["size"]) \
                    or (kind == "input" and source["stride"] != step_sig["inputs"][k]["stride"]):
                raise Unsupported
        if step_sig["op"] == BATCH_NORM:
            T, x_at, per_channel, channels = batch_norm_terms(step_sig)
            normed[j] = (T, x_at)
            in_loop.update(at for kind, at in step["sources"][x_at:x_at + 1] if kind == "input")

            def array(k, sources=step["sources"]):
                kind, at = sources[k]
                if kind != "input":  # per-channel terms are read before the loop: never a step's result
                    raise Unsupported
                return f"x{at}"

            prologue += batch_norm_prologue(T, per_channel, channels, arg_values(step_sig)["eps"], str(j), array)
            channel = len(sig["inputs"]) + 1  # index of the per-channel arrays' strides, after the inputs'
        elif step_sig["op"] in POINTWISE_FORMULAS:
            pointwise_value(step_sig, lambda k, ctype: "v")  # unsupported steps fail here, before any loop
            in_loop.update(at for kind, at in step["sources"] if kind == "input")
        else:
            raise Unsupported
    strides = [out["stride"]] + [broadcast_strides(d, size) if k in in_loop else [0] * len(size)
                                 for k, d in enumerate(sig["inputs"])]
    if channel is not None:
        strides.append(channel_strides(len(size)))

    def body(index):
        loads, lines = Loads(index), []
        for j, step in enumerate(steps):
            step_sig, sources = step["signature"], step["sources"]

            def read(k, ctype, sources=sources):
                kind, at = sources[k]
                return loads.read(at, ctype) if kind == "input" else f"(({ctype})t{at})"

            if j in normed:
                T, x_at = normed[j]
                c = index[channel]
                value = f"{read(x_at, T)} * alpha{j}[{c}] + beta{j}[{c}]"
            else:
                T = C_TYPE[step_sig["outputs"][0]["dtype"]]
                value = pointwise_value(step_sig, read)
            lines.append(f"{T} t{j} = {value};")
        return loads.lines + lines + [f"y0[{index[0]}] = t{len(steps) - 1};"]

    body_lines = emit_loops(list(size), strides, body, element_count(size) >= PARALLEL_MIN)
    return kernel_function(symbol, prologue + body_lines, sig)
