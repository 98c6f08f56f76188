"""The per-machine figures file: the cost model's measured rates and kernel times, read as hostile input.

Everything the cost model measures on this machine goes into one JSON file in the per-user cache
folder (`rewrite.persist.folders`: ``$REWRITE_CACHE_DIR``, else ``$XDG_CACHE_HOME/rewrite``, else
``~/.cache/rewrite``), named by its key, so only the first compiles on a machine pay for measuring::

    {"format": 4,
     "key": {"format": 4, "machine": ..., "cpu": ..., "cores": ..., "torch": ..., "threads": ...},
     "saved_at": "2025-01-31 12:00:00",
     "calibration": {"dispatch_s": ..., "view_s": ..., "families": {family: {"overhead_s": ..., "rate": ...}},
                     "dtype_speed": {dtype: ...}, "threads": ..., "parallel": ...}   (or null: not measured yet),
     "kernel_times": {signature: seconds, ...}}

The rates (`rewrite.cost.calibration`) and the kernel times (`rewrite.cost.kernel_times`) are
measured at different moments (the rates at a process's first cost question, a kernel when a graph
first has its shapes), so each saves its part with `update`: the file is read, that part replaced
(kernel times merged), and the whole written again atomically (a temporary file of mode 0600
renamed over the name: a symlink or FIFO planted there is replaced, never followed or opened).

The key holds what changes the figures (CPU model, core count, torch version, intra-op threads, this
file's format): a file with another key is stale. The file is read as hostile input (`read`): a
regular file (no symlink, no FIFO: nothing planted there can block a compile) of this user's, mode
0600, at most `MAX_FILE_BYTES`, JSON with exactly the fields above, every number finite and within
the physical bounds below. Anything else, a file an older rewrite wrote included, is a miss: the
figures are measured again and the file replaced, never an error for the compile.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import platform
import threading
import time

import torch

from ..persist.atomic import atomic_write_text
from ..persist.folders import user_cache_dir
from ..persist.reading import read_regular
from .rates import DTYPES, FAMILIES, Calibration, Rate

__all__ = ["FORMAT", "MAX_FILE_BYTES", "MAX_KERNEL_TIMES", "SECONDS", "RATE", "SPEED", "FiguresError", "Figures",
           "cache_key", "cache_path", "read", "update"]

FORMAT = 4                 # 3: oneDNN's linear timed on a dense weight (it runs on a packed one since 4);
                           # 2: the rates alone (cost-model-*.json); 1: kernel times alone (kernel-times-*.json)
MAX_FILE_BYTES = 2 << 20   # the rates take about 1 KiB; the rest is room for MAX_KERNEL_TIMES entries
MAX_KERNEL_TIMES = 8192    # kernel times kept (past it, the file's are dropped before this process's)
MAX_SIGNATURE = 1000       # characters of one kernel's signature
SECONDS = (1e-9, 10.0)     # a plausible overhead or kernel time
RATE = (1e3, 1e16)         # a plausible flops/s or bytes/s
SPEED = (1e-3, 1e3)        # a plausible dtype speed relative to float32
_FIELDS = ("format", "key", "saved_at", "calibration", "kernel_times")


class FiguresError(ValueError):
    """A figures file is damaged or stale; the message names the file and the field."""


@dataclasses.dataclass(frozen=True)
class Figures:
    calibration: Calibration | None  # None: not measured yet on this machine
    kernel_times: dict               # signature -> seconds


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()[:200]
    except OSError:
        pass
    return platform.processor()[:200] or "unknown"


def cache_key() -> dict:
    """What the figures depend on; a file with another key is stale."""
    return {"format": FORMAT, "machine": platform.machine(), "cpu": _cpu_model(), "cores": os.cpu_count() or 0,
            "torch": torch.__version__, "threads": torch.get_num_threads()}


def cache_path(folder: str | None = None) -> str:
    """The figures file for this machine, torch version and thread count."""
    digest = hashlib.sha256(json.dumps(cache_key(), sort_keys=True).encode()).hexdigest()[:16]
    return os.path.join(folder or user_cache_dir(), f"cost-model-{digest}.json")


# -- reading: every field checked --------------------------------------------------------------------

def read(path: str) -> Figures:
    """The figures in ``path``; raises FiguresError naming the file and field when it is damaged
    (unreadable, oversized, not a regular file, malformed), stale (another key) or of another format."""
    try:
        # Never blocks (a FIFO is refused, not opened for a writer that never comes), never follows a
        # symlink, reads at most MAX_FILE_BYTES, and only this user's own file (`update` writes 0600).
        raw = read_regular(path, max_size=MAX_FILE_BYTES, private=True)
    except FileNotFoundError as e:
        raise FiguresError(f"{path}: cannot open ({e.strerror})") from None
    except OSError as e:  # refused (`FileRefused`): a symlink, a special file, too large, another user's
        raise FiguresError(f"{path}: {e}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise FiguresError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise FiguresError(f"{path}: format {found!r} is not {FORMAT} (another rewrite's file: measured again)")
    doc = _object(path, "(top level)", doc, _FIELDS)
    if doc["key"] != cache_key():
        key = doc["key"] if isinstance(doc["key"], dict) else {}
        changed = sorted(k for k, v in cache_key().items() if key.get(k) != v) or ["key"]
        raise FiguresError(f"{path}: stale, measured for another {', '.join(changed)}")
    if not isinstance(doc["saved_at"], str) or len(doc["saved_at"]) > 64:
        raise FiguresError(f"{path}: field saved_at must be a short string")
    cal = None if doc["calibration"] is None else _calibration(path, doc["calibration"], doc["key"]["threads"])
    return Figures(cal, _kernel_times(path, doc["kernel_times"]))


def _number(path: str, field: str, value, bounds) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not bounds[0] <= value <= bounds[1]:
        raise FiguresError(f"{path}: field {field} = {value!r} is not a number in [{bounds[0]}, {bounds[1]}]")
    return float(value)


def _object(path: str, field: str, value, keys) -> dict:
    if not isinstance(value, dict) or set(value) != set(keys):
        got = sorted(value) if isinstance(value, dict) else type(value).__name__
        raise FiguresError(f"{path}: field {field} must hold exactly {sorted(keys)}, got {got}")
    return value


def _calibration(path: str, body, threads: int) -> Calibration:
    body = _object(path, "calibration", body, ("dispatch_s", "view_s", "families", "dtype_speed", "threads",
                                               "parallel"))
    families = {}
    for name, rate in _object(path, "calibration.families", body["families"], FAMILIES).items():
        rate = _object(path, f"calibration.families.{name}", rate, ("overhead_s", "rate"))
        families[name] = Rate(_number(path, f"families.{name}.overhead_s", rate["overhead_s"], SECONDS),
                              _number(path, f"families.{name}.rate", rate["rate"], RATE))
    speeds = body["dtype_speed"]
    if not isinstance(speeds, dict) or not set(speeds) <= set(DTYPES) or "float32" not in speeds:
        raise FiguresError(f"{path}: field calibration.dtype_speed must map some of {list(DTYPES)} "
                           "(float32 included) to numbers")
    speed = {d: _number(path, f"dtype_speed.{d}", s, SPEED) for d, s in speeds.items()}
    if not isinstance(body["threads"], int) or isinstance(body["threads"], bool) or body["threads"] != threads:
        raise FiguresError(f"{path}: field calibration.threads = {body['threads']!r} does not match the key")
    parallel = _number(path, "parallel", body["parallel"], (1.0, max(1.0, float(threads))))
    return Calibration(_number(path, "dispatch_s", body["dispatch_s"], SECONDS),
                       _number(path, "view_s", body["view_s"], SECONDS), families, speed, threads, parallel, path)


def _kernel_times(path: str, times) -> dict[str, float]:
    if not isinstance(times, dict) or len(times) > MAX_KERNEL_TIMES:
        raise FiguresError(f"{path}: field kernel_times must be an object of at most {MAX_KERNEL_TIMES} entries")
    for k, v in times.items():
        if len(k) > MAX_SIGNATURE:
            raise FiguresError(f"{path}: field kernel_times holds a signature of {len(k)} characters "
                               f"(at most {MAX_SIGNATURE})")
        _number(path, f"kernel_times[{k[:80]!r}]", v, SECONDS)
    return {k: float(v) for k, v in times.items()}


# -- writing: one part at a time, the whole file atomically --------------------------------------------

_lock = threading.Lock()  # one update at a time in a process: neither part's writer loses the other's


def update(path: str, *, calibration: Calibration | None = None, kernel_times: dict | None = None) -> None:
    """Replace the calibration and/or merge ``kernel_times`` into the file at ``path``, keeping the other
    part as the file has it (a damaged or stale file keeps nothing). Given kernel times win over the
    file's, and past `MAX_KERNEL_TIMES` (or `MAX_FILE_BYTES`) the file's are dropped first. A missing
    folder is made with mode 0700 (the per-user cache is this user's only). Raises OSError when the
    file cannot be written.

    Processes updating one file at once may each miss what the other added: the last one's file
    stands, and what it missed is measured again by a later process."""
    with _lock:
        try:
            stored = read(path) if os.path.lexists(path) else Figures(None, {})
        except FiguresError:  # the reader of the figures has said so already: replaced
            stored = Figures(None, {})
        cal = calibration if calibration is not None else stored.calibration
        new = kernel_times or {}
        times = {k: v for k, v in stored.kernel_times.items() if k not in new} | new  # the file's first
        if len(times) > MAX_KERNEL_TIMES:
            times = dict(list(times.items())[-MAX_KERNEL_TIMES:])
        doc = {"format": FORMAT, "key": cache_key(), "saved_at": time.strftime("%Y-%m-%d %H:%M:%S"),
               "calibration": None if cal is None else cal.as_json(), "kernel_times": times}
        text = json.dumps(doc, indent=1, sort_keys=True)
        while len(text.encode()) > MAX_FILE_BYTES and doc["kernel_times"]:  # long signatures: fewer of them
            kept = list(doc["kernel_times"].items())
            doc["kernel_times"] = dict(kept[len(kept) // 4 + 1:])
            text = json.dumps(doc, indent=1, sort_keys=True)
        os.makedirs(os.path.dirname(path) or ".", mode=0o700, exist_ok=True)
        atomic_write_text(path, text)
