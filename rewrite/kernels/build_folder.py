"""The build folder of static kernels, in the seed's layout, shared by this user's processes on a machine.

    {build_dir}/aclnn_static_shape_kernel_outputs/
        .build.lock                           who builds now (fcntl lock; holder's pid and start time)
        {timestamp}_{pid}_outputs/            one per process that recorded or built
            {pid}/{Op}_{dtype}_{format}_{shape}_{n}.json          ops that get a static kernel
            {pid}_debug/{Op}_{dtype}_{format}_{shape}_{n}.json    every op
            static_kernel_{datetime}.run      kernels this process built (`artifact`)

Processes on one machine share the folder: a process looks for its kernels in every artifact
there (newest first); what it does not find, it builds while holding ``.build.lock`` (an fcntl
lock, so the others wait rather than build the same kernels), after looking once more under the
lock. Several processes per machine must say so with ``LOCAL_WORLD_SIZE`` (`check_local_world`).

Trust (docs: "Threat model: caches and build folders"). Whoever can write into the build folder
can plant records, hold the lock or swap a folder for a symlink, so the folder must be this
user's own and closed to other users' writes (`rewrite.persist.folders.check_private_folder`, the
rule of ssh and pip): the build folder the user named (or the seed's default, the script's
folder) is refused with an error when the backend is made; the per-user tier-up folder is made
with mode 0700 and, when refused, the tier-up plans memory without static kernels (a warning).
Every level below it is made 0700 and never through a symlink (`confined_folder`); artifacts
are signed and checked before use (`artifact`); the lock file is this user's, mode 0600.

The lock never hangs a process: a build waits at most `LOCK_WAIT_S` for another builder, then
reports who holds the lock and for how long and builds without it into this process's own
session folder (its name is unique to the process and artifacts are published by an atomic
rename, so the lock only ever saved duplicate work). A tier-up, which runs on the model's call,
waits at most `TIER_UP_LOCK_WAIT_S` (`LockBusy`: the graph keeps its ATen code and tries again
later), and also builds without the lock once the lock has been seen busy for `LOCK_WAIT_S`.
"""
from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import logging
import os
import re
import stat
import sys
import time

from ..persist.atomic import atomic_write_text
from ..persist.folders import FolderRefused, check_private_folder, confined_folder, private_cache_folder

log = logging.getLogger("rewrite")

__all__ = ["KernelStore", "StoreError", "FolderUntrusted", "LockBusy", "check_local_world", "default_build_dir", "tier_up_build_dir",
           "OUTPUTS", "LOCK_WAIT_S", "TIER_UP_LOCK_WAIT_S"]

OUTPUTS = "aclnn_static_shape_kernel_outputs"
LOCK = ".build.lock"
# The longest a build waits for another process's build, and how long a lock may be seen busy before
# this process builds without it. A build takes 0.1-2 s here (benchmarks/RESULTS.md, "Latency"), a
# large model's several seconds on a loaded machine: 60 s is many times the longest build measured,
# so only a stuck or hostile holder is ever bypassed, and that costs one duplicate build, never a hang.
LOCK_WAIT_S = 60.0
# The longest the tier-up call (the model caller's own call) waits for the lock before it runs its
# ATen code and tries again after another ``exec.tier_up_calls`` calls.
TIER_UP_LOCK_WAIT_S = 0.1
_LOCK_POLL_S = 0.05
_HOLDER = re.compile(rb"^(\d{1,10}) (\d{1,12}\.\d{3})\n$")  # what a holder writes into the lock file
MAX_SCANNED = 256  # artifacts looked at per search, newest first


class StoreError(RuntimeError):
    """The build folder or the process set-up does not allow static kernels; the message says why."""


class FolderUntrusted(StoreError):
    """The build folder, or a folder in it, is a symlink, another user's or open to others' writes."""


class LockBusy(StoreError):
    """Another process holds the build lock (a tier-up does not wait for it); the message says who and how long."""


# The build folder when the config names none (``..._aclnn_static_shape_kernel_build_dir``): both defaults live here.

def default_build_dir() -> str:
    """The seed's default: the folder of the running script (the working folder when there is none)."""
    script = sys.argv[0] if sys.argv and sys.argv[0] not in ("", "-c", "-m") else ""
    return os.path.dirname(os.path.abspath(script)) if script and os.path.exists(script) else os.getcwd()


def tier_up_build_dir() -> str:
    """Where tiered-up graphs keep their static kernels: ``kernels/`` in the per-user cache folder
    (`rewrite.persist.folders`), beside the signing key; made with mode 0700 when missing, and refused
    (`FolderRefused`) when it is a symlink, another user's or open to others' writes."""
    return private_cache_folder("kernels")


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
        # A folder the user named may be reached through their own symlink: its target is what is checked.
        build_dir = os.path.realpath(build_dir)
        if not os.path.isdir(build_dir):
            raise StoreError(f"static-kernel build dir {build_dir} does not exist (config.experimental_config.aclgraph."
                             "_aclnn_static_shape_kernel_build_dir); create it or name an existing folder")
        if not os.access(build_dir, os.W_OK | os.X_OK):
            raise StoreError(f"static-kernel build dir {build_dir} is not writable by this user; "
                             "the seed requires read and write permission there")
        try:
            check_private_folder(build_dir)
            outputs = os.path.join(build_dir, OUTPUTS)
            if os.path.lexists(outputs):
                check_private_folder(outputs)
        except FolderRefused as e:
            raise FolderUntrusted(f"static-kernel build dir refused: {e}. Whoever may write there could plant records, "
                             "hold the build lock or redirect files; name a folder of your own "
                             "(config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir)") from None
        self.build_dir = build_dir
        self.root = os.path.join(build_dir, OUTPUTS)
        stamp = datetime.datetime.now().strftime("%Y%m%d%H%M%S%f")
        self.session = os.path.join(self.root, f"{stamp}_{os.getpid()}_outputs")
        self._counts: dict[str, int] = {}
        self._busy_since: float | None = None  # when this process first found the lock held (monotonic)

    def _folder(self, rel: str) -> str:
        """``rel`` below the build folder, made (0700) level by level, never through a symlink."""
        try:
            path = confined_folder(self.build_dir, rel)
            check_private_folder(self.root)
        except FolderRefused as e:
            raise FolderUntrusted(f"cannot use {os.path.join(self.build_dir, rel)} in the static-kernel build dir: "
                                  f"{e}") from e
        except OSError as e:
            raise StoreError(f"cannot use {os.path.join(self.build_dir, rel)} in the static-kernel build dir: {e}") from e
        return path

    def _session_rel(self, *parts: str) -> str:
        return os.path.join(OUTPUTS, os.path.basename(self.session), *parts)

    def record(self, stem: str, data: dict, debug: bool) -> str:
        """Write one op record as ``{stem}_{n}.json`` into ``{pid}/`` or ``{pid}_debug/``."""
        pid = str(os.getpid())
        folder = self._folder(self._session_rel(f"{pid}_debug" if debug else pid))
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
            if stat.S_ISLNK(os.lstat(self.root).st_mode):
                return []
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
        return self._folder(self._session_rel())

    @contextlib.contextmanager
    def lock(self, wait_s: float | None = None):
        """Hold the build folder's lock while building: yields True. Waits at most ``wait_s`` for another
        builder; then, once the lock has been busy for `LOCK_WAIT_S`, warns who holds it and for how long
        and yields False (build without it, into this process's own session folder); before that,
        raises `LockBusy` (the tier-up's short wait). A lock file that is not this user's regular file
        is reported the same way and never waited for."""
        wait_s = LOCK_WAIT_S if wait_s is None else wait_s
        path = os.path.join(self._folder(OUTPUTS), LOCK)
        try:
            fd = _open_lock(path)
        except OSError as e:
            fd = None
            log.warning("static kernels: cannot use the build lock %s (%s); building without it into %s",
                        path, e, self.session)
        try:
            locked = fd is not None and self._acquire(fd, path, wait_s)
            if locked:  # who holds it, for those who wait: this process, and since when
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"{os.getpid()} {time.time():.3f}\n".encode(), 0)
            try:
                yield locked
            finally:
                if locked:
                    with contextlib.suppress(OSError):
                        os.ftruncate(fd, 0)
        finally:
            if fd is not None:
                os.close(fd)  # closing drops the lock

    def _acquire(self, fd: int, path: str, wait_s: float) -> bool:
        """`lock`'s wait: True once locked; False (warned) when the lock has been busy `LOCK_WAIT_S`."""
        start = time.monotonic()
        deadline = start + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._busy_since = None
                return True
            except BlockingIOError:
                pass
            now = time.monotonic()
            if self._busy_since is None:
                self._busy_since = start
            if now >= deadline:
                holder, held_s = _holder(fd)
                held_s = max(held_s or 0.0, now - self._busy_since)
                if held_s < LOCK_WAIT_S:
                    raise LockBusy(f"the static-kernel build lock {path} is held by {holder} (busy for {held_s:.1f} s; "
                                   f"a build waits at most LOCK_WAIT_S = {LOCK_WAIT_S:.0f} s)")
                log.warning("static kernels: the build lock %s has been held by %s for %.0f s (more than "
                            "LOCK_WAIT_S = %.0f s); building without it into this process's own folder %s",
                            path, holder, held_s, LOCK_WAIT_S, self.session)
                return False
            time.sleep(min(_LOCK_POLL_S, deadline - now))


def _open_lock(path: str) -> int:
    """The lock file, opened without following a symlink or waiting on a FIFO; refused unless it is a
    regular file of this user's. Made, or narrowed, to mode 0600: flock needs only a read-only
    descriptor, so a lock file others can open is a lock others can hold."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o600)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise FolderRefused("not a regular file of this user's")
        if info.st_mode & 0o077:
            os.fchmod(fd, 0o600)
        return fd
    except BaseException:
        os.close(fd)
        raise


def _holder(fd: int) -> tuple[str, float | None]:
    """Who holds the lock on ``fd``'s file (words for a message) and for how many seconds (None: unknown).

    The kernel's table (/proc/locks) names the holding pid whatever it wrote; the pid and start
    time a builder writes into the file (`KernelStore.lock`) say since when, when the pids agree."""
    pid = _locking_pid(fd)
    try:
        m = _HOLDER.match(os.pread(fd, 64, 0))
    except OSError:
        m = None
    if m is not None and (pid is None or int(m.group(1)) == pid):
        return f"pid {int(m.group(1))}", max(time.time() - float(m.group(2)), 0.0)
    if pid is not None:
        return f"pid {pid} (it recorded no start time: not a rewrite build)", None
    return "another process", None


def _locking_pid(fd: int) -> int | None:
    """The pid holding an flock on ``fd``'s file, from /proc/locks (Linux); None when not found."""
    info = os.fstat(fd)
    ident = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    try:
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return None
    by_inode = []
    for line in lines:
        # "1: FLOCK  ADVISORY  WRITE 4242 08:01:1234567 0 EOF"; waiters' lines carry "->" and are skipped
        fields = line.split()
        if len(fields) < 6 or "->" in fields or fields[1] != "FLOCK" or not fields[4].isdigit():
            continue
        if fields[5] == ident:
            return int(fields[4])
        if fields[5].rsplit(":", 1)[-1] == str(info.st_ino):
            by_inode.append(int(fields[4]))
    return by_inode[0] if len(set(by_inode)) == 1 else None
