"""`rewrite.inference.cache_compile`: compile a module's method once; later processes skip Dynamo.

    class Model(torch.nn.Module):
        def __init__(self):
            ...
            self.cached_prompt = rewrite.inference.cache_compile(self.prompt)
        def forward(self, x):
            return self.cached_prompt(x)

The first call traces the method with Dynamo through the rewrite pipeline (the export's capture:
one whole graph, weights frozen), and writes the program in the export format under
``{cache_dir}/{model_info}/{func}/`` (multi-rank: ``{cache_dir}/{model_info}/world{N}global_rank{r}
[tp_rank{t}][pp_rank{p}]/{func}/``): ``program.json`` (the export's graph file), ``gears/`` (each
gear's optimized graph), ``live.json`` and the key. A later process with the same script loads it
with the export loader's checks and calls it: no Dynamo, no guards, no optimizer.

Weights: the program holds the module's parameters and buffers as constants (as an export does),
but they are **not copied** into the cache: the entry names them and they are read from the live
module. Constants the optimizer computed from them (merged Q/K/V weights, transposed copies) and
tensor attributes that are not registered parameters or buffers are stored in the entry. Because
the optimizer may fold weights' values into the program, the key holds a checksum of the module's
parameters and buffers (computed at the first call and again when one of them is replaced or
updated in place), so other weights are a miss, never a stale result.

Contract (TorchAir's): the process that loads must run the same script that wrote the entry; the
key covers what can be checked cheaply (code of the method and of every module class of the model,
parameter names/shapes/dtypes and checksums, input dtypes/ranks (and shapes with dynamic=False),
gears, config, versions, ranks); a call whose inputs the loaded program does not fit compiles again
(logged); graphs with random ops are refused; inference only (no autograd history).
"""
from __future__ import annotations

import copy
import inspect
import json
import logging
import os
import threading

import torch

from . import ops
from .cache.aot import gear_graphs_by_key, gear_label
from .cache.graph_files import GRAPHS_FILE, LiveWeightReader, LiveWeightWriter, check_error, decode_graphs, encode_graphs
from .cache.key import class_digest, code_digest, config_digest, digest, tensor_digest, versions
from .cache.store import CacheDir, count
from .config import CompilerConfig
from .persist.errors import ExportError
from .persist.weights import collected_weight
from .subclasses import flatten, is_subclass, layout_text, plain_tensors

log = logging.getLogger("rewrite")

__all__ = ["cache_compile", "CachedFunction", "RNG_MESSAGE"]

DEFAULT_DIR = ".rewrite_cache"
PROGRAM_FILE = "program.json"
LIVE_FILE = "live.json"
RNG_MESSAGE = "Cache compile does not support operator that depend on RNG"
_NOT_RUN = object()  # the first call's program has not run yet


def _same_config(a: CompilerConfig, b: CompilerConfig) -> bool:
    return config_digest(a)[1] == config_digest(b)[1] and a.cache.dir == b.cache.dir


def cache_compile(func, *, config: CompilerConfig | None = None, backend=None, dynamic: bool = True,
                  cache_dir: str | None = None, global_rank: int | None = None, tp_rank: int | None = None,
                  pp_rank: int | None = None, custom_decompositions: dict | None = None) -> "CachedFunction":
    """Wrap ``func``, a bound method of a ``torch.nn.Module``, in a compile cache (see the module doc).

    ``backend``: a backend from `rewrite.get_backend` (its config is used; with ``config`` also given
    they must be equal). ``cache_dir``: default ``config.cache.dir``, else ``.rewrite_cache``.
    """
    if not (inspect.ismethod(func) and isinstance(func.__self__, torch.nn.Module)):
        raise TypeError(f"cache_compile wraps a bound method of a torch.nn.Module (e.g. self.inner_forward), got "
                        f"{type(func).__name__} {getattr(func, '__qualname__', func)!r}")
    if backend is not None:
        from .backend import RewriteBackend  # imported only here: it costs 0.4 s, a warm start needs none of it

        if not isinstance(backend, RewriteBackend):
            raise TypeError(f"backend must come from rewrite.get_backend(...), got {type(backend).__name__}")
    if config is not None and not isinstance(config, CompilerConfig):
        raise TypeError(f"config must be a rewrite.CompilerConfig, got {type(config).__name__}")
    if backend is not None and config is not None and not _same_config(config, backend.config):
        raise ValueError("config in current backend is different from the config during cache generation.")
    if config is None:
        config = backend.config if backend is not None else CompilerConfig()
    if not isinstance(dynamic, bool):
        raise TypeError(f"dynamic must be True or False, got {dynamic!r}")
    if custom_decompositions is not None and not isinstance(custom_decompositions, dict):
        raise TypeError("custom_decompositions must be a dict {OpOverload: function} (torch._decomp.get_decompositions)")
    if custom_decompositions is None and backend is not None and backend.decompositions is not None:
        from .backend import decomposition_table

        extra = {k: v for k, v in backend.decompositions.items() if decomposition_table().get(k) is not v}
        custom_decompositions = extra or None
    for name, value in (("global_rank", global_rank), ("tp_rank", tp_rank), ("pp_rank", pp_rank)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{name} must be a non-negative int or None, got {value!r}")
    root = cache_dir if cache_dir is not None else (config.cache.dir or DEFAULT_DIR)
    if not isinstance(root, (str, os.PathLike)):
        raise TypeError(f"cache_dir must be a path, got {type(root).__name__}")
    return CachedFunction(func, copy.deepcopy(config), dynamic, os.fspath(root), global_rank, tp_rank, pp_rank,
                          custom_decompositions, named=cache_dir is not None or config.cache.dir is not None)


class _Registrations:
    """How many parameters, buffers and submodules any module has registered since the first
    `cache_compile` (torch's global registration hooks): while it stands still, no module's set of
    tensors has changed (short of writing ``module._parameters`` directly)."""

    def __init__(self):
        self.count = 0
        self._lock = threading.Lock()
        self._watching = False

    def watch(self) -> None:
        with self._lock:
            if self._watching:
                return
            from torch.nn.modules import module

            module.register_module_parameter_registration_hook(self._seen)
            module.register_module_buffer_registration_hook(self._seen)
            module.register_module_module_registration_hook(self._seen)
            self._watching = True

    def _seen(self, *args) -> None:
        # Dynamo traces the hook when a compiled forward builds a module (transformers' Llama slices
        # its ModuleList every call): counting there would make it guard on the count, and every call
        # of that model would recompile. Such modules live inside the trace, never in a cached module.
        if torch.compiler.is_compiling():
            return
        self.count += 1  # a lost increment under a race is harmless: any increment is a change


_registrations = _Registrations()


def _where(tensors: list) -> list:
    """Where each tensor's data lives and its version counter (in-place updates bump it).

    A DTensor's own ``data_ptr()`` is 0, and an in-place update through it bumps its own ``_version``
    but not its shard's: both are read, the wrapper's version and the shard's (`plain_tensors`) place."""
    return [(t.data_ptr(), t._version) if not is_subclass(t)
            else (t._version, [(p.data_ptr(), p._version) for p in plain_tensors(t)]) for t in tensors]


class _Bound(torch.nn.Module):
    """The wrapped method as a module for the export's capture (parameters keep their names under ``inner.``)."""

    def __init__(self, module: torch.nn.Module, fn):
        super().__init__()
        self.inner = module
        self._fn = fn

    def forward(self, *args, **kwargs):
        return self._fn(self.inner, *args, **kwargs)


class CachedFunction:
    """What `cache_compile` returns: call it like the method."""

    def __init__(self, func, config, dynamic, root, global_rank, tp_rank, pp_rank, decompositions, named=True):
        self._module = func.__self__
        self._fn = func.__func__
        self.__name__ = self._fn.__name__
        self.__wrapped__ = func
        self.config = config
        self.dynamic = dynamic
        self.decompositions = decompositions
        self._lock = threading.Lock()  # guards the fields below, never held while compiling or loading
        self._static: dict | None = None
        self._weights_state = (None, None)  # (`_registrations` count, `_where` of the tensors) when last hashed
        self._tensor_list: list = []
        _registrations.watch()
        self._programs: dict = {}  # key hash -> list of loaded programs (several input specialisations)
        # The gears of the last call whose inputs carried `set_dim_gears` marks, per flattened input
        # (TorchAir marks the first call's inputs only; later calls without marks reuse them, as the
        # graph Dynamo compiled for the marked call serves them).
        self._gears: tuple | None = None
        # A folder the user named that is refused is an error at the first call; the default one a warning.
        self.cache = CacheDir.get(root, named=named)
        self.rel = os.path.join(type(self._module).__name__, _rank_folder(global_rank, tp_rank, pp_rank),
                                self.__name__)
        self.path = self.cache.path(self.rel)
        self._rank = _rank_folder(global_rank, tp_rank, pp_rank) or "single"

    def __repr__(self):
        return f"cache_compile({type(self._module).__name__}.{self.__name__}, cache={self.path!r})"

    # -- the key ------------------------------------------------------------------------------
    def _tensors(self) -> list[tuple[str, torch.Tensor]]:
        m = self._module
        return list(m.named_parameters(remove_duplicate=False)) + list(m.named_buffers(remove_duplicate=False))

    def _static_fields(self) -> dict:
        """The fields that do not depend on the call; weights re-hashed when one is replaced or updated.

        Checked on every call, so cheaply: while no module anywhere registered a parameter, buffer or
        submodule since the last full walk (`_registrations`), the tensors found then are still the
        module's, and only where they live and their version counters are compared (``.data = ...``
        and in-place updates change those). Walking ``named_parameters`` every call cost 0.5-0.8 ms
        for MiniLM."""
        with self._lock:
            static, tensors, (generation, seen) = self._static, self._tensor_list, self._weights_state
        if static is not None and generation == _registrations.count and _where(tensors) == seen:
            return static
        generation = _registrations.count
        named = self._tensors()
        tensors = [t for _, t in named]
        seen = _where(tensors)
        with self._lock:
            if (self._static is not None and seen == self._weights_state[1] and len(tensors) == len(self._tensor_list)
                    and all(a is b for a, b in zip(tensors, self._tensor_list))):
                self._weights_state = (generation, seen)  # registrations elsewhere: this module's tensors stand
                return self._static
        classes = sorted({type(m) for m in self._module.modules()}, key=lambda c: (c.__module__, c.__qualname__))
        code = digest(code_digest(self._fn) + "".join(class_digest(c) for c in classes))
        params = digest(";".join(f"{n}:{str(t.dtype)[6:]}{list(t.shape)}@{t.device.type}{layout_text(t)}"
                                 for n, t in named))
        decomps = "none" if not self.decompositions else digest(";".join(
            sorted(f"{op}:{code_digest(fn)}" for op, fn in self.decompositions.items())))
        fields = {"versions": versions(), "config": config_digest(self.config)[0], "code": code, "parameters": params,
                  "weights": f"{len(tensors)} tensors, {tensor_digest(tensors)}",
                  "dynamic": str(self.dynamic), "rank": self._rank, "decompositions": decomps}
        with self._lock:
            self._static, self._weights_state, self._tensor_list = fields, (generation, seen), tensors
        return fields

    def _call_gears(self, flat: list) -> tuple:
        """Each flattened input's gears for this call: its own marks, else those the function remembers.

        A call whose inputs carry marks (re)sets the function's gears; a call without marks, with as
        many inputs of the same ranks, uses them. The gears are part of the key, so either way the
        call finds the entry the marked call wrote."""
        from .gears import get_dim_gears

        marked = tuple(get_dim_gears(leaf) if isinstance(leaf, torch.Tensor) else {} for leaf in flat)
        if any(marked):
            with self._lock:
                self._gears = marked
            return marked
        with self._lock:
            remembered = self._gears
        if remembered is None or len(remembered) != len(flat) or not all(
                not g or (isinstance(leaf, torch.Tensor) and leaf.dim() > max(g)) for g, leaf in zip(remembered, flat)):
            return marked
        return remembered

    def _input_fields(self, flat: list, spec, gears: tuple) -> dict:
        parts, devices, dtypes = [], set(), set()
        for leaf, g in zip(flat, gears):
            if isinstance(leaf, torch.Tensor):
                # A geared dim's size is the gear's to choose, never part of the key.
                shape = [("*" if d in g else s) for d, s in enumerate(leaf.shape)] if not self.dynamic \
                    else f"{leaf.dim()}d"
                parts.append(f"{str(leaf.dtype)[6:]}{shape}@{leaf.device.type}")
                devices.add(leaf.device.type)
                dtypes.add(str(leaf.dtype)[6:])
            else:
                parts.append(type(leaf).__name__ if self.dynamic else f"{type(leaf).__name__}={leaf!r}")
        listed = [str(sorted(g.items())) if g else "-" for g in gears]
        return {"inputs": digest(f"{spec}|{parts}"),
                "gears": (f"{self.config.inference_config.dynamic_gears_merge_policy}: {listed}" if any(gears)
                          else "none"),
                "device": ",".join(sorted(devices)) or "none", "dtype": ",".join(sorted(dtypes)) or "none"}

    @staticmethod
    def _mark(flat: list, gears: tuple) -> None:
        """Put the remembered gears on this call's inputs, so a compile traces them as the marked call did."""
        from .gears import get_dim_gears, set_dim_gears

        for leaf, g in zip(flat, gears):
            if g and not get_dim_gears(leaf):
                set_dim_gears(leaf, dim_gears={d: list(v) for d, v in g.items()})

    # -- calling ------------------------------------------------------------------------------
    def __call__(self, *args, **kwargs):
        flat, spec = torch.utils._pytree.tree_flatten((args, kwargs))
        gears = self._call_gears(flat)
        fields = {**self._static_fields(), **self._input_fields(flat, spec, gears)}
        key = json.dumps(fields, sort_keys=True)
        for program in list(self._programs.get(key, ())):
            try:
                return self._run(program, args, kwargs)
            except ExportError as e:  # the inputs do not fit this specialisation (a size Dynamo specialized)
                log.info("cache_compile %s: the loaded program does not fit this call (%s)", self.__name__, e)
        with self.cache.lock(self.rel):
            hit = self._load(fields, args, kwargs)
            if hit is None:
                self._mark(flat, gears)
            program, result = hit if hit is not None else self._compile(fields, args, kwargs)
            with self._lock:
                self._programs.setdefault(key, []).append(program)
        return result if result is not _NOT_RUN else self._run(program, args, kwargs)

    @staticmethod
    def _run(program, args, kwargs):
        with torch.no_grad():
            return program(*args, **kwargs)

    def _live(self) -> dict:
        """The module's tensors by name; a tensor subclass (DTensor) by its inner tensors' names instead
        (``inner.{name}._local_tensor``: the program holds this rank's shard, never the wrapper)."""
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            return {f"inner.{name}": v.detach() for n, t in self._tensors() for name, v in flatten(t, n)
                    if isinstance(v, torch.Tensor)}

    def _load(self, fields, args, kwargs):
        """(the loaded program, its result for this call) on a hit, else None (a miss, logged)."""
        from .export.loader import ExportedModel
        from .gears.spec import MAX_GEARS

        entry = self.cache.lookup(self.rel, fields, f"{type(self._module).__name__}.{self.__name__}")
        if entry is None:
            return None
        try:
            # Every file is read through the verified entry: its bytes must have the signed sha256.
            live = self._live()
            program = entry.read_json(PROGRAM_FILE)
            _check_process_groups(program)
            live_data = entry.read_json(LIVE_FILE)
            reader = LiveWeightReader(entry.folder, program.get("weights", {}), live_data.get("live", {}), live,
                                      PROGRAM_FILE, signed=entry.files)
            reader.verify_all()
            gear_graphs = {}
            if entry.has(f"gears/{GRAPHS_FILE}"):
                graphs, _ = decode_graphs(entry, "gears/", {**live, **reader.loaded}, max_graphs=MAX_GEARS)
                gear_graphs = gear_graphs_by_key(graphs, f"gears/{GRAPHS_FILE}")
            # The program's metas are this user's rewrite's own for this key (it signed them): not inferred again.
            loaded = ExportedModel(program, reader, self.config, where=PROGRAM_FILE, gear_graphs=gear_graphs,
                                   check_metas=False)
            result = self._run(loaded, args, kwargs)  # the call must fit (or it is a miss), before anything is returned
        except Exception as e:  # noqa: BLE001 - a damaged entry, or one that does not fit this call, is a miss
            if not check_error(e):
                raise
            self.cache.damaged(entry, e)
            return None
        count("hits")
        log.info("cache_compile %s: loaded %s (%d gear graphs)", self.__name__, entry.folder, len(gear_graphs))
        return loaded, result

    def _compile(self, fields, args, kwargs):
        from .export.capture import capture
        from .export.exporter import graph_file_text
        from .export.loader import ExportedModel
        from .export.assembly import build_program
        from .fx_bridge import CompileError

        count("traced")
        config = copy.deepcopy(self.config)
        config.cache.dir = None  # the whole program is cached here; not its AOT graph again
        model = _Bound(self._module, self._fn)
        log.info("cache_compile %s: tracing and compiling", self.__name__)
        cap = capture(model, args, kwargs, self.dynamic, config, self.decompositions)
        random = [n for n in cap.graph.nodes
                  if n.kind == "call" and ops.draws_random_numbers(n.target, n.args, n.kwargs)]
        if random:
            raise CompileError(f"{RNG_MESSAGE}: {self.__name__} calls {random[0].op} (node {random[0].name}); "
                               "its results would differ from eager (RNG state) after a load")
        live = self._live()
        prog = build_program(cap, model, args, kwargs, name="program", dynamic=self.dynamic, config=config, folder="",
                             rank=None, world_size=None,
                             weight_writer=lambda names, folder: LiveWeightWriter(live, folder))
        writer = prog.weights
        data = json.loads(json.dumps(prog.data))
        reader = _InMemoryReader(writer, live)
        gear_graphs: dict = {}
        loaded = ExportedModel(data, reader, self.config, where=PROGRAM_FILE, gear_graphs=gear_graphs)
        # -- write: stored weights, the program, the live table, the gear graphs; then the key ----------
        files = [(w.file, w.data) for w in writer.files.values()]
        if gear_graphs:
            gear_files = encode_graphs({gear_label(k): g for k, g in gear_graphs.items()}, {**live, **reader.loaded})
            files += [(f"gears/{rel}", raw) for rel, raw in gear_files]
        files.append((LIVE_FILE, json.dumps({"live": writer.live_records}).encode()))
        files.append((PROGRAM_FILE, graph_file_text(data).encode("utf-8")))
        if self.cache.write(self.rel, fields, files, kind="function",
                            label=f"{type(self._module).__name__}.{self.__name__}"):
            log.info("cache_compile %s: wrote %s", self.__name__, self.path)
        # A program with collectives ran them once already, in the traced call: running it again would
        # issue them twice on this rank, while a rank that found its entry runs them once (its peers'
        # collectives would pair with the wrong calls). Its result is the traced call's.
        return loaded, (cap.result if data.get("collectives") else _NOT_RUN)


class _InMemoryReader(LiveWeightReader):
    """The program's weights straight from the writer (the first process reads nothing back from disk)."""

    def __init__(self, writer: LiveWeightWriter, live: dict):
        super().__init__(".", writer.records(), writer.live_records, live, PROGRAM_FILE)
        self._writer = writer

    def get(self, name: str) -> torch.Tensor:
        if name not in self.loaded:
            self.loaded[name] = self.placed(collected_weight(self._writer, name), self.records[name])
        return self.loaded[name]


def _check_process_groups(program: dict) -> None:
    """The groups the program's collectives name must be this process's groups of the same ranks.

    Group names are per process (``"0"`` is the default group; subgroups are numbered as they are
    created), so the same script names them alike; a program whose group names another set of
    ranks here (another script, another mesh) is a miss, never a collective with the wrong peers."""
    groups = program.get("process_groups") or {}
    if not isinstance(groups, dict) or not groups:
        return
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        raise ExportError("the program holds collectives and this process has no process group "
                          "(torch.distributed.init_process_group)")
    from torch.distributed.distributed_c10d import _resolve_process_group

    for name, info in groups.items():
        want = info.get("ranks") if isinstance(info, dict) else None
        try:
            have = dist.get_process_group_ranks(_resolve_process_group(name))
        except Exception as e:  # noqa: BLE001 - no such group here
            raise ExportError(f"the program's collectives use process group {name!r} (ranks {want}), which this "
                              f"process does not have ({type(e).__name__}: {e})") from None
        if have != want:
            raise ExportError(f"the program's collectives use process group {name!r} of ranks {want}; in this "
                              f"process that group has ranks {have}")


def _rank_folder(global_rank, tp_rank, pp_rank) -> str:
    """``world{N}global_rank{r}[tp_rank{t}][pp_rank{p}]`` for multi-rank runs, else ''."""
    world = None
    if global_rank is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            global_rank, world = dist.get_rank(), dist.get_world_size()
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
    if global_rank is None:
        return ""
    name = f"world{world if world is not None else 'unknown'}global_rank{global_rank}"
    if tp_rank is not None:
        name += f"tp_rank{tp_rank}"
    if pp_rank is not None:
        name += f"pp_rank{pp_rank}"
    return name
