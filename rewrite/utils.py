"""Small helpers shared by several layers (atomic file writes: `rewrite.persist.atomic`)."""
from __future__ import annotations

import threading

import torch

__all__ = ["THREAD_COUNT_LOCK", "set_this_thread_intra_op_threads", "connected_groups"]

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


def connected_groups(items, links) -> list[list]:
    """``items`` grouped so that the two ends of every pair in ``links`` share a group (transitively): union-find.
    Groups come in the order of their first item, their members in the order of ``items``."""
    parent = {x: x for x in items}

    def root(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]  # path halving
            x = parent[x]
        return x

    for a, b in links:
        parent[root(b)] = root(a)
    groups: dict = {}
    for x in parent:
        groups.setdefault(root(x), []).append(x)
    return list(groups.values())
