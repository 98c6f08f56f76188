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

from ..persist.checks import at, describe, expect_int, expect_list, expect_name, expect_object, fail
from ..persist.errors import ExportError

__all__ = ["describe_inputs", "describe_outputs", "InputBinder", "build_result", "check_input_spec",
           "check_output_spec", "walk_leaves", "leaf_name"]

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


def describe_outputs(result, graph_outputs, input_leaves: list, symbolic=()) -> dict:
    """Match the model's result to the graph outputs: tensors by identity (what Dynamo's bytecode
    returned), numbers to the graph's size outputs (``symbolic``: the positions whose value is a size
    expression) of equal value, in order; any other number is a constant of the model."""
    by_id = {id(t): k for k, t in enumerate(graph_outputs) if isinstance(t, torch.Tensor)}
    input_ids = {id(t): i for i, t in enumerate(input_leaves) if isinstance(t, torch.Tensor)}
    sizes = [k for k in symbolic if not isinstance(graph_outputs[k], torch.Tensor)]

    def walk(value, where):
        if isinstance(value, torch.Tensor):
            if id(value) in by_id:
                return {"output": by_id[id(value)]}
            if id(value) in input_ids:
                return {"leaf": input_ids[id(value)]}
            raise ExportError(f"result {where} is a tensor the graph did not produce (a view or copy made "
                              "outside the compiled graph); return the graph's own tensors")
        size = next((k for k in sizes if type(graph_outputs[k]) is type(value) and graph_outputs[k] == value), None)
        if size is not None:  # a size the graph computes: it follows the inputs' shapes
            sizes.remove(size)
            return {"output": size}
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
        container = _container(struct)
        if container is not None:
            kind, items = container
            ok = isinstance(value, kind) and (set(value) == set(items) if kind is dict else len(value) == len(items))
            if not ok:
                wanted = f"a dict with keys {sorted(items)}" if kind is dict else f"a {kind.__name__} of {len(items)}"
                raise ExportError(f"input {where}: expected {wanted}, got {_describe(value)}")
            for key, s in items.items():
                self._walk(s, value[key], _child(where, key), leaves)
        elif "const" in struct:
            if value != struct["const"]:
                raise ExportError(f"input {where}: the model was exported with {struct['const']!r}, got "
                                  f"{_describe(value)}")
        else:
            kind = struct["type"]
            ok = isinstance(value, torch.Tensor) if kind == "tensor" else (
                type(value).__name__ == kind and not isinstance(value, torch.Tensor))
            if not ok:
                raise ExportError(f"input {where}: expected a {kind}, got {_describe(value)}")
            leaves.append(value)


def _container(struct, where: str = "structure"):
    """``(list | tuple | dict, {key: child})`` for a container structure (checked to be one), None for a leaf."""
    if isinstance(struct, list):
        return list, dict(enumerate(struct))
    expect_object(struct, where)
    if "tuple" in struct:
        expect_object(struct, where, required=("tuple",))
        return tuple, dict(enumerate(expect_list(struct["tuple"], at(where, "tuple"))))
    if "dict" in struct:
        expect_object(struct, where, required=("dict",))
        return dict, expect_object(struct["dict"], at(where, "dict"))
    return None


def _child(where: str, key) -> str:
    return f"{where}[{key!r}]" if isinstance(key, str) else f"{where}[{key}]"


def _describe(value) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor {str(value.dtype).replace('torch.', '')}{list(value.shape)}"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)}"
    if isinstance(value, dict):
        return f"a dict with keys {sorted(value)}"
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # a numpy array: its kind, not its every element
        return f"{type(value).__module__.split('.')[0]}.{type(value).__name__} {value.dtype}{list(value.shape)}" \
               " (convert it with torch.from_numpy)"
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 80 else text[:77] + '...'}"


def scalar_value(struct_leaf: dict):
    return _decode_scalar(struct_leaf.get("value"))


# -- reading structures from a file ------------------------------------------------------------------

_LEAF_TYPES = ("tensor", "int", "float", "bool")


def _check_scalar(value, kind: str, where: str) -> None:
    if kind == "float" and isinstance(value, dict):
        expect_object(value, where, required=("float",))
        if value["float"] not in ("inf", "-inf", "nan"):
            raise fail(at(where, "float"), f"expected 'inf', '-inf' or 'nan', got {describe(value['float'])}")
        return
    ok = isinstance(value, bool) if kind == "bool" else (
        not isinstance(value, bool) and isinstance(value, (int, float) if kind == "float" else int))
    if not ok:
        raise fail(where, f"expected the traced {kind} value, got {describe(value)}")


def check_input_spec(spec, where: str) -> list[str]:
    """Check an ``inputs`` record; returns the type of each leaf, in leaf order."""
    expect_object(spec, where, required=("positional", "names", "keyword"), optional=("same_tensor",))
    positional = expect_list(spec["positional"], at(where, "positional"), max_len=10_000)
    names = expect_list(spec["names"], at(where, "names"), length=len(positional))
    for i, name in enumerate(names):
        expect_name(name, at(at(where, "names"), i))
    keyword = expect_object(spec["keyword"], at(where, "keyword"))
    if len(set(names) | set(keyword)) != len(names) + len(keyword):
        raise fail(where, f"argument names {names + list(keyword)} are not unique")
    leaves: list[str] = []

    def walk(struct, inner):
        container = _container(struct, inner)
        if container is not None:
            for key, child in container[1].items():
                walk(child, at(inner, key))
        elif "const" in struct:
            expect_object(struct, inner, required=("const",))
            if struct["const"] is not None and not isinstance(struct["const"], str):
                raise fail(at(inner, "const"), f"expected null or a string, got {describe(struct['const'])}")
        else:
            expect_object(struct, inner, required=("leaf", "type"), optional=("value",))
            expect_int(struct["leaf"], at(inner, "leaf"), len(leaves), len(leaves))
            kind = struct["type"]
            if kind not in _LEAF_TYPES:
                raise fail(at(inner, "type"), f"expected one of {list(_LEAF_TYPES)}, got {describe(kind)}")
            if kind != "tensor":
                _check_scalar(struct.get("value"), kind, at(inner, "value"))
            leaves.append(kind)

    for i, struct in enumerate(positional):
        walk(struct, at(at(where, "positional"), i))
    for name, struct in keyword.items():
        walk(struct, at(at(where, "keyword"), expect_name(name, at(where, "keyword"))))
    for i, pair in enumerate(expect_list(spec.get("same_tensor", []), at(where, "same_tensor"))):
        inner = at(at(where, "same_tensor"), i)
        a, b = expect_list(pair, inner, length=2)
        expect_int(a, inner, 0, len(leaves) - 1)
        expect_int(b, inner, a + 1, len(leaves) - 1)
        if leaves[a] != "tensor" or leaves[b] != "tensor":
            raise fail(inner, f"leaves {a} and {b} must both be tensors")
    return leaves


def check_output_spec(struct, where: str, num_outputs: int, num_leaves: int) -> None:
    """Check an ``outputs`` record against the graph's output count and the inputs' leaf count."""
    container = _container(struct, where)
    if container is not None:
        for key, child in container[1].items():
            check_output_spec(child, at(where, key), num_outputs, num_leaves)
    elif "output" in struct:
        expect_object(struct, where, required=("output",))
        expect_int(struct["output"], at(where, "output"), 0, num_outputs - 1)
    elif "leaf" in struct:
        expect_object(struct, where, required=("leaf",))
        expect_int(struct["leaf"], at(where, "leaf"), 0, num_leaves - 1)
    else:
        expect_object(struct, where, required=("const",))
        value = struct["const"]
        if isinstance(value, dict):
            _check_scalar(value, "float", at(where, "const"))
        elif value is not None and not isinstance(value, (str, bool, int, float)):
            raise fail(at(where, "const"), f"expected null, a string or a number, got {describe(value)}")


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


def walk_leaves(spec: dict):
    """Every leaf of an input spec with its argument path: yields (path, leaf struct)."""
    def walk(struct, where):
        if isinstance(struct, list):
            for i, s in enumerate(struct):
                yield from walk(s, f"{where}[{i}]")
        elif "tuple" in struct:
            for i, s in enumerate(struct["tuple"]):
                yield from walk(s, f"{where}[{i}]")
        elif "dict" in struct:
            for k, s in struct["dict"].items():
                yield from walk(s, f"{where}[{k!r}]")
        elif "leaf" in struct:
            yield where, struct

    for name, struct in zip(spec["names"], spec["positional"]):
        yield from walk(struct, name)
    for name, struct in spec["keyword"].items():
        yield from walk(struct, name)


def leaf_name(program: dict, leaf: int) -> str:
    """The argument path of leaf ``leaf`` (``x``, ``inputs['ids']``) for error messages."""
    return next((where for where, struct in walk_leaves(program["inputs"]) if struct["leaf"] == leaf), f"#{leaf}")
