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
import math
import os
import re
from concurrent.futures import ThreadPoolExecutor

import torch
from safetensors.torch import load as safetensors_load
from safetensors.torch import save as safetensors_save

from ..ir import Node
from .checks import (MAX_NODES, at, confined_path, decode_device, decode_dtype, describe, dtype_name, expect_int, expect_object,
                     expect_sha256, expect_shape, expect_str, fail, read_file)
from .errors import ExportError
from .format import decode_inline_tensor, encode_inline_tensor

__all__ = ["INLINE_NUMEL", "WeightWriter", "WeightReader", "file_stem", "collected_weight"]

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
        record = {"file": rel, "dtype": dtype_name(cpu.dtype, f"weight {name!r}"), "shape": list(cpu.shape),
                  "device": str(tensor.device), "nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
        self.files[name] = WeightFile(name, rel, data, record)
        self._by_storage[key] = name
        return name

    def records(self) -> dict:
        return {name: f.record for name, f in self.files.items()}


_WEIGHT_FIELDS = ("file", "dtype", "shape", "device", "nbytes", "sha256")


class WeightReader:
    """Loads the weights a graph file names, checking each record and file before parsing it.

    ``records`` is the graph file's ``weights`` object; ``where`` names it in messages
    (``export.json: weights``). A record's file must lie inside ``folder``; its size must match the
    record before a byte is read, its sha256 before safetensors parses it.
    """

    def __init__(self, folder: str, records, device_override: str | None = None, where: str = "weights"):
        self.folder = folder
        self.where = where
        if len(expect_object(records, where)) > MAX_NODES:
            raise fail(where, f"lists {len(records)} weights; at most {MAX_NODES} are allowed")
        self.records = {name: self._check_record(name, record) for name, record in records.items()}
        self.device_override = device_override
        self.loaded: dict[str, torch.Tensor] = {}

    def _check_record(self, name: str, record) -> dict:
        where = at(self.where, name)
        expect_str(name, where, max_len=1024)
        expect_object(record, where, required=_WEIGHT_FIELDS)
        dtype = decode_dtype(record["dtype"], at(where, "dtype"))
        shape = expect_shape(record["shape"], at(where, "shape"))
        least = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        expect_int(record["nbytes"], at(where, "nbytes"), least, least + (100 << 20))  # the header is small
        expect_sha256(record["sha256"], at(where, "sha256"))
        decode_device(record["device"], at(where, "device"))
        confined_path(self.folder, record["file"], at(where, "file"))
        return record

    def verify_all(self) -> None:
        """Check every weight file up front, so a broken export fails at load, not at the first call.

        Files are read, hashed and parsed on a few threads (file reads, sha256 and safetensors release
        the GIL on large buffers): MiniLM's 88 MB in 0.09-0.11 s instead of 0.15 s on two cores. The
        error raised is the first one in record order, as when reading one by one."""
        names = [name for name in self.records if name not in self.loaded]
        if len(names) < 2:
            for name in names:
                self.get(name)
            return
        with ThreadPoolExecutor(min(4, os.cpu_count() or 1, len(names))) as pool:
            for _ in pool.map(self.get, names):
                pass

    def get(self, name: str) -> torch.Tensor:
        if name in self.loaded:
            return self.loaded[name]
        record = self.records.get(name)
        if record is None:
            raise ExportError(f"the graph reads weight {name!r}, which the file's weight table does not list")
        path = confined_path(self.folder, record["file"], at(at(self.where, name), "file"))
        what = f"weight file {path} for weight {name!r}"
        data = read_file(path, what, size=record["nbytes"])
        digest = hashlib.sha256(data).hexdigest()
        if digest != record["sha256"]:
            raise ExportError(f"{what} fails its checksum: sha256 {digest}, expected {record['sha256']} (the file "
                              "was altered after export)")
        try:
            tensors = safetensors_load(data)
        except Exception as e:  # safetensors raises its own error types
            raise ExportError(f"{what} is not a valid safetensors file: {e}") from None
        if name not in tensors:
            raise ExportError(f"{what} does not hold tensor {name!r} (holds {sorted(tensors)[:10]})")
        tensor = tensors[name]
        if tensor.dtype != decode_dtype(record["dtype"], "") or list(tensor.shape) != record["shape"]:
            raise ExportError(f"weight {name!r} in {path} is {tensor.dtype}{list(tensor.shape)}, the graph file "
                              f"records {record['dtype']}{record['shape']}")
        self.loaded[name] = self.placed(tensor, record)
        return self.loaded[name]

    def placed(self, tensor: torch.Tensor, record: dict) -> torch.Tensor:
        """``tensor`` (read from safetensors, on the CPU) on the device its record names."""
        device = self.device_override or record["device"]
        return tensor if device == "cpu" else tensor.to(device)

    def decode_constant(self, data, where: str):
        """A constant node's value: ``{"weight": name}``, ``{"tensor": inline}`` or ``{"value": argument}``."""
        expect_object(data, where)
        if len(data) != 1 or next(iter(data)) not in ("weight", "tensor", "value"):
            raise fail(where, f"expected one of the keys weight, tensor or value, got {sorted(data)}")
        (kind, value), = data.items()
        if kind == "weight":
            if not isinstance(value, str) or value not in self.records:
                name = repr(value) if isinstance(value, str) else describe(value)
                raise fail(at(where, "weight"), f"names weight {name[:80]}, which the weights table does not list")
            return self.get(value)
        if kind == "tensor":
            return decode_inline_tensor(value, at(where, "tensor"))
        from .format import decode_arg

        return decode_arg(value, {}, at(where, "value"))


class InMemoryWeightReader(WeightReader):
    """Reads the weights a `WeightWriter` produced without touching the disk (export's self-check)."""

    def __init__(self, writer: WeightWriter):
        super().__init__(".", writer.records())
        self._writer = writer

    def get(self, name: str) -> torch.Tensor:
        if name not in self.loaded:
            self.loaded[name] = self.placed(collected_weight(self._writer, name), self.records[name])
        return self.loaded[name]


def collected_weight(writer: WeightWriter, name: str) -> torch.Tensor:
    """Weight ``name`` as ``writer`` serialized it (read back from its bytes, not from the disk)."""
    weight = writer.files.get(name)
    if weight is None:
        raise ExportError(f"the graph reads weight {name!r}, which was not collected")
    return safetensors_load(weight.data)[name]
