"""The execution policy: how one compile unit's graphs run, resolved once from the config.

The config says what the user asked for (``mode``, ``exec.kernels``, ``exec.tier_up_calls``, the
static-kernel switch); the policy says what that means for one compile unit, decided here and
nowhere else, the way vLLM resolves its compilation config into one CUDA-graph mode. The backend
and the loader of an export build their units the same way (`rewrite.unit.CompileUnit`), so a
compiled model, a loaded export and ``cache_compile`` run a graph under the same policy:

* ``plan = "at-compile"`` (reduce-overhead): every static graph gets its execution plan when it is
  built: on CPU memory planned into one arena, with static C kernels when they are switched on; on
  CUDA a CUDA graph per gear running Inductor's Triton kernels compiled for the gear's sizes
  (``exec.cuda_kernels``, on without asking: static shapes are for speed on both devices);
* ``plan = "tier-up"`` (the default mode, static inference graphs): a graph runs its ATen code
  for ``tier_up_calls`` calls, then gets what reduce-overhead builds: on CPU the plan and static C
  kernels, built on the next call's inputs; on CUDA Inductor's kernels, compiled on the caller's
  thread (`exec.hot_swap` says why not on another), and a CUDA graph. Whatever stands in the way leaves
  the graph on its ATen code with a note, never an error;
* ``plan = "none"``: each graph runs the callable its kernel backend built.

Training graphs never tier up: they hand saved activations to their backward graph, a pattern the
plans have had far less use with.

`check_config` is the one check of option combinations, made before any work is done (when a backend is
made, and for each npugraph_ex ``options=``); it and `resolve_policy` are the only readers of the raw
static-kernel switch (TorchAir's private field ``experimental_config.aclgraph._aclnn_static_shape_kernel``):
everything else asks the policy.
"""
from __future__ import annotations

import dataclasses

from .config import REDUCE_OVERHEAD_MODES, CompilerConfig, ConfigError, is_reduce_overhead

__all__ = ["ExecutionPolicy", "PLANS", "resolve_policy", "check_config"]

PLANS = ("none", "at-compile", "tier-up")


@dataclasses.dataclass(frozen=True)
class ExecutionPolicy:
    plan: str = "none"  # one of PLANS
    tier_up_calls: int = 0  # plain calls before a graph tiers up (plan "tier-up" only)
    static_kernels: bool = False  # planned graphs run static kernels where they have them
    kernels: str = "aten"  # config.exec.kernels: the kernel backend of every graph
    cuda_kernels: str = "inductor"  # config.exec.cuda_kernels: what a planned CUDA graph's kernels are

    def __post_init__(self):
        if self.plan not in PLANS:
            raise ValueError(f"execution plan {self.plan!r} is not one of {PLANS}")
        if (self.plan == "tier-up") != (self.tier_up_calls > 0):
            raise ValueError(f"tier_up_calls = {self.tier_up_calls} does not fit plan {self.plan!r}")

    @property
    def planned(self) -> bool:
        """Static graphs get an execution plan (at compile time or when they tier up)."""
        return self.plan != "none"

    @property
    def tiers_up(self) -> bool:
        return self.plan == "tier-up"

    @property
    def kernels_optional(self) -> bool:
        """Static kernels that cannot be had leave the plan without them (tier-up), instead of an error
        (reduce-overhead, where the user switched them on)."""
        return self.tiers_up

    @property
    def static_kernels_asked(self) -> bool:
        """The user switched static kernels on (reduce-overhead): their build folder is checked when the
        backend is made, and a kernel that cannot be had is an error."""
        return self.plan == "at-compile" and self.static_kernels

    @property
    def records_signatures(self) -> bool:
        """The seed's per-op signature records belong to reduce-overhead's static kernels."""
        return self.static_kernels_asked

    def inductor_kernels_on(self, device_type: str) -> bool:
        """Whether a graph on ``device_type`` is compiled by Inductor when it is built: always with
        ``exec.kernels = "inductor"``; in reduce-overhead on CUDA, unless ``exec.cuda_kernels = "aten"``.
        (A tier-up on CUDA compiles with Inductor later, off the caller's path: `hot_kernels_on`.)"""
        return self.kernels == "inductor" or (self.plan == "at-compile" and device_type == "cuda"
                                              and self.cuda_kernels == "inductor")

    def hot_kernels_on(self, device_type: str) -> str:
        """What a tiering graph on ``device_type`` gets when it tiers up: ``"static-c"`` (CPU: plan and C
        kernels), ``"inductor"`` or ``"aten"`` (CUDA: the kernels inside its CUDA graph)."""
        return "static-c" if device_type == "cpu" else self.cuda_kernels


def resolve_policy(config: CompilerConfig, kind: str = "inference") -> ExecutionPolicy:
    """The policy of a compile unit of ``kind`` ("forward", "backward" or "inference") under ``config``."""
    kernels, cuda = config.exec.kernels, config.exec.cuda_kernels
    if is_reduce_overhead(config):
        return ExecutionPolicy("at-compile", 0, bool(config.experimental_config.aclgraph._aclnn_static_shape_kernel),
                               kernels, cuda)
    calls = config.exec.tier_up_calls
    if calls and kernels == "aten" and kind == "inference":
        return ExecutionPolicy("tier-up", calls, True, kernels, cuda)
    return ExecutionPolicy("none", 0, False, kernels, cuda)


def check_config(config: CompilerConfig) -> None:
    """Reject option combinations that conflict, before any work is done. (What needs the machine, the
    static-kernel build folder, is checked beside it by the backend: `rewrite.kernels.check_build_folder`.)"""
    if config.ge_config.enable_single_stream and config.exec.auto_streams:
        raise ConfigError("config.ge_config.enable_single_stream = True conflicts with "
                          "config.exec.auto_streams = True; set at most one of them")
    if config.experimental_config.aclgraph._aclnn_static_shape_kernel and not is_reduce_overhead(config):
        raise ConfigError("config.experimental_config.aclgraph._aclnn_static_shape_kernel = True needs "
                          f"config.mode in {list(REDUCE_OVERHEAD_MODES)} (static kernels belong to reduce-overhead "
                          f"mode), got {config.mode!r}")
