"""``config.export.onnx``: the optimized graph as an ONNX model with external weight data.

The exported rewrite graph (weights as constants, the caller's tensors as inputs) goes back to FX
with `rewrite.fx_bridge.to_fx` and through torch's ONNX exporter, so the ONNX file computes what
the graph file computes and runs in onnxruntime without torch. Sizes a dynamic graph takes as
separate integer inputs are read off the tensors inside the wrapper, so the ONNX model has only
tensor inputs; their symbolic dimensions become ONNX dynamic axes.

The exporter writes to a scratch folder; the bytes are returned so exporter.py writes them with
the rest of the export, only once everything succeeded.
"""
from __future__ import annotations

import logging
import os
import re
import tempfile

import sympy
import torch

from ..fx_bridge import to_fx
from ..ir import Graph, TensorMeta
from ..persist.errors import ExportError
from .io_spec import leaf_name

log = logging.getLogger("rewrite")

__all__ = ["export_onnx"]


class _TensorInputsOnly(torch.nn.Module):
    """Calls the graph's FX module with its size inputs computed from the tensor inputs."""

    def __init__(self, graph: Graph, bindings: list):
        super().__init__()
        self.gm = to_fx(graph)
        tensor_positions = [i for i, b in enumerate(bindings) if "leaf" in b]
        self.plan = []  # per graph input: ("tensor", k) or ("size", k, dim)
        for b in bindings:
            if "leaf" in b:
                self.plan.append(("tensor", tensor_positions.index(bindings.index(b))))
                continue
            sym = next(s for s in graph.symbols if str(s) == b["symbol"])
            info = graph.symbols[sym]
            if info.input_index is None or "leaf" not in bindings[info.input_index]:
                raise ExportError(f"ONNX export: size {sym} cannot be read from a tensor input")
            self.plan.append(("size", tensor_positions.index(info.input_index), info.dim))

    def forward(self, *tensors):
        inputs = [tensors[p[1]] if p[0] == "tensor" else tensors[p[1]].size(p[2]) for p in self.plan]
        return self.gm(*inputs)


def export_onnx(program, export_name: str) -> dict[str, bytes]:
    """ONNX bytes for ``program``: {"name.onnx": ..., "name.onnx.data": ...}."""
    graph, bindings = program.graph, program.data["bindings"]
    module = _TensorInputsOnly(graph, bindings).eval()
    examples, dynamic_shapes, names = [], [], []
    for b, p in zip(bindings, graph.placeholders):
        if "leaf" not in b:
            continue
        if not isinstance(p.meta, TensorMeta):
            raise ExportError(f"ONNX export: graph input {p.name} is a scalar argument; ONNX inputs must be tensors")
        shape = [int(s) if sympy.sympify(s).is_Integer else _example_size(graph, s) for s in p.meta.shape]
        examples.append(torch.zeros(shape, dtype=p.meta.dtype) if not p.meta.dtype.is_floating_point
                        else torch.randn(shape).to(p.meta.dtype))
        dims = {d: torch.export.Dim.DYNAMIC for d, s in enumerate(p.meta.shape) if not sympy.sympify(s).is_Integer}
        dynamic_shapes.append(dims or None)
        names.append(re.sub(r"[^A-Za-z0-9_]", "_", leaf_name(program.data, b["leaf"])))
    with tempfile.TemporaryDirectory() as scratch:
        path = os.path.join(scratch, f"{export_name}.onnx")
        try:
            torch.onnx.export(module, tuple(examples), path, input_names=names, dynamo=True, external_data=True,
                              # forward(*tensors): one entry for the varargs, holding one spec per tensor
                              dynamic_shapes=(tuple(dynamic_shapes),) if any(dynamic_shapes) else None,
                              optimize=True, verbose=False)
        except Exception as e:
            raise ExportError(f"ONNX export of graph {graph.name} failed: {e}") from e
        files = {}
        for name in sorted(os.listdir(scratch)):
            with open(os.path.join(scratch, name), "rb") as f:
                files[name] = f.read()
    if f"{export_name}.onnx" not in files:
        raise ExportError(f"the ONNX exporter wrote {sorted(files)}, not {export_name}.onnx")
    log.info("export: ONNX model %s.onnx (%d files)", export_name, len(files))
    return files


def _example_size(graph: Graph, size) -> int:
    """A size for the example tensors of a dynamic graph: within the symbol's range, not 0 or 1."""
    expr = sympy.sympify(size)
    values = {}
    for s in expr.free_symbols:
        info = graph.symbols.get(s)
        low = max(info.lower if info is not None else 2, 2)
        values[s] = low + 1
    return int(expr.subs(values))
