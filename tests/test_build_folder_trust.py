"""Static-kernel build folders, the tier-up kernel folder, the build lock and the calibration file,
attacked by someone who can write beside them (issue 26): a symlinked folder, a folder another user
owns or anyone may write, a lock held by another process, a FIFO or a symlink planted at the
calibration file. Each attack ends in a clear error or a warning and results equal to eager, with
nothing written outside the folder and no wait beyond its bound."""
from __future__ import annotations

import dataclasses
import logging
import os
import stat
import subprocess
import sys
import threading
import time

import pytest
import torch

import rewrite
import rewrite.kernels.static_kernels as kernels_module
from rewrite.cost import FiguresError, calibration
from rewrite.kernels import UntrustedBuildDir, build_folder
from test_static_kernels import OUTPUTS, Block, _artifacts, _compile, _config

ATOL, RTOL = 5e-5, 1e-4
NOBODY = 65534  # a uid that is not this user's


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A fresh per-user cache (signing key, tier-up folder), one process, nothing loaded yet."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("REWRITE_CACHE_DIR", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setattr(kernels_module, "_loaded", kernels_module._Loaded())
    return tmp_path / "cache" / "rewrite"


def _within(seconds: float, fn, *args):
    """``fn(*args)``, failing the test (not hanging it) when it takes more than ``seconds``."""
    box = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still waiting after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["value"], time.monotonic() - t0


def _files_below(folder) -> list:
    return sorted(str(p) for p in folder.rglob("*"))


class _Tier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(32, 64)
        self.norm = torch.nn.LayerNorm(64)

    def forward(self, x):
        return self.norm(torch.nn.functional.gelu(self.a(x)))


def _tiering(calls: int = 1):
    """A default-mode compiled model that tiers up after ``calls`` calls, its eager model and backend."""
    torch.manual_seed(0)
    model = _Tier().eval()
    config = rewrite.CompilerConfig()
    config.experimental_config.frozen_parameter = True
    config.exec.tier_up_calls = calls
    backend = rewrite.get_backend(config)
    return torch.compile(model, backend=backend, fullgraph=True), model, backend


def _call(compiled, model, x):
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x), atol=ATOL, rtol=RTOL)


def _notes(backend) -> list[str]:
    return [n for g in backend.report.graphs for n in g.notes]


def _kernel_ops(backend) -> list[int]:
    """Ops on static kernels per tiered-up graph, from the tier-up notes."""
    return [int(n.split("planned memory, ")[1].split()[0]) for n in _notes(backend) if "tiered up" in n]


# -- symlinked folders --------------------------------------------------------------------------------

def test_a_symlinked_outputs_folder_in_the_build_dir_is_refused(cache, tmp_path):
    build, outside = tmp_path / "build", tmp_path / "outside"
    build.mkdir(mode=0o700)
    outside.mkdir()
    os.symlink(outside, build / OUTPUTS)
    with pytest.raises(UntrustedBuildDir, match=f"{OUTPUTS} is a symlink"):
        rewrite.get_backend(_config(build))
    assert _files_below(outside) == []


def test_a_symlink_planted_after_the_check_is_refused_before_anything_is_written(cache, tmp_path):
    build, outside = tmp_path / "build", tmp_path / "outside"
    build.mkdir(mode=0o700)
    outside.mkdir()
    backend = rewrite.get_backend(_config(build))  # checked here: a real private folder
    os.symlink(outside, build / OUTPUTS)
    compiled = torch.compile(Block().eval(), backend=backend, fullgraph=True)
    with pytest.raises(Exception, match="symlink"), torch.no_grad():
        compiled(torch.randint(0, 50, (2, 6)))
    assert _files_below(outside) == []


def test_a_symlinked_tier_up_folder_is_refused_with_a_warning(cache, tmp_path, caplog):
    outside = tmp_path / "outside"
    outside.mkdir()
    cache.mkdir(parents=True, mode=0o700)
    os.symlink(outside, cache / "kernels")
    compiled, model, backend = _tiering(calls=1)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        for _ in range(3):
            _call(compiled, model, torch.randn(4, 32))
    assert any("kernels is a symlink" in r.getMessage() and "memory plan only" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert _kernel_ops(backend) == [0]  # tiered up: memory planned, no static kernels
    assert _files_below(outside) == []


# -- folders of another user, or open to others' writes -------------------------------------------------

def _give_away(folder, how: str) -> None:
    if how == "mode 0777":
        os.chmod(folder, 0o777)
    else:
        if os.geteuid() != 0:
            pytest.skip("only root can give a folder to another user")
        os.chown(folder, NOBODY, NOBODY)


@pytest.mark.parametrize("how, why", [("mode 0777", "may be written by other users (mode 777)"),
                                      ("another owner", f"belongs to another user (uid {NOBODY})")])
def test_a_tier_up_folder_of_others_is_refused_with_a_warning(cache, caplog, how, why):
    kernels = cache / "kernels"
    kernels.mkdir(parents=True, mode=0o700)
    os.chmod(cache, 0o700)
    _give_away(kernels, how)
    compiled, model, backend = _tiering(calls=1)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        for _ in range(3):
            _call(compiled, model, torch.randn(4, 32))
    assert any(why in r.getMessage() and str(kernels) in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]
    assert _kernel_ops(backend) == [0]
    assert _files_below(kernels) == []  # nothing recorded, locked or built there


@pytest.mark.parametrize("how, why", [("mode 0777", "may be written by other users"),
                                      ("another owner", "belongs to another user")])
def test_a_named_build_dir_of_others_is_an_error_when_the_backend_is_made(cache, tmp_path, how, why):
    build = tmp_path / "shared"
    build.mkdir(mode=0o700)
    _give_away(build, how)
    with pytest.raises(UntrustedBuildDir, match=why) as err:
        rewrite.get_backend(_config(build))
    assert str(build) in str(err.value) and "_aclnn_static_shape_kernel_build_dir" in str(err.value)
    assert _files_below(build) == []


def test_the_folders_we_make_are_private(cache):
    compiled, model, backend = _tiering(calls=1)
    for _ in range(2):
        _call(compiled, model, torch.randn(4, 32))
    assert _kernel_ops(backend) and _kernel_ops(backend)[0] > 0
    made = [cache, cache / "kernels", cache / "kernels" / OUTPUTS]
    made += [p for p in (cache / "kernels" / OUTPUTS).rglob("*") if p.is_dir()]
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in made} == {oct(0o700)}, made
    lock = cache / "kernels" / OUTPUTS / build_folder.LOCK
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600  # nobody else may open it, so nobody else may hold it


def test_a_lock_file_others_could_open_is_narrowed_to_this_user(cache, tmp_path):
    build = tmp_path / "build"
    (build / OUTPUTS).mkdir(parents=True, mode=0o700)
    os.chmod(build, 0o700)
    lock = build / OUTPUTS / build_folder.LOCK
    lock.write_text("")
    os.chmod(lock, 0o644)  # as earlier versions made it: anyone could take a read-only flock on it
    ks = build_folder.KernelStore(str(build))
    with ks.lock() as locked:
        assert locked
    assert stat.S_IMODE(lock.stat().st_mode) == 0o600


# -- the build lock held by another process -------------------------------------------------------------

_HOLD = ("import fcntl, os, sys, time\n"
         "fd = os.open(sys.argv[1], os.O_RDONLY)  # a read-only descriptor is enough for flock\n"
         "fcntl.flock(fd, fcntl.LOCK_EX)\n"
         "print('held', flush=True)\n"
         "time.sleep(600)\n")


@pytest.fixture
def holder():
    """Start a process that holds the build lock at a path (a stuck or hostile builder); killed after."""
    procs = []

    def hold(lock_path):
        lock_path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        if not lock_path.exists():
            lock_path.touch(mode=0o600)
        proc = subprocess.Popen([sys.executable, "-c", _HOLD, str(lock_path)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout.readline().strip() == "held"
        return proc

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()


def test_a_build_waits_a_bounded_time_for_a_held_lock_then_builds_alone(cache, tmp_path, holder, monkeypatch,
                                                                       caplog):
    build = tmp_path / "build"
    build.mkdir(mode=0o700)
    proc = holder(build / OUTPUTS / build_folder.LOCK)
    monkeypatch.setattr(build_folder, "LOCK_WAIT_S", 2.0)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        (_, _, backend), _ = _within(120, _compile, build)  # results equal eager: _compile checks
    waited = [r.getMessage() for r in caplog.records if "build lock" in r.getMessage()]
    assert len(waited) == 1 and f"held by pid {proc.pid}" in waited[0] and "LOCK_WAIT_S = 2 s" in waited[0], waited
    assert backend.report.graphs[0].applied.get("static kernels built", 0) > 0
    (artifact,) = _artifacts(build)
    assert f"_{os.getpid()}_outputs" in artifact  # into this process's own folder
    assert proc.poll() is None  # the holder was waited for, not disturbed


def test_the_tier_up_call_does_not_wait_for_a_held_lock_and_tiers_up_later(cache, holder):
    proc = holder(cache / "kernels" / OUTPUTS / build_folder.LOCK)
    os.chmod(cache, 0o700)
    os.chmod(cache / "kernels", 0o700)
    compiled, model, backend = _tiering(calls=2)
    x = torch.randn(4, 32)
    for _ in range(2):
        _call(compiled, model, x)
    _, seconds = _within(60, _call, compiled, model, x)  # the tier-up call: put off, never waits for the lock
    assert seconds < 10, seconds
    (put_off,) = [n for n in _notes(backend) if "keeps its ATen code for now" in n]
    assert f"held by pid {proc.pid}" in put_off and "tries again after 2 calls" in put_off
    assert _kernel_ops(backend) == []
    proc.kill()
    proc.wait()
    for _ in range(3):  # two more plain calls, then the tier-up again: the lock is free now
        _call(compiled, model, x)
    assert _kernel_ops(backend) and _kernel_ops(backend)[0] > 0
    assert len([n for n in _notes(backend) if "keeps its ATen code for now" in n]) == 1


def test_a_tier_up_builds_without_a_lock_held_past_the_bound(cache, holder, monkeypatch, caplog):
    proc = holder(cache / "kernels" / OUTPUTS / build_folder.LOCK)
    os.chmod(cache, 0o700)
    os.chmod(cache / "kernels", 0o700)
    monkeypatch.setattr(build_folder, "LOCK_WAIT_S", 0.5)
    compiled, model, backend = _tiering(calls=1)
    x = torch.randn(4, 32)
    for _ in range(2):  # a plain call, then the tier-up: put off
        _within(60, _call, compiled, model, x)
    assert not _kernel_ops(backend)
    time.sleep(0.6)
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        for _ in range(2):  # a plain call, then the tier-up again: the lock has been held past the bound
            _within(60, _call, compiled, model, x)
    assert _kernel_ops(backend) and _kernel_ops(backend)[0] > 0
    assert any(f"held by pid {proc.pid}" in r.getMessage() and "building without it" in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert proc.poll() is None


# -- the calibration file ---------------------------------------------------------------------------------

@pytest.fixture
def quick_calibration(tmp_path, monkeypatch):
    """A private cache folder and an instant 'measurement' (the default figures)."""
    monkeypatch.setenv("REWRITE_CACHE_DIR", str(tmp_path / "cache"))
    measured = dataclasses.replace(calibration.DEFAULT, threads=torch.get_num_threads(), source="measured")
    monkeypatch.setattr(calibration, "measure", lambda quick=False: measured)
    os.makedirs(tmp_path / "cache", mode=0o700)
    return calibration.cache_path()


def test_a_fifo_at_the_calibration_file_never_blocks(quick_calibration, caplog):
    os.mkfifo(quick_calibration)  # opening it for reading without O_NONBLOCK waits for a writer forever
    with caplog.at_level(logging.WARNING, logger="rewrite"):
        cal, _ = _within(30, calibration._load_or_measure)
    assert cal.source == quick_calibration
    assert any("not a regular file" in r.getMessage() for r in caplog.records)
    assert stat.S_ISREG(os.lstat(quick_calibration).st_mode)  # replaced by a good file
    assert calibration.load(quick_calibration).families == cal.families


def test_a_symlink_at_the_calibration_file_is_replaced_never_written_through(quick_calibration, tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("user data")
    os.symlink(victim, quick_calibration)
    cal, _ = _within(30, calibration._load_or_measure)
    assert victim.read_text() == "user data"
    assert not os.path.islink(quick_calibration) and cal.source == quick_calibration


def test_a_calibration_file_of_another_user_is_not_read(quick_calibration):
    if os.geteuid() != 0:
        pytest.skip("only root can give a file to another user")
    calibration.calibrate()
    os.chown(quick_calibration, NOBODY, NOBODY)
    with pytest.raises(FiguresError, match="not private to this user"):
        calibration.load(quick_calibration)
    cal = calibration._load_or_measure()
    assert cal.source == quick_calibration and os.lstat(quick_calibration).st_uid == os.getuid()


def test_the_calibration_folder_is_made_private(tmp_path, monkeypatch):
    monkeypatch.setenv("REWRITE_CACHE_DIR", str(tmp_path / "new" / "cache"))
    monkeypatch.setattr(calibration, "measure", lambda quick=False: calibration.DEFAULT)
    _, path = calibration.calibrate()
    assert stat.S_IMODE(os.stat(os.path.dirname(path)).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600

