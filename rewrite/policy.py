"""The execution policy: how one compile unit's graphs run, resolved once from the config.

The config says what the user asked for (``mode``, ``exec.kernels``, ``exec.tier_up_calls``, the
static-kernel switch); the policy says what that means for one compile unit, decided here and
nowhere else, the way vLLM resolves its compilation config into one CUDA-graph mode. The backend
and the loader of an export build their units the same way (`rewrite.unit.CompileUnit`), so a
compiled model, a loaded export and ``cache_compile`` run a graph under the same policy:

* ``plan = "at-compile"`` (reduce-overhead): every static graph gets its execution plan when it is
  built (memory planned into one arena; on CUDA a CUDA graph per gear), with static kernels when
  they are switched on (C kernels on CPU, Inductor's per-gear Triton kernels on CUDA);
* ``plan = "tier-up"`` (the default mode, static CPU inference graphs): a graph runs its ATen code
  for ``tier_up_calls`` calls, then gets the same plan and static C kernels on the next call's
  inputs; whatever stands in the way leaves it on its ATen code with a note, never an error;
* ``plan = "none"``: each graph runs the callable its kernel backend built.

Training graphs never tier up: they hand saved activations to their backward graph, a pattern the
plans have had far less use with.
"""
from __future__ import annotations

import dataclasses

from .config import CompilerConfig, is_reduce_overhead

__all__ = ["ExecutionPolicy", "PLANS", "resolve_policy"]

PLANS = ("none", "at-compile", "tier-up")


@dataclasses.dataclass(frozen=True)
class ExecutionPolicy:
    plan: str = "none"  # one of PLANS
    tier_up_calls: int = 0  # plain calls before a graph tiers up (plan "tier-up" only)
    static_kernels: bool = False  # planned graphs run static kernels where they have them
    kernels: str = "aten"  # config.exec.kernels: the kernel backend of every graph

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
    def records_signatures(self) -> bool:
        """The seed's per-op signature records belong to reduce-overhead's static kernels."""
        return self.plan == "at-compile" and self.static_kernels

    def inductor_kernels_on(self, device_type: str) -> bool:
        """Whether a graph on ``device_type`` is compiled by Inductor: always with ``exec.kernels =
        "inductor"``; in reduce-overhead on CUDA, static kernels are Inductor's Triton kernels."""
        return self.kernels == "inductor" or (self.plan == "at-compile" and self.static_kernels
                                              and device_type == "cuda")


def resolve_policy(config: CompilerConfig, kind: str = "inference") -> ExecutionPolicy:
    """The policy of a compile unit of ``kind`` ("forward", "backward" or "inference") under ``config``."""
    kernels = config.exec.kernels
    if is_reduce_overhead(config):
        return ExecutionPolicy("at-compile", 0, bool(config.experimental_config.aclgraph._aclnn_static_shape_kernel),
                               kernels)
    calls = config.exec.tier_up_calls
    if calls and kernels == "aten" and kind == "inference":
        return ExecutionPolicy("tier-up", calls, True, kernels)
    return ExecutionPolicy("none", 0, False, kernels)
