"""Op signatures: what a static kernel is built for, as plain JSON-able data.

A signature names the op (one spelling, `rewrite.ops.target_name`), every argument in schema order
(a tensor as an index into ``inputs``, scalars and lists as values), and the layout (dtype, sizes,
strides) of every tensor read and written. Two nodes with equal signatures run the same kernel,
in any graph, gear or process: the kernel's key is a hash of the signature together with what
else decides the binary (torch version, device, code generator version).

Signatures come from two places: from a node and its observed run (`of_node`), and from files
someone else wrote (records, artifacts), which `check` validates field by field before anything
is built from them.
"""
from __future__ import annotations

import hashlib
import json
import math
import re

import torch

from ..ir import Node
from ..ops import bind_arguments, dtype_str, target_name

__all__ = ["FUSED", "of_node", "check", "kernel_key", "record_name", "tensor_operands", "SignatureError", "DTYPES",
           "MAX_RANK"]

# The dtypes a signature may name (by rewrite.ops.dtype_str), and bounds on what a file may claim.
DTYPES = {dtype_str(d): d for d in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
                                     torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool)}
MAX_RANK = 8
MAX_DIM = 2**40
MAX_ARGS = 64
MAX_LIST = 1024
MEMORY_FORMATS = ("contiguous_format", "channels_last", "channels_last_3d", "preserve_format")
# The op name of a fused signature: steps of one shape run in one loop (`rewrite.kernels.fusion`).
FUSED = "rewrite.fused.pointwise"
MAX_STEPS = 32
_OP_NAME = re.compile(r"^[a-z_][a-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z_][A-Za-z0-9_]*$")


class SignatureError(ValueError):
    """A signature (from a node or a file) is not one a static kernel can be built from."""


def _layout(t_layout) -> dict:
    return {"dtype": dtype_str(t_layout.dtype), "size": list(t_layout.size), "stride": list(t_layout.stride)}


def _scalar(v):
    """A JSON value for a scalar argument; non-finite floats spelt as strings (strict JSON has none)."""
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else {"float": repr(v)}
    if isinstance(v, torch.dtype):
        return {"dtype": dtype_str(v)}
    if isinstance(v, torch.memory_format):  # a copy's layout: the kernel writes the result's recorded strides
        return {"memory_format": str(v).replace("torch.", "")}
    if isinstance(v, (list, tuple)) and all(isinstance(x, (bool, int, float)) for x in v):
        return [_scalar(x) for x in v]
    raise SignatureError(f"argument value {v!r} ({type(v).__name__}) has no signature spelling")


def of_node(node: Node, facts: dict) -> dict:
    """The signature of ``node``; ``facts(node)`` gives a node's observed tensor facts (observe.TensorFact)."""
    if not isinstance(node.target, torch._ops.OpOverload):
        raise SignatureError(f"%{node.name}: {node.op} is not an ATen op")
    inputs: list = []
    args: list = []

    def operand(m: Node):
        got = facts(m)
        if len(got) != 1 or got[0] is None:
            raise SignatureError(f"%{node.name}: argument %{m.name} is not one tensor")
        inputs.append(_layout(got[0].layout))
        return {"tensor": len(inputs) - 1}

    for name, value in bind_arguments(node.target, node.args, node.kwargs).items():
        if isinstance(value, Node):
            args.append([name, operand(value)])
        elif isinstance(value, (list, tuple)) and any(isinstance(v, Node) for v in value):
            if not all(isinstance(v, Node) for v in value):
                raise SignatureError(f"%{node.name}: argument {name} mixes tensors and values")
            args.append([name, {"tensors": [operand(v)["tensor"] for v in value]}])
        else:
            args.append([name, _scalar(value)])
    outs = facts(node)
    if not outs or any(f is None for f in outs):
        raise SignatureError(f"%{node.name}: results are not all tensors")
    sig = {"op": target_name(node.target), "args": args, "inputs": inputs, "outputs": [_layout(f.layout) for f in outs]}
    return check(sig)


def tensor_operands(node: Node) -> list:
    """The nodes a kernel for ``node`` reads, in the order of its signature's ``inputs``."""
    out = []
    for value in bind_arguments(node.target, node.args, node.kwargs).values():
        if isinstance(value, Node):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out.extend(v for v in value if isinstance(v, Node))
    return out


def kernel_key(sig: dict, context: dict) -> str:
    """The key of the kernel built for ``sig`` in ``context`` (torch version, device, generator version)."""
    text = json.dumps({"signature": sig, "context": context}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def record_name(sig: dict) -> str:
    """The seed's file stem ``{Op}_{dtype}_{format}_{shape}`` (the caller appends ``_{n}.json``)."""
    op = sig["op"].split(".", 1)[1].replace(".default", "").replace(".", "_")
    first = sig["inputs"][0] if sig["inputs"] else sig["outputs"][0]
    dtype = {"float32": "float", "float64": "double", "float16": "float16"}.get(first["dtype"], first["dtype"])
    shape = "_".join(str(s) for s in first["size"]) or "scalar"
    return f"{op}_{dtype}_ND_{shape}"


# -- validation of signatures read from files --------------------------------------------------------

def _fail(where: str, why: str):
    raise SignatureError(f"signature {where}: {why}")


def _check_layout(d, where: str) -> dict:
    if not isinstance(d, dict) or set(d) != {"dtype", "size", "stride"}:
        _fail(where, "a layout has exactly the fields dtype, size, stride")
    if d["dtype"] not in DTYPES:
        _fail(where, f"dtype {d['dtype']!r} is not one of {sorted(DTYPES)}")
    for field in ("size", "stride"):
        v = d[field]
        if not isinstance(v, list) or len(v) > MAX_RANK or not all(type(x) is int and 0 <= x <= MAX_DIM for x in v):
            _fail(where, f"{field} must be a list of at most {MAX_RANK} ints in [0, {MAX_DIM}]")
    if len(d["size"]) != len(d["stride"]):
        _fail(where, "size and stride differ in rank")
    return d


def _check_value(v, where: str, depth: int = 0):
    if v is None or type(v) in (bool, int, str):
        if isinstance(v, str) and (len(v) > 64 or not re.fullmatch(r"[A-Za-z0-9_]*", v)):
            _fail(where, "a string argument is a short identifier")
        if type(v) is int and abs(v) > 2**63:
            _fail(where, "an int argument is out of the int64 range")
        return
    if type(v) is float:
        if not math.isfinite(v):
            _fail(where, "a non-finite float is spelt {'float': 'inf'}")
        return
    if isinstance(v, dict):
        if set(v) == {"float"} and v["float"] in ("inf", "-inf", "nan"):
            return
        if set(v) == {"dtype"} and v["dtype"] in DTYPES:
            return
        if set(v) == {"memory_format"} and v["memory_format"] in MEMORY_FORMATS:
            return
        if set(v) == {"tensor"} or set(v) == {"tensors"}:
            return
        _fail(where, f"unknown argument form {sorted(v)}")
    if isinstance(v, list) and depth == 0 and len(v) <= MAX_LIST:
        for x in v:
            _check_value(x, where, 1)
        return
    _fail(where, f"argument of type {type(v).__name__} is not allowed")


def check(sig) -> dict:
    """``sig`` if it is a well-formed signature; otherwise SignatureError naming the field."""
    if not isinstance(sig, dict) or set(sig) != {"op", "args", "inputs", "outputs"}:
        _fail("", "must be an object with exactly op, args, inputs, outputs")
    op = sig["op"]
    if not isinstance(op, str) or not _OP_NAME.match(op):
        _fail("op", f"{op!r} is not an op name like 'aten.add.Tensor'")
    for field in ("inputs", "outputs"):
        if not isinstance(sig[field], list) or len(sig[field]) > MAX_ARGS:
            _fail(field, f"must be a list of at most {MAX_ARGS} layouts")
        for k, d in enumerate(sig[field]):
            _check_layout(d, f"{op} {field}[{k}]")
    if not isinstance(sig["args"], list) or len(sig["args"]) > MAX_ARGS:
        _fail("args", f"must be a list of at most {MAX_ARGS} [name, value] pairs")
    if op == FUSED:
        return _check_steps(sig)
    n_inputs = len(sig["inputs"])
    for k, pair in enumerate(sig["args"]):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)
                and re.fullmatch(r"[a-z_][a-z0-9_]{0,40}", pair[0])):
            _fail(f"{op} args[{k}]", "must be [name, value]")
        value = pair[1]
        _check_value(value, f"{op} args[{k}]")
        refs = [value["tensor"]] if isinstance(value, dict) and "tensor" in value else \
            value["tensors"] if isinstance(value, dict) and "tensors" in value else []
        if not isinstance(refs, list) or not all(type(r) is int and 0 <= r < n_inputs for r in refs):
            _fail(f"{op} args[{k}]", f"tensor references must be ints below {n_inputs}")
    return sig


def _check_steps(sig) -> dict:
    """A fused signature: args ``[["steps", [step, ...]]]``, each step ``{"signature": ..., "sources": ...}``
    with a signature of one op (checked as any other) and, per input of it, ``["input", k]`` (input k of
    the fused signature) or ``["step", j]`` (the result of an earlier step); one output."""
    if len(sig["outputs"]) != 1:
        _fail(FUSED, "has exactly one output")
    args = sig["args"]
    if not (len(args) == 1 and isinstance(args[0], list) and len(args[0]) == 2 and args[0][0] == "steps"
            and isinstance(args[0][1], list) and 1 <= len(args[0][1]) <= MAX_STEPS):
        _fail(FUSED, f"args must be [['steps', [1 to {MAX_STEPS} steps]]]")
    for j, step in enumerate(args[0][1]):
        where = f"{FUSED} steps[{j}]"
        if not (isinstance(step, dict) and set(step) == {"signature", "sources"}):
            _fail(where, "must have exactly signature, sources")
        inner = step["signature"]
        if isinstance(inner, dict) and inner.get("op") == FUSED:  # checked before recursing: no nesting
            _fail(where, "a step is one op, not a fused signature")
        check(inner)
        sources = step["sources"]
        if not (isinstance(sources, list) and len(sources) == len(inner["inputs"])):
            _fail(where, "sources must name one source per input of the step")
        for source in sources:
            ok = (isinstance(source, list) and len(source) == 2 and type(source[1]) is int
                  and ((source[0] == "input" and 0 <= source[1] < len(sig["inputs"]))
                       or (source[0] == "step" and 0 <= source[1] < j)))
            if not ok:
                _fail(where, "a source is ['input', k] below the fused inputs' count or ['step', j] of an earlier step")
    return sig


def value_of(v):
    """A checked argument value back as Python (non-finite floats and dtypes restored)."""
    if isinstance(v, dict) and "float" in v:
        return float(v["float"])
    if isinstance(v, dict) and "dtype" in v:
        return DTYPES[v["dtype"]]
    if isinstance(v, list):
        return [value_of(x) for x in v]
    return v
