"""`StaticKernels`: the static kernels of one compiled function (all its gears): decide, record, build, bind.

While each gear's plan is made (`rewrite.exec.program`), `StaticKernels.decide` gives every op the C
generator supports (`cgen`) a kernel key (`signature.kernel_key`), `fuse` groups neighbouring pointwise
steps (`fusion`), and `record` writes the seed's signature records (`build_folder`). After the last gear, `build`
looks for the kernels in the artifacts of the build folder (`artifact`), builds what is missing into one
new artifact (one C compile, `compiler`; under the folder's lock, so processes on one machine build each
kernel once; a lock held too long is bypassed, never waited on without bound: `build_folder`), and loads them
into the process-wide table every compiled function shares. `bind` gives a plan's step its kernel's
address and operands (`rewrite.exec.planned.NativeRuns` runs them).
"""
from __future__ import annotations

import logging
import tempfile
import threading
import time

import torch

from ..ir import Node
from ..ops import GEMMS, target_name
from ..persist.folders import FolderRefused
from . import artifact, cgen, compiler, fusion, signature
from . import build_folder
from .build_folder import FolderUntrusted, KernelStore, StoreError, check_local_world, default_build_dir, tier_up_build_dir

log = logging.getLogger("rewrite")

__all__ = ["StaticKernels", "StaticKernelError", "UntrustedBuildDir", "check_build_folder", "build_dir", "PACK_MIN"]

# Constant weights of at least this many elements get MKL's packed GEMM (a packed copy costs several MB
# whatever the weight's size, and measured on this machine packing pays from about 384 x 384 on).
PACK_MIN = 1 << 16


class StaticKernelError(RuntimeError):
    """Static kernels cannot be used as configured; the message says what to change."""


class UntrustedBuildDir(StaticKernelError):
    """The build folder is a symlink, another user's or open to others' writes (`build_folder`'s trust rule)."""


def build_dir(config, tiered: bool = False) -> str:
    """The one choice of the static-kernel build folder: the configured one, else the per-user cache
    for the default mode's tier-up (``tiered``), else the seed's default (the script's folder)."""
    configured = config.experimental_config.aclgraph._aclnn_static_shape_kernel_build_dir
    return configured or (tier_up_build_dir() if tiered else default_build_dir())


def check_build_folder(config) -> None:
    """The build folder's check when the backend is made, before any compile (static kernels switched on;
    the option combinations are `rewrite.policy.check_config`'s): LOCAL_WORLD_SIZE, the folder's trust rule."""
    try:
        check_local_world()
        KernelStore(build_dir(config))
    except FolderUntrusted as e:
        raise UntrustedBuildDir(str(e)) from None
    except StoreError as e:
        raise StaticKernelError(str(e)) from None


class _Loaded:
    """The kernels this process can call: key -> (address, library)."""

    def __init__(self):
        self.addresses: dict[str, int] = {}
        self.runner = None
        self.libraries: list = []  # loaded libraries stay loaded
        self.seen: dict[tuple, object] = {}  # (path, mtime, size) -> Artifact or the error it raised
        self.warned_folders: set[str] = set()  # one warning per folder of unusable artifacts, the rest at DEBUG

    def first_warning_for(self, folder: str) -> bool:
        with _warned_lock:
            if folder in self.warned_folders:
                return False
            self.warned_folders.add(folder)
            return True

    def add(self, art: artifact.Artifact, keys) -> int:
        lib = compiler.Library(art.library)
        if self.runner is None:
            self.runner = lib.runner
        n = 0
        for key in keys:
            symbol, _ = art.kernels[key]
            self.addresses[key] = lib.address(symbol)
            n += 1
        self.libraries.append(lib)
        return n


_warned_lock = threading.Lock()
_loaded = _Loaded()  # process-wide: kernels loaded by one compiled function serve all


_PACKED: dict = {}  # (weight address, shape, rows) -> (weight, packed copy): one per weight and row count per process


def _packed_weight(mat2: torch.Tensor, rows: int) -> "_Packed":
    """MKL's packed form of ``mat2`` ([K, N], the transpose of a row-major [N, K] weight), made once."""
    weight = mat2.t()
    # MKL sizes the packed form for the rows it is packed for: one packed copy per row count
    key = (weight.data_ptr(), tuple(weight.shape), rows)
    hit = _PACKED.get(key)
    if hit is None:
        packed = torch.ops.mkl._mkl_reorder_linear_weight(weight.contiguous(), max(rows, 1))
        hit = _PACKED[key] = (weight, _Packed(packed))
    return hit[1]


class _Packed:
    """A packed weight as the plan's tables take it (anything with ``data_ptr()``), kept alive.

    ATen returns MKL's packed buffer as an opaque MKLDNN tensor: it has no ``data_ptr()`` (it raised
    "doesn't have storage" at bind), and a dense copy of its bytes is not a packed weight MKL can use
    (sgemm_compute on one crashed with SIGFPE or SIGSEGV, found by tests/test_kernel_diff.py): the
    address of the buffer itself comes from ``mkldnn::data_ptr``."""

    __slots__ = ("tensor", "address")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.address = torch.ops.mkldnn.data_ptr(tensor) if tensor.is_mkldnn else tensor.data_ptr()

    def data_ptr(self) -> int:
        return self.address


def _constant_value(node: Node):
    """The value of a node computed from constants only (a weight, or a view of one)."""
    if node.kind == "constant":
        return node.value
    from ..ir import map_nodes

    values = map_nodes((node.args, node.kwargs), _constant_value)
    return node.target(*values[0], **values[1])


class StaticKernels:
    """The static kernels of one compiled function (all its gears): decide, record, build, bind."""

    def __init__(self, config, unit, folder: str | None = None):
        """``folder``: the build folder (default: `build_dir` for the unit's policy)."""
        try:
            check_local_world()
            self.store = KernelStore(folder or build_dir(config, tiered=unit.policy.tiers_up))
        except (FolderUntrusted, FolderRefused) as e:
            raise UntrustedBuildDir(f"static-kernel build dir refused: {e}" if isinstance(e, FolderRefused)
                                    else str(e)) from None
        except StoreError as e:
            raise StaticKernelError(str(e)) from None
        self.unit = unit
        self.context = {"torch": torch.__version__, "device": compiler.device_key(), "generator": cgen.VERSION}
        self.pending: dict[str, dict] = {}  # key -> signature, for the next build
        self.signatures: dict[str, dict] = {}  # key -> signature, of every kernel decided on
        self._unsupported: set[str] = set()  # keys the generator has no kernel for
        self.gemm = compiler.blas_available()
        self.enabled = compiler.compiler_available()
        if not self.enabled:
            self._note("static kernels: no C compiler (gcc or cc) on PATH; every op runs its ATen kernel")

    # -- planning: which ops get a kernel, and the records ----------------------------------------
    def decide(self, node: Node, obs) -> str | None:
        """The kernel key for ``node``, or None when it runs its ATen kernel."""
        if not self.enabled or not isinstance(node.target, torch._ops.OpOverload):
            return None
        if (node.target in GEMMS or node.target is torch.ops.aten.convolution.default) and not self.gemm:
            return None  # their kernels call the BLAS ATen uses
        try:
            sig = signature.of_node(node, obs.facts)
        except signature.SignatureError:
            return None
        if sig["inputs"] and sig["inputs"][0]["dtype"] not in signature.DTYPES:
            return None
        if self._packable(node, sig, obs):
            sig["args"].append([cgen.PACKED, True])
        return self._register(sig)

    def _register(self, sig: dict) -> str | None:
        """The key of the kernel for ``sig``, pending a build until loaded; None when there is no kernel for it."""
        key = signature.kernel_key(sig, self.context)
        if key in self._unsupported:
            return None
        if key not in self.signatures:
            if cgen.generate(sig, "k_probe") is None:
                self._unsupported.add(key)
                return None
            self.signatures[key] = sig
        if key not in _loaded.addresses:
            self.pending[key] = sig
        return key

    def fuse(self, graph, kernels: dict) -> list:
        """The groups of ``graph``'s steps that run as one kernel (`fusion`), each with its key;
        ``kernels``: node id -> the key `decide` gave it. A group the generator cannot fuse stays apart."""
        groups = []
        for group in fusion.find_groups(graph, kernels, self.signatures):
            group.key = self._register(signature.check(fusion.fused_signature(group, kernels, self.signatures)))
            if group.key is not None:
                groups.append(group)
        return groups

    def _packable(self, node: Node, sig: dict, obs) -> bool:
        """A float32 matrix product whose weight (``mat2``) is a constant stored as a row-major [N, K] matrix."""
        if sig["op"] not in ("aten.mm.default", "aten.addmm.default") or not compiler.packed_gemm_available():
            return False
        weight = dict(sig["args"])["mat2"]["tensor"]
        k, n = sig["inputs"][weight]["size"]
        (fact,) = obs.facts(signature.tensor_operands(node)[weight])
        return (sig["inputs"][weight]["dtype"] == "float32" and sig["inputs"][weight]["stride"] == [1, k]
                and k * n >= PACK_MIN and obs.storages[fact.storage].origin == "constant")

    def record(self, graph, obs, plan) -> None:
        """Write every op's signature record (debug folder) and those with kernels (the pid folder)."""
        for i, n in enumerate(graph.nodes):
            if n.kind != "call" or not isinstance(n.target, torch._ops.OpOverload):
                continue
            p = plan.nodes.get(i)
            key = p.kernel if p is not None and p.kind == "native" else None
            try:  # a fused kernel's record is its own signature, its steps inside
                sig = self.signatures[key] if key and p.operands is not None else signature.of_node(n, obs.facts)
            except signature.SignatureError as e:
                sig = {"op": target_name(n.target), "note": str(e)}
            data = {"graph": graph.name, "node": n.name, "signature": sig, "kernel": key}
            stem = signature.record_name(sig) if "inputs" in sig else target_name(n.target).split(".", 1)[1]
            self.store.record(stem, data, debug=True)
            if key is not None:
                self.store.record(stem, data, debug=False)

    # -- building ------------------------------------------------------------------------------
    def build(self, keys=None) -> None:
        """Find or build every pending kernel, or those of ``keys`` (what the plans use: a fused group's
        steps were decided on before the group, and their own kernels are built only where a plan runs
        them); afterwards each is callable.

        Waits for another process's build at most `build_folder.LOCK_WAIT_S` (then builds without the lock),
        or, on a tier-up (the model caller's call), `store.TIER_UP_LOCK_WAIT_S`: then `LockBusy`
        is raised and the pending kernels stay pending for the next try."""
        wanted = set(self.pending) if keys is None else set(keys) & set(self.pending)
        need = {k: self.pending[k] for k in wanted if k not in _loaded.addresses}
        if not need:
            self._done(wanted)
            return
        t0 = time.perf_counter()
        found = self._find(need)
        built = 0
        if len(found) < len(need):
            wait_s = build_folder.TIER_UP_LOCK_WAIT_S if self.unit.policy.tiers_up else build_folder.LOCK_WAIT_S
            with self.store.lock(wait_s) as locked:  # others building now finish first; then look again
                if locked:
                    found |= self._find({k: s for k, s in need.items() if k not in found})
                missing = {k: s for k, s in need.items() if k not in found}
                if missing:
                    path = self._build(missing)
                    found |= self._load(path, missing)
                    built = len(missing)
        self._done(wanted)
        self._report(len(need), len(need) - built, built, time.perf_counter() - t0)

    def _done(self, keys) -> None:
        for key in keys:
            self.pending.pop(key, None)

    def _find(self, need: dict) -> set:
        found: set[str] = set()
        for path in self.store.artifacts():
            wanted = set(need) - found
            if not wanted:
                break
            found |= self._load(path, wanted)
        return found

    def _load(self, path: str, wanted) -> set:
        """Keys of ``wanted`` the artifact at ``path`` provides (loaded); damaged or stale artifacts give none."""
        import os

        try:
            st = os.stat(path, follow_symlinks=False)
            stamp = (path, st.st_mtime_ns, st.st_size)
        except OSError:
            return set()
        art = _loaded.seen.get(stamp)
        if art is None:
            try:
                art = artifact.read(path, self.context)
            except artifact.Stale as e:
                log.debug("%s", e)
                art = e
            except (artifact.ArtifactError, OSError) as e:
                folder = os.path.dirname(path)
                if _loaded.first_warning_for(folder):
                    log.warning("%s; its kernels are built anew (other unusable artifacts in %s: at DEBUG level)",
                                e, folder)
                else:
                    log.debug("%s; its kernels are built anew", e)
                art = e
            _loaded.seen[stamp] = art
        if isinstance(art, Exception):
            return set()
        keys = set(wanted) & set(art.kernels)
        if keys:
            try:
                _loaded.add(art, keys)
            except (OSError, compiler.CompileFailed) as e:
                log.warning("static-kernel artifact %s cannot be loaded (%s); its kernels are built anew", path, e)
                return set()
        return keys

    def _build(self, missing: dict) -> str:
        parts = [cgen.RUNTIME, cgen.MATH_DECLARATIONS]
        for key, sig in sorted(missing.items()):
            parts.append(f"/* {sig['op']} */\n" + cgen.generate(sig, artifact.symbol_of(key)))
        source = "\n".join(parts)
        with tempfile.TemporaryDirectory(prefix="rewrite-build-") as tmp:
            try:
                so = compiler.compile_library(source, tmp)
            except compiler.CompileFailed as e:
                raise StaticKernelError(f"static kernels of {self.unit.name} failed to compile: {e}") from e
            with open(so, "rb") as f:
                library = f.read()
        return artifact.write(self.store.output_folder(), missing, self.context, source, library)

    def _report(self, needed: int, found: int, built: int, seconds: float) -> None:
        rep = self.unit.report
        rep.count("static kernels", needed)
        rep.count("static kernels built", built)
        self._note(f"static kernels: {needed} needed, {found} found in artifacts, {built} built, {seconds:.2f} s "
                   f"(build dir {self.store.build_dir})")

    def _note(self, msg: str) -> None:
        self.unit.report.note(msg)

    # -- running (rewrite.exec.planned.NativeRuns) ----------------------------------------------
    @property
    def runner(self):
        return _loaded.runner

    def bind(self, key: str, node: Node, reads: list | None = None):
        """``reads``: the nodes a fused kernel reads (default: ``node``'s own operands)."""
        inputs = signature.tensor_operands(node) if reads is None else reads
        width = len(node.meta) if isinstance(node.meta, tuple) else 1
        operands = [("in", m) for m in inputs] + [("out", k) for k in range(width)]
        sig = self.signatures[key]
        if dict(sig["args"]).get(cgen.PACKED):
            weight = inputs[dict(sig["args"])["mat2"]["tensor"]]
            operands.append(("tensor", _packed_weight(_constant_value(weight), sig["outputs"][0]["size"][0])))
        return _loaded.addresses[key], operands

    def error(self, code: int, nodes: list):
        step, err = (code & 0xFFFFFFFF) - 1, code >> 32
        node = nodes[step] if 0 <= step < len(nodes) else None
        kind, text = cgen.ERRORS.get(err, (RuntimeError, f"static kernel error {err}"))
        where = f" (%{node.name}, {node.op})" if node is not None else ""
        raise kind(f"{text}{where}")
