"""`rewrite.dynamo_export`: trace, optimize, check, then write the export folder.

Order of work, so a failure never leaves a half-written export:
1. check the arguments; 2. trace and optimize (capture.py); 3. build the graph file and the
weight bytes in memory (assembly.py); 4. load that program back from memory and run it on the
example inputs, comparing with what the compiled model returned; 5. optionally produce the ONNX
file in a scratch folder; 6. for multi-rank exports, agree with the other ranks; 7. write the
files as one unit (files.py: staged, then moved into place with the graph file last, rolled back
on any error, so a full disk or a folder in the way leaves an existing export intact), then the
rank manifest.

Layout (single rank)::

    export_path/{export_name}.json     the graph (docs/export_format.md)
    export_path/dynamo.pbtxt           readable dump
    export_path/<weight>.safetensors   one file per weight
    export_path/{export_name}.onnx(+.data)   with config.export.onnx

Multi-rank (torch.distributed initialized, world size > 1)::

    export_path/{export_name}{rank}.json
    export_path/rank_{rank}/dynamo.pbtxt, rank_{rank}/<weight>.safetensors
    export_path/{export_name}_manifest.json   ranks, process groups, collectives
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import time

import torch

from .. import ops
from ..config import CompilerConfig
from ..persist.atomic import write_files
from ..persist.checks import FILE_NAME
from ..persist.errors import ExportError
from ..persist.weights import InMemoryWeightReader
from .loader import MANIFEST_FORMAT, ExportedModel
from .assembly import build_program
from .ranks import Ranks

log = logging.getLogger("rewrite")

__all__ = ["dynamo_export"]

def _check_arguments(model, export_path, export_name, dynamic, config) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(export_path, (str, os.PathLike)):
        raise TypeError(f"export_path must be a path (str or os.PathLike), got {type(export_path).__name__}")
    if os.path.exists(export_path) and not os.path.isdir(export_path):
        raise ExportError(f"export_path {export_path} exists and is not a folder")
    if not isinstance(export_name, str) or not FILE_NAME.fullmatch(export_name):
        raise ExportError(f"export_name {export_name!r} must be a plain file name: letters, digits, '_', '.', '-'")
    if not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be True or False, got {dynamic!r}")
    if not isinstance(config, CompilerConfig):
        raise TypeError(f"config must be a rewrite.CompilerConfig, got {type(config).__name__}")


def _check_gears_need_dynamic(args: tuple, kwargs: dict, dynamic: bool) -> None:
    """Gears describe the sizes of a dynamic graph; a static export would silently ignore them."""
    from ..gears import get_dim_gears

    if dynamic:
        return
    flat, _ = torch.utils._pytree.tree_flatten((args, kwargs))
    for i, leaf in enumerate(flat):
        if isinstance(leaf, torch.Tensor) and get_dim_gears(leaf):
            raise ExportError(f"input #{i} has gears {get_dim_gears(leaf)} (set_dim_gears) but dynamic=False; "
                              "pass dynamic=True to export a geared graph, or export without gears")


def _distributed() -> tuple[int | None, int | None]:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        return dist.get_rank(), dist.get_world_size()
    return None, None


def _tolerance(dtype: torch.dtype) -> tuple[float, float]:
    if dtype in ops.FLOATS and dtype.itemsize == 2:  # float16, bfloat16
        return 1e-2, 1e-2
    return 1e-5, 1e-5


def _comparable(t: torch.Tensor) -> torch.Tensor:
    """``t`` in a dtype CPU kernels compute with: one-byte floats (the float8 types) have no CPU
    arithmetic (``allclose`` raises), and float32 holds each of their values exactly."""
    return t.to(torch.float32) if t.is_floating_point() and t.element_size() == 1 else t


def _leaves(x) -> list:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in _leaves(v)]
    if isinstance(x, dict):
        return [t for v in x.values() for t in _leaves(v)]
    return []


def _self_check(program, args, kwargs, expected, config) -> None:
    """Run the program as `load` would (from the in-memory bytes) and compare with the compiled model."""
    if any(n.kind == "call" and ops.draws_random_numbers(n.target, n.args, n.kwargs)
           for n in program.graph.nodes):
        log.info("export: graph has random ops; skipping the numeric self-check")
        return
    # The symbolic graph is enough to check the file round-trips; compiling every gear again is not.
    loaded = ExportedModel(json.loads(json.dumps(program.data)), InMemoryWeightReader(program.weights), config,
                           use_gears=False)
    with torch.no_grad():
        got = loaded(*args, **kwargs)
    want_leaves, got_leaves = _leaves(expected), _leaves(got)
    if len(want_leaves) != len(got_leaves):
        raise ExportError(f"self-check: the exported program returns {len(got_leaves)} tensors, the model "
                          f"{len(want_leaves)}")
    for i, (w, g) in enumerate(zip(want_leaves, got_leaves)):
        if w.shape != g.shape or w.dtype != g.dtype:
            raise ExportError(f"self-check: output {i} is {g.dtype}{list(g.shape)}, expected {w.dtype}{list(w.shape)}")
        rtol, atol = _tolerance(w.dtype)
        w, g = _comparable(w), _comparable(g)
        if w.is_floating_point() and not torch.allclose(w, g, rtol=rtol, atol=atol, equal_nan=True):
            raise ExportError(f"self-check: output {i} differs from the compiled model by "
                              f"{(w - g).abs().max().item():.3g}")
        if not w.is_floating_point() and not torch.equal(w, g):
            raise ExportError(f"self-check: output {i} differs from the compiled model")


def dynamo_export(*args, model: torch.nn.Module, export_path: str = "export_file", export_name: str = "export",
                  dynamic: bool = False, config: CompilerConfig | None = None, **kwargs) -> str:
    """Export ``model`` traced on the example inputs ``*args, **kwargs``; returns the graph file's path.

    The files run with `rewrite.load` in a process that has neither Dynamo's cache nor the model's
    code. Data-dependent control flow cannot be exported (Dynamo must capture one whole graph).
    """
    config = CompilerConfig() if config is None else config
    _check_arguments(model, export_path, export_name, dynamic, config)
    _check_gears_need_dynamic(args, kwargs, dynamic)
    export_path = os.fspath(export_path)
    rank, world_size = _distributed()
    folder = "" if rank is None else f"rank_{rank}"
    file_name = f"{export_name}.json" if rank is None else f"{export_name}{rank}.json"
    t0 = time.perf_counter()

    log.info("export: tracing %s (dynamic=%s)", type(model).__name__, dynamic)
    ranks = Ranks(rank is not None, config.export.rank_timeout_s)
    with ranks.bounded(), ranks.together("export: trace, optimize and check"):
        from .capture import capture  # imports Dynamo: only when exporting
        cap = capture(model, args, kwargs, dynamic, config)
        t_trace = time.perf_counter()
        program = build_program(cap, model, args, kwargs, name=export_name, dynamic=dynamic, config=config,
                                folder=folder, rank=rank, world_size=world_size)
        if config.export.onnx and program.data["collectives"]:
            raise ExportError("config.export.onnx cannot export a graph with collectives "
                              f"({[c['op'] for c in program.data['collectives']]}); ONNX has no collective ops")
        _self_check(program, args, kwargs, cap.result, config)
        program.data["dump"] = os.path.join(folder, "dynamo.pbtxt") if folder else "dynamo.pbtxt"
        onnx_files = {}
        if config.export.onnx:
            from .onnx import export_onnx

            onnx_files = export_onnx(program, export_name)
            program.data["onnx"] = f"{export_name}.onnx"
        graph_text = graph_file_text(program.data)

    manifest = None
    if rank is not None:
        with ranks.bounded():
            manifest = _agree_across_ranks(program, export_name, file_name, graph_text, rank, world_size, ranks)

    # -- everything is known; write (weights, dump, onnx, graph file) as one unit, then the manifest --
    files = [(weight.file, weight.data) for weight in program.weights.files.values()]
    files.append((program.data["dump"], program.pbtxt.encode("utf-8")))
    files += list(onnx_files.items())
    files.append((file_name, graph_text.encode("utf-8")))
    n_weights = len(program.weights.files)
    log.info("export: writing %d files (%d weights) to %s", len(files), n_weights, export_path)
    # every rank's files exist before the manifest says so
    with ranks.bounded(), ranks.together("export: write the files"):
        write_files(export_path, files)
    graph_path = os.path.join(export_path, file_name)
    if manifest is not None:
        with ranks.bounded(), ranks.together("export: write the manifest"):
            if rank == 0:
                write_files(export_path, [(f"{export_name}_manifest.json",
                                           (json.dumps(manifest, indent=1) + "\n").encode())])
    log.info("export: %s written in %.2f s (trace+optimize %.2f s, %d ops, %d weight files)", graph_path,
             time.perf_counter() - t0, t_trace - t0, program.graph.num_ops(), n_weights)
    return graph_path


def graph_file_text(data: dict) -> str:
    """The graph file as text: one top-level field per line and one node per line, so it diffs well."""
    def compact(v):
        return json.dumps(v, separators=(", ", ": "), allow_nan=False)

    lines = []
    for key, value in data.items():
        if key == "graph":
            head = {k: v for k, v in value.items() if k != "nodes"}
            nodes = ",\n".join("    " + compact(n) for n in value["nodes"])
            body = compact(head)[:-1] + ', "nodes": [\n' + nodes + "\n  ]}"
            lines.append(f"  {json.dumps(key)}: {body}")
        else:
            lines.append(f"  {json.dumps(key)}: {compact(value)}")
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _agree_across_ranks(program, export_name, file_name, graph_text, rank, world_size, ranks: "Ranks") -> dict:
    """Check that all ranks traced the same collectives; returns the manifest (written by rank 0)."""
    import torch.distributed as dist

    mine = {
        "rank": rank,
        "graph": file_name,
        "dir": f"rank_{rank}",
        "graph_sha256": hashlib.sha256(graph_text.encode("utf-8")).hexdigest(),
        "collectives": [{k: c.get(k) for k in ("op", "group", "reduce_op", "dtype", "shape")}
                        for c in program.data["collectives"]],
        "process_groups": program.data["process_groups"],
    }
    everyone = ranks.exchange(mine, stage="export: compare the ranks' collectives")
    first = everyone[0]
    for other in everyone[1:]:
        if other["collectives"] != first["collectives"]:
            raise ExportError(f"rank {other['rank']} traced collectives {other['collectives']} but rank 0 traced "
                              f"{first['collectives']}; every rank must run the same collectives in the same order")
    return {
        "format": MANIFEST_FORMAT,
        "version": program.data["version"],
        "name": export_name,
        "world_size": world_size,
        "backend": dist.get_backend(),
        "ranks": [{k: e[k] for k in ("rank", "graph", "dir", "graph_sha256")} for e in everyone],
        "process_groups": first["process_groups"],
        "collectives": first["collectives"],
    }
