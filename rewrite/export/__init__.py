"""Export a model to files that run without Dynamo or the model's code, and load them back.

    rewrite.dynamo_export(x, y, model=m, export_path="export_file", export_name="export")
    runner = rewrite.load("export_file")     # in any process: no torch.compile, no model class
    out = runner(x, y)

The optimized graph is written as versioned JSON (docs/export_format.md) with its weights in
safetensors files beside it (each with a sha256 in the graph file), a readable ``dynamo.pbtxt``
dump, optionally an ONNX file, and for multi-rank models one graph per rank plus a manifest.
Nothing is ever pickled.

The file format itself (graph files, weights, the op allow-list, the field checks, `ExportError`)
lives in `rewrite.persist`, which the compile cache reads and writes too; this package holds the
workflows: capture and export (exporter.py, capture.py, assembly.py, ranks.py, onnx.py), the input
and output signature (io_spec.py) and loading (loader.py).
"""
from ..persist import atomic as files  # noqa: F401 - write_files' old home, still named by callers that patch it
from ..persist.errors import ExportError
from ..persist.format import FORMAT_VERSION
from .exporter import dynamo_export
from .loader import ExportedModel, load

__all__ = ["dynamo_export", "load", "ExportedModel", "ExportError", "FORMAT_VERSION"]
