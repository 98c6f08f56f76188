"""Small helpers shared by several layers."""
from __future__ import annotations

import os
import tempfile
import threading

import torch

__all__ = ["atomic_write_text", "atomic_write_bytes", "THREAD_COUNT_LOCK", "set_this_thread_intra_op_threads"]

# Held by every rewrite code path that changes torch's intra-op thread count (calibration, stream
# workers), around `set_this_thread_intra_op_threads`. torch.set_num_threads in any thread also sets
# the count threads started later begin with; without the lock, one path could read another's
# temporary count as the one to put back, and every thread started afterwards would keep it
# (Dynamo, which guards on the count, then recompiles every function such a thread calls).
THREAD_COUNT_LOCK = threading.Lock()


def _in_fresh_thread(fn, *args):
    out: list = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    t.join()
    return out[0]


def set_this_thread_intra_op_threads(n: int) -> None:
    """Give the calling thread ``n`` intra-op threads; threads started later keep torch's count.

    torch keeps one count per thread, and a process-wide one that a thread takes the first time it
    asks. ``torch.set_num_threads`` sets both, so the process-wide count is read first from a fresh
    thread (which takes exactly that count) and put back from another one. It is never read from a
    thread's own count: that may be another thread's temporary setting, and putting it back would
    make it every new thread's count for good. Caller holds `THREAD_COUNT_LOCK`.
    """
    process_count = _in_fresh_thread(torch.get_num_threads)
    torch.get_num_threads()  # this thread's lazy first-use setup now: later, it would undo ours
    torch.set_num_threads(n)
    _in_fresh_thread(torch.set_num_threads, process_count)


def atomic_write_bytes(path: str, data: bytes, *, durable: bool = True) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the new one, never half of it.

    ``durable=False`` skips the fsync (~1 ms a file): for files that are a log or scratch, written
    by the thousand, where surviving a power cut buys nothing.
    """
    folder = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_text(path: str, text: str, *, durable: bool = True) -> None:
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable)
