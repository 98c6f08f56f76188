"""The one error type of export and load."""
from __future__ import annotations

__all__ = ["ExportError"]


class ExportError(RuntimeError):
    """Exporting or loading failed; the message names the file, node or input and what is allowed."""
