"""rewrite's own files: the ground floor that export/, cache/ and kernels/ stand on.

Everything rewrite writes and later reads back, and how (every file read may be hostile: docs/design.md,
"Safety"):

* format.py: graphs as versioned JSON (docs/export_format.md); expr.py: the grammar of shape
  expressions; weights.py: weight files (safetensors, each with its sha256); allowlist.py: the ops
  a file may name; checks.py: one validator per field kind; document.py: the header and recorded
  shapes every graph file is checked for; errors.py: `ExportError`, the one error of all of these;
* reading.py: the one safe way to open a file (bounded, regular, no symlink, never blocks);
* atomic.py: the one way to publish a file, or a set of files, whole;
* signing.py: this user's HMAC key (static-kernel artifacts, cache entries);
* folders.py: the per-user cache folder, and the rule every folder of ours must pass (private, no symlinks).

It imports none of export/, cache/, kernels/, exec/ or the backend; it stands on ir, ops, shape and
waits (wait ordering, which the format checks). The
package itself imports nothing, so a light module (folders, atomic) costs only itself.
"""
