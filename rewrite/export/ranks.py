"""Points every rank of a multi-rank export or load must reach together, failed or not.

A rank that fails before a collective would leave the others blocked in it until the process
group's timeout (gloo's default is 30 minutes). So, for one export or load (`Ranks`):

* `Ranks.together` runs a block and then has every rank meet in `Ranks.exchange`, whatever
  happened in the block: a rank that failed sends its error instead of its payload, and every
  rank raises (the failed one its own error, the others an `ExportError` naming it);
* a failed rank also writes its error into the process group's store, a side channel that needs
  no matching collective: a rank stuck in a collective of the model itself (run while tracing)
  cannot hear the exchange, but when its collective times out it reads the store and names the
  rank that failed and why;
* `Ranks.bounded` sets the default group's collective timeout to ``config.export.rank_timeout_s``
  while the export or load runs (and puts the old one back), and gloo's monitored barrier finds a
  rank that never arrives, so no rank waits longer than that for one that failed, died or hangs.
  Backends other than gloo keep their own timeouts (NCCL aborts on its own watchdog).
"""
from __future__ import annotations

import contextlib
import datetime
import itertools
import json

import torch

from ..persist.errors import ExportError

__all__ = ["Ranks"]

_meetings = itertools.count()  # every rank creates its Ranks in the same order: the same number


class Ranks:
    """The ranks of one multi-rank export or load (for a single process, every method does nothing)."""

    def __init__(self, active: bool, timeout_s: float):
        self.active, self.timeout_s = active, timeout_s
        self.key = f"rewrite/meeting{next(_meetings)}/failed"

    @contextlib.contextmanager
    def bounded(self):
        """Collectives on the default group time out after ``timeout_s`` while the block runs (gloo)."""
        import torch.distributed as dist

        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")) if self.active else None
        before = getattr(getattr(backend, "options", None), "_timeout", None)
        if before is None or dist.get_backend() != "gloo":
            yield
            return
        backend._set_default_timeout(datetime.timedelta(seconds=self.timeout_s))
        try:
            yield
        finally:
            backend._set_default_timeout(before)

    @contextlib.contextmanager
    def together(self, stage: str):
        """Run a block on every rank; when it fails on one, every rank raises (see `exchange`)."""
        if not self.active:
            yield
            return
        try:
            yield
        except Exception as e:  # noqa: BLE001 - re-raised by exchange, after the other ranks heard of it
            explained = self._explained(e, stage)
            if explained is not e and self._failed_elsewhere():
                raise explained from None  # the rank that failed is known: no meeting left to wait for
            self.exchange(None, stage=stage, error=explained)
        self.exchange(None, stage=stage)

    def exchange(self, payload, *, stage: str, error: BaseException | None = None) -> list:
        """Every rank's ``payload`` (JSON data), in rank order; raises if any rank sent an error."""
        import torch.distributed as dist

        rank = dist.get_rank()
        if error is not None:
            self._store().set(f"{self.key}/{rank}", f"{type(error).__name__}: {error}"[:2000])
        try:
            if dist.get_backend() == "gloo":
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=self.timeout_s), wait_all_ranks=True)
            mine = {"rank": rank, "payload": None if error is not None else payload,
                    "error": None if error is None else f"{type(error).__name__}: {error}"[:2000]}
            everyone = _all_gather_json(mine)
        except RuntimeError as e:
            if error is not None:
                raise error from None
            raise self._explained(e, stage) from None
        if error is not None:
            raise error
        failed = [e for e in everyone if e["error"] is not None]
        if failed:
            who = "; ".join(f"rank {e['rank']}: {e['error']}" for e in failed)
            raise ExportError(f"{stage}: rank(s) {[e['rank'] for e in failed]} failed, so this rank stops too: {who}")
        return [e["payload"] for e in everyone]

    # -- errors --------------------------------------------------------------------------------
    def _store(self):
        import torch.distributed as dist

        return dist.distributed_c10d._get_default_store()

    def _failed_elsewhere(self) -> dict:
        """Other ranks that wrote their error into the store: rank -> error."""
        import torch.distributed as dist

        store, rank = self._store(), dist.get_rank()
        return {r: store.get(f"{self.key}/{r}").decode("utf-8", "replace")
                for r in range(dist.get_world_size()) if r != rank and store.check([f"{self.key}/{r}"])}

    def _explained(self, e: Exception, stage: str) -> Exception:
        """A collective that timed out or lost its peer, as an error naming the rank that failed (if one said so)."""
        import torch.distributed as dist

        text = str(e)
        if isinstance(e, ExportError) and "config.export.rank_timeout_s" in text:
            return e
        if not any(s in text for s in ("Timed out", "timed out", "Connection closed by peer", "monitoredBarrier",
                                       "pair closure")):
            return e
        failed = self._failed_elsewhere()
        why = "; ".join(f"rank {r}: {msg}" for r, msg in failed.items()) or "another rank died or hangs"
        return ExportError(f"{stage}: the ranks did not meet within {self.timeout_s:g} s "
                           f"(config.export.rank_timeout_s): {why} ({type(e).__name__}: {text.splitlines()[0][:200]})")


def _all_gather_json(obj) -> list:
    """Gather one JSON-able object from every rank (as UTF-8 bytes in tensors: no pickle)."""
    import torch.distributed as dist

    data = torch.tensor(list(json.dumps(obj).encode("utf-8")), dtype=torch.uint8)
    sizes = [torch.zeros(1, dtype=torch.int64) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, torch.tensor([data.numel()], dtype=torch.int64))
    longest = max(int(s) for s in sizes)
    padded = torch.zeros(longest, dtype=torch.uint8)
    padded[:data.numel()] = data
    chunks = [torch.zeros(longest, dtype=torch.uint8) for _ in sizes]
    dist.all_gather(chunks, padded)
    return [json.loads(bytes(c[:int(s)].tolist()).decode("utf-8")) for c, s in zip(chunks, sizes)]
