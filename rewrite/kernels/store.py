"""The build folder of static kernels, in the seed's layout, shared by every process on a machine.

    {build_dir}/aclnn_static_shape_kernel_outputs/
        {timestamp}_{pid}_outputs/            one per process that recorded or built
            {pid}/{Op}_{dtype}_{format}_{shape}_{n}.json          ops that get a static kernel
            {pid}_debug/{Op}_{dtype}_{format}_{shape}_{n}.json    every op
            static_kernel_{datetime}.run      kernels this process built (`artifact`)

Processes on one machine share the folder: a process looks for its kernels in every artifact
there (newest first); what it does not find, it builds while holding ``.build.lock`` (an fcntl
lock, so the others wait rather than build the same kernels), after looking once more under the
lock. Several processes per machine must say so with ``LOCAL_WORLD_SIZE`` (`check_local_world`).
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import sys
import time

from ..persist.atomic import atomic_write_text
from ..persist.folders import user_cache_dir

__all__ = ["KernelStore", "StoreError", "check_local_world", "default_build_dir", "tier_up_build_dir", "OUTPUTS"]

OUTPUTS = "aclnn_static_shape_kernel_outputs"
LOCK = ".build.lock"
LOCK_TIMEOUT_S = 1800
MAX_SCANNED = 256  # artifacts looked at per search, newest first


class StoreError(RuntimeError):
    """The build folder or the process set-up does not allow static kernels; the message says why."""


# The build folder when the config names none (``..._aclnn_static_shape_kernel_build_dir``): both defaults live here.

def default_build_dir() -> str:
    """The seed's default: the folder of the running script (the working folder when there is none)."""
    script = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    return os.path.dirname(os.path.abspath(script)) if script and os.path.exists(script) else os.getcwd()


def tier_up_build_dir() -> str:
    """Where tiered-up graphs keep their static kernels: ``kernels/`` in the per-user cache folder
    (`rewrite.persist.folders`), beside the signing key; made private to this user when missing."""
    return user_cache_dir("kernels", create=True)


def check_local_world() -> int | None:
    """LOCAL_WORLD_SIZE as an int; an error when several processes run and it is not set (the seed's rule)."""
    value = os.environ.get("LOCAL_WORLD_SIZE")
    if value is None:
        if _multi_process():
            raise StoreError(
                "static kernels in a multi-process run need the environment variable LOCAL_WORLD_SIZE (the number "
                "of processes on this machine, the same in each): processes on one machine share the build folder "
                "and coordinate through it; set it, e.g. LOCAL_WORLD_SIZE=8 (torchrun sets it for you)")
        return None
    try:
        n = int(value)
    except ValueError:
        n = 0
    if n < 1:
        raise StoreError(f"LOCAL_WORLD_SIZE={value!r} must be a positive integer (processes on this machine)")
    return n


def _multi_process() -> bool:
    for name in ("WORLD_SIZE", "LOCAL_RANK"):
        value = os.environ.get(name)
        if value is not None and not (name == "WORLD_SIZE" and value.strip() == "1"):
            return True
    try:
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    except Exception:  # noqa: BLE001 - no process group: one process
        return False


class KernelStore:
    """One process's view of a build folder: where it records, where it looks, how it locks."""

    def __init__(self, build_dir: str):
        build_dir = os.path.abspath(build_dir)
        if not os.path.isdir(build_dir):
            raise StoreError(f"static-kernel build dir {build_dir} does not exist (config.experimental_config.aclgraph."
                             "_aclnn_static_shape_kernel_build_dir); create it or name an existing folder")
        if not os.access(build_dir, os.W_OK | os.X_OK):
            raise StoreError(f"static-kernel build dir {build_dir} is not writable by this user; "
                             "the seed requires read and write permission there")
        self.build_dir = build_dir
        self.root = os.path.join(build_dir, OUTPUTS)
        stamp = datetime.datetime.now().strftime("%Y%m%d%H%M%S%f")
        self.session = os.path.join(self.root, f"{stamp}_{os.getpid()}_outputs")
        self._counts: dict[str, int] = {}

    def _folder(self, path: str) -> str:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            raise StoreError(f"cannot create {path} in the static-kernel build dir: {e}") from e
        return path

    def record(self, stem: str, data: dict, debug: bool) -> str:
        """Write one op record as ``{stem}_{n}.json`` into ``{pid}/`` or ``{pid}_debug/``."""
        pid = str(os.getpid())
        folder = self._folder(os.path.join(self.session, f"{pid}_debug" if debug else pid))
        n = self._counts.get((folder, stem), 0)
        self._counts[(folder, stem)] = n + 1
        path = os.path.join(folder, f"{stem}_{n}.json")
        # Not fsynced: records are a log, written for every op of every gear at every start, and
        # thousands of fsyncs cost seconds.
        atomic_write_text(path, json.dumps(data, indent=1, sort_keys=True), durable=False)
        return path

    def artifacts(self) -> list[str]:
        """Artifact paths in the build folder, newest first (names checked; symlinked folders skipped)."""
        from .artifact import NAME

        found = []
        try:
            sessions = [e for e in os.scandir(self.root) if e.is_dir(follow_symlinks=False)
                        and e.name.endswith("_outputs")]
        except FileNotFoundError:
            return []
        for s in sessions:
            try:
                for e in os.scandir(s.path):
                    if NAME.match(e.name) and e.is_file(follow_symlinks=False):
                        found.append((e.stat(follow_symlinks=False).st_mtime_ns, e.path))
            except OSError:
                continue
        return [p for _, p in sorted(found, reverse=True)[:MAX_SCANNED]]

    def output_folder(self) -> str:
        return self._folder(self.session)

    @contextlib.contextmanager
    def lock(self):
        """Hold the build folder's lock (other processes building kernels wait here)."""
        path = os.path.join(self._folder(self.root), LOCK)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        try:
            deadline = time.monotonic() + LOCK_TIMEOUT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise StoreError(f"waited {LOCK_TIMEOUT_S} s for {path}: another process has been "
                                         "building static kernels for too long") from None
                    time.sleep(0.05)
            yield
        finally:
            os.close(fd)  # closing drops the lock
