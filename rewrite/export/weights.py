"""Weights of an exported graph: one safetensors file per weight, each with its sha256.

A frozen parameter becomes a constant node that names its weight (``{"weight": "encoder.w"}``);
the tensor lives in ``encoder_w.safetensors`` beside the graph file. Constants of at most
``INLINE_NUMEL`` elements are written into the graph file instead (the seed's "small constants
stay in the model file"). Files are checked against their recorded size and sha256 before a
single byte is parsed, so a truncated or altered file is reported by name, never half-loaded.
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import re

import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from ..ir import Node
from .errors import ExportError
from .format import decode_inline_tensor, encode_inline_tensor

__all__ = ["INLINE_NUMEL", "WeightWriter", "WeightReader", "file_stem"]

# Constants up to this many elements are written inline into the graph file.
INLINE_NUMEL = 64


def file_stem(weight_name: str) -> str:
    """The file name of a weight: its name with '.' (and anything unsafe in a path) replaced by '_'."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", weight_name)


@dataclasses.dataclass
class WeightFile:
    name: str
    file: str  # path relative to the export folder
    data: bytes
    record: dict


class WeightWriter:
    """Collects the constants of a graph as it is encoded; produces the file bytes, in memory.

    ``names`` maps a constant's ``attrs["weight_name"]`` (the placeholder it replaced) to the
    parameter's name in the model; constants not named there are called ``constant_<node>``.
    """

    def __init__(self, names: dict[str, str], folder: str):
        self.names = names
        self.folder = folder  # relative to the export folder ("" or "rank_0")
        self.files: dict[str, WeightFile] = {}
        self._by_storage: dict[tuple, str] = {}
        self._stems: set[str] = set()
        self.node_weights: dict[str, str] = {}  # constant node name -> weight name

    def encode_constant(self, node: Node) -> dict:
        value = node.value
        if not isinstance(value, torch.Tensor):
            from .format import encode_arg

            return {"value": encode_arg(value, f"constant {node.name}")}
        weight_name = node.attrs.get("weight_name")
        derived = self.names.get(node.attrs.get("derived_from"))  # folded from one parameter
        if weight_name is None and derived is None and value.numel() <= INLINE_NUMEL:
            return {"tensor": encode_inline_tensor(value)}
        name = self.names.get(weight_name) or (f"{derived}.{node.name}" if derived else f"constant_{node.name}")
        name = self._add(name, value)
        self.node_weights[node.name] = name
        return {"weight": name}

    def _add(self, name: str, tensor: torch.Tensor) -> str:
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
               tuple(tensor.stride()), tensor.dtype)
        if key in self._by_storage:  # the same weight read by several constants: one file
            return self._by_storage[key]
        if name in self.files:
            raise ExportError(f"two different tensors are both named weight {name!r}")
        stem = file_stem(name)
        suffix = 1
        while stem in self._stems:  # 'a.b_c' and 'a_b.c' would both be 'a_b_c'
            suffix += 1
            stem = f"{file_stem(name)}_{suffix}"
        self._stems.add(stem)
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            cpu = tensor.detach().to("cpu").contiguous()
            data = safetensors_save({name: cpu}, metadata={"format": "pt"})
        rel = os.path.join(self.folder, f"{stem}.safetensors") if self.folder else f"{stem}.safetensors"
        record = {"file": rel, "dtype": str(cpu.dtype).replace("torch.", ""), "shape": list(cpu.shape),
                  "device": str(tensor.device), "nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        self.files[name] = WeightFile(name, rel, data, record)
        self._by_storage[key] = name
        return name

    def records(self) -> dict:
        return {name: f.record for name, f in self.files.items()}


class WeightReader:
    """Loads weights named in a graph file, checking each file before parsing it."""

    def __init__(self, folder: str, records: dict, device_override: str | None = None):
        self.folder = folder
        self.records = records
        self.device_override = device_override
        self.loaded: dict[str, torch.Tensor] = {}

    def verify_all(self) -> None:
        """Check every weight file up front, so a broken export fails at load, not at the first call."""
        for name in self.records:
            self.get(name)

    def get(self, name: str) -> torch.Tensor:
        if name in self.loaded:
            return self.loaded[name]
        record = self.records.get(name)
        if record is None:
            raise ExportError(f"the graph reads weight {name!r}, which the file's weight table does not list")
        path = os.path.join(self.folder, record["file"])
        if not os.path.isfile(path):
            raise ExportError(f"weight file {path} for weight {name!r} is missing")
        with open(path, "rb") as f:
            data = f.read()
        if len(data) != record["nbytes"]:
            raise ExportError(f"weight file {path} for weight {name!r} has {len(data)} bytes, expected "
                              f"{record['nbytes']} (truncated or replaced)")
        digest = hashlib.sha256(data).hexdigest()
        if digest != record["sha256"]:
            raise ExportError(f"weight file {path} for weight {name!r} fails its checksum: sha256 {digest}, "
                              f"expected {record['sha256']} (the file was altered after export)")
        try:
            tensors = safetensors_load(data)
        except Exception as e:  # safetensors raises its own error types
            raise ExportError(f"weight file {path} is not a valid safetensors file: {e}") from None
        if name not in tensors:
            raise ExportError(f"weight file {path} does not hold tensor {name!r} (holds {sorted(tensors)})")
        tensor = tensors[name]
        if str(tensor.dtype).replace("torch.", "") != record["dtype"] or list(tensor.shape) != record["shape"]:
            raise ExportError(f"weight {name!r} in {path} is {tensor.dtype}{list(tensor.shape)}, the graph file "
                              f"records {record['dtype']}{record['shape']}")
        device = self.device_override or record.get("device", "cpu")
        if device != "cpu":
            tensor = tensor.to(device)
        self.loaded[name] = tensor
        return tensor

    def decode_constant(self, data, node_name: str):
        if not isinstance(data, dict) or len(data) != 1:
            raise ExportError(f"constant {node_name}: malformed value {data!r}")
        (kind, value), = data.items()
        if kind == "weight":
            return self.get(value)
        if kind == "tensor":
            return decode_inline_tensor(value, f"constant {node_name}")
        if kind == "value":
            from .format import decode_arg

            return decode_arg(value, {}, f"constant {node_name}")
        raise ExportError(f"constant {node_name}: unknown value kind {kind!r} (expected weight, tensor or value)")


class InMemoryWeightReader(WeightReader):
    """Reads the weights a `WeightWriter` produced without touching the disk (export's self-check)."""

    def __init__(self, writer: WeightWriter):
        super().__init__("", writer.records())
        self._writer = writer

    def get(self, name: str) -> torch.Tensor:
        if name not in self.loaded:
            weight = self._writer.files.get(name)
            if weight is None:
                raise ExportError(f"the graph reads weight {name!r}, which was not collected")
            self.loaded[name] = safetensors_load(weight.data)[name]
        return self.loaded[name]
