"""Export a model to files that run without Dynamo or the model's code, and load them back.

    rewrite.dynamo_export(x, y, model=m, export_path="export_file", export_name="export")
    runner = rewrite.load("export_file")     # in any process: no torch.compile, no model class
    out = runner(x, y)

The optimized graph is written as versioned JSON (docs/export_format.md) with its weights in
safetensors files beside it (each with a sha256 in the graph file), a readable ``dynamo.pbtxt``
dump, optionally an ONNX file, and for multi-rank models one graph per rank plus a manifest.
Nothing is ever pickled.
"""
from .errors import ExportError
from .exporter import dynamo_export
from .format import FORMAT_VERSION
from .loader import ExportedModel, load

__all__ = ["dynamo_export", "load", "ExportedModel", "ExportError", "FORMAT_VERSION"]
