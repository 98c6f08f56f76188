"""How an exported graph is called: the model's arguments in, the model's result out.

Dynamo hands the backend a flat list of graph inputs (user tensors, weights, sizes) and the model
returns a nested structure (a tensor, a tuple, a dict, a HuggingFace ``ModelOutput``). The export
records both sides as plain JSON "structures" so `rewrite.load` can accept the same call and give
back the same shape of result without the model's code:

* a tensor (or a Python scalar) the caller passes is a *leaf* ``{"leaf": i, "type": ...}``; scalars
  also record their traced value, which Dynamo may have specialized on;
* containers are ``[...]`` (list), ``{"tuple": [...]}`` and ``{"dict": {...}}``; ``ModelOutput`` and
  other dict subclasses come back as plain dicts;
* an output is ``{"output": k}`` (the graph's k-th result), ``{"leaf": i}`` (an input returned as
  is) or ``{"const": value}``.
"""
from __future__ import annotations

import inspect
import math

import torch

from .errors import ExportError

__all__ = ["describe_inputs", "describe_outputs", "InputBinder", "build_result"]

_SCALARS = (bool, int, float)


def _scalar_record(v):
    if isinstance(v, float) and not math.isfinite(v):
        return {"float": repr(v)}
    return v


def _structure(value, leaves: list, where: str):
    """The JSON structure of one argument; appends its tensors and scalars to ``leaves``."""
    if isinstance(value, torch.Tensor):
        leaves.append(value)
        return {"leaf": len(leaves) - 1, "type": "tensor"}
    if value is None or isinstance(value, str):
        return {"const": value}
    if isinstance(value, _SCALARS):
        leaves.append(value)
        return {"leaf": len(leaves) - 1, "type": type(value).__name__, "value": _scalar_record(value)}
    if isinstance(value, list):
        return [_structure(v, leaves, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {"tuple": [_structure(v, leaves, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise ExportError(f"input {where}: dict keys must be strings to be exported, got {list(value)}")
        return {"dict": {k: _structure(v, leaves, f"{where}[{k!r}]") for k, v in value.items()}}
    raise ExportError(f"input {where} has type {type(value).__name__}; exported models take tensors, Python "
                      "scalars, strings, None and lists/tuples/dicts of those")


def describe_inputs(model: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[dict, list]:
    """The input structure of ``model(*args, **kwargs)`` and its leaves in order."""
    leaves: list = []
    names = []
    try:
        params = list(inspect.signature(model.forward).parameters.values())
        names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:len(args)]
    except (TypeError, ValueError):  # builtins and C extensions have no signature
        pass
    names += [f"arg{i}" for i in range(len(names), len(args))]
    positional = [_structure(a, leaves, names[i]) for i, a in enumerate(args)]
    keyword = {k: _structure(v, leaves, k) for k, v in kwargs.items()}
    # Dynamo passes one tensor given twice as one graph input; calls must alias the same way.
    first_seen: dict[int, int] = {}
    same = []
    for i, t in enumerate(leaves):
        if isinstance(t, torch.Tensor):
            if id(t) in first_seen:
                same.append([first_seen[id(t)], i])
            else:
                first_seen[id(t)] = i
    return {"positional": positional, "names": names, "keyword": keyword, "same_tensor": same}, leaves


def describe_outputs(result, graph_outputs, input_leaves: list) -> dict:
    """Match the model's result to the graph outputs by identity (what Dynamo's bytecode returned)."""
    by_id = {id(t): k for k, t in enumerate(graph_outputs) if isinstance(t, torch.Tensor)}
    input_ids = {id(t): i for i, t in enumerate(input_leaves) if isinstance(t, torch.Tensor)}

    def walk(value, where):
        if isinstance(value, torch.Tensor):
            if id(value) in by_id:
                return {"output": by_id[id(value)]}
            if id(value) in input_ids:
                return {"leaf": input_ids[id(value)]}
            raise ExportError(f"result {where} is a tensor the graph did not produce (a view or copy made "
                              "outside the compiled graph); return the graph's own tensors")
        if value is None or isinstance(value, (str,) + _SCALARS):
            return {"const": _scalar_record(value)}
        if isinstance(value, list):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(value)]
        if isinstance(value, tuple):
            return {"tuple": [walk(v, f"{where}[{i}]") for i, v in enumerate(value)]}
        if isinstance(value, dict):
            return {"dict": {str(k): walk(v, f"{where}[{k!r}]") for k, v in value.items()}}
        raise ExportError(f"result {where} has type {type(value).__name__}; exported models return tensors, "
                          "scalars, None and lists/tuples/dicts of those")

    return walk(result, "result")


def _decode_scalar(v):
    return float(v["float"]) if isinstance(v, dict) else v


class InputBinder:
    """Turns a call's arguments into the flat leaf list, checking them against the recorded structure."""

    def __init__(self, spec: dict):
        self.positional = spec["positional"]
        self.names = spec["names"]
        self.keyword = spec["keyword"]
        self.same_tensor = spec.get("same_tensor", [])

    def bind(self, args: tuple, kwargs: dict) -> list:
        values = list(args)
        kwargs = dict(kwargs)
        if len(values) > len(self.positional):
            raise ExportError(f"the exported model takes {len(self.positional)} positional argument(s) "
                              f"({', '.join(self.names)}), got {len(values)}")
        for i in range(len(values), len(self.positional)):
            name = self.names[i]
            if name not in kwargs:
                raise ExportError(f"missing argument {name!r}; the exported model takes "
                                  f"({', '.join(self.names + list(self.keyword))})")
            values.append(kwargs.pop(name))
        unknown = set(kwargs) - set(self.keyword)
        missing = set(self.keyword) - set(kwargs)
        if unknown or missing:
            raise ExportError(f"keyword arguments {sorted(kwargs)} do not match the exported call, which takes "
                              f"{sorted(self.keyword)}" + (f" (unknown: {sorted(unknown)})" if unknown else "")
                              + (f" (missing: {sorted(missing)})" if missing else ""))
        leaves: list = []
        for i, (struct, value) in enumerate(zip(self.positional, values)):
            self._walk(struct, value, self.names[i], leaves)
        for name, struct in self.keyword.items():
            self._walk(struct, kwargs[name], name, leaves)
        for i, j in self.same_tensor:
            if leaves[i] is not leaves[j]:
                raise ExportError(f"inputs #{i} and #{j} were the same tensor when the model was exported, and the "
                                  "graph reads it once; pass the same tensor for both or export with distinct tensors")
        return leaves

    def _walk(self, struct, value, where, leaves):
        if isinstance(struct, list):
            if not isinstance(value, list) or len(value) != len(struct):
                raise ExportError(f"input {where}: expected a list of {len(struct)}, got {_describe(value)}")
            for i, (s, v) in enumerate(zip(struct, value)):
                self._walk(s, v, f"{where}[{i}]", leaves)
        elif "tuple" in struct:
            items = struct["tuple"]
            if not isinstance(value, tuple) or len(value) != len(items):
                raise ExportError(f"input {where}: expected a tuple of {len(items)}, got {_describe(value)}")
            for i, (s, v) in enumerate(zip(items, value)):
                self._walk(s, v, f"{where}[{i}]", leaves)
        elif "dict" in struct:
            items = struct["dict"]
            if not isinstance(value, dict) or set(value) != set(items):
                raise ExportError(f"input {where}: expected a dict with keys {sorted(items)}, got {_describe(value)}")
            for k, s in items.items():
                self._walk(s, value[k], f"{where}[{k!r}]", leaves)
        elif "const" in struct:
            if value != struct["const"]:
                raise ExportError(f"input {where}: the model was exported with {struct['const']!r}, got {value!r}")
        else:
            kind = struct["type"]
            ok = isinstance(value, torch.Tensor) if kind == "tensor" else (
                type(value).__name__ == kind and not isinstance(value, torch.Tensor))
            if not ok:
                raise ExportError(f"input {where}: expected a {kind}, got {_describe(value)}")
            leaves.append(value)


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor {str(value.dtype).replace('torch.', '')}{list(value.shape)}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(value)}"
    return f"{type(value).__name__} {value!r}"


def scalar_value(struct_leaf: dict):
    return _decode_scalar(struct_leaf.get("value"))


def build_result(struct, outputs, leaves):
    """The model's result from the graph outputs, shaped as recorded."""
    if isinstance(struct, list):
        return [build_result(s, outputs, leaves) for s in struct]
    if "output" in struct:
        return outputs[struct["output"]]
    if "leaf" in struct:
        return leaves[struct["leaf"]]
    if "tuple" in struct:
        return tuple(build_result(s, outputs, leaves) for s in struct["tuple"])
    if "dict" in struct:
        return {k: build_result(s, outputs, leaves) for k, s in struct["dict"].items()}
    return _decode_scalar(struct["const"])
