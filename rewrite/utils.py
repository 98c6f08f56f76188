"""Small helpers shared by several layers."""
from __future__ import annotations

import os
import tempfile
import threading

__all__ = ["atomic_write_text", "atomic_write_bytes", "THREAD_COUNT_LOCK"]

# Held by every rewrite code path that changes torch's intra-op thread count and puts it back
# (calibration, stream workers). torch.set_num_threads in any thread also sets the count threads
# started later begin with; without the lock, one path could read another's temporary count as
# the one to put back, and every thread started afterwards would keep it (Dynamo, which guards
# on the count, then recompiles every function such a thread calls).
THREAD_COUNT_LOCK = threading.Lock()


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
