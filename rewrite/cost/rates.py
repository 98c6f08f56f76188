"""The figures the cost model prices ops with: per op family a fixed overhead and a rate.

`rewrite.cost.calibration` measures them on this machine, `rewrite.cost.machine` keeps them in the
per-machine figures file, `rewrite.cost.model` prices ops with them; `DEFAULT` stands in until (or
when) nothing is measured.
"""
from __future__ import annotations

import dataclasses

from .. import ops

__all__ = ["Rate", "Calibration", "DEFAULT", "FAMILIES", "COMPUTE_FAMILIES", "DTYPES"]

FAMILIES = ops.COST_FAMILIES  # what rewrite.cost prices, declared once in rewrite.ops
COMPUTE_FAMILIES = tuple(ops.COMPUTE_FAMILIES)  # rates in flops/s; the others in bytes/s
DTYPES = ("float32", "float64", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class Rate:
    overhead_s: float  # seconds of a call that does no work
    rate: float        # flops/s (compute families) or bytes/s (the others)


@dataclasses.dataclass(frozen=True, eq=False)  # hashed by identity: cost caches key on it
class Calibration:
    dispatch_s: float                 # calling one ATen kernel from generated code
    view_s: float                     # a view op (no data moved)
    families: dict                    # family name -> Rate
    dtype_speed: dict                 # dtype name -> compute speed relative to float32
    threads: int                      # intra-op threads the process runs with
    parallel: float = 1.0             # speed-up of a large kernel on ``threads`` threads over one
    source: str = "default"           # "default", "measured", or the figures file it came from
    # The process's calibration measures GEMM and attention kernels at a graph's own static shapes
    # (`rewrite.cost.kernel_times`); None (the default, and any calibration a caller builds): the rates alone.
    kernel_times: object = None

    def as_json(self) -> dict:
        return {"dispatch_s": self.dispatch_s, "view_s": self.view_s,
                "families": {f: dataclasses.asdict(r) for f, r in self.families.items()},
                "dtype_speed": dict(self.dtype_speed), "threads": self.threads, "parallel": self.parallel}

    def describe(self) -> str:
        lines = [f"cost model ({self.source}): one thread; large kernels {self.parallel:.2f}x faster on "
                 f"{self.threads} threads; dispatch {self.dispatch_s * 1e6:.2f} us, view {self.view_s * 1e6:.2f} us"]
        for f, r in self.families.items():
            unit = "GFLOP/s" if f in COMPUTE_FAMILIES else "GB/s"
            lines.append(f"  {f:<14} overhead {r.overhead_s * 1e6:7.2f} us   {r.rate / 1e9:8.2f} {unit}")
        lines.append("  dtype speed (compute, vs float32): "
                     + ", ".join(f"{d} {s:.2f}" for d, s in self.dtype_speed.items()))
        return "\n".join(lines)


# Used until (or when) nothing is measured: rough figures for one core of a laptop-class CPU.
DEFAULT = Calibration(
    dispatch_s=3e-6, view_s=1e-6,
    families={"gemm": Rate(6e-6, 30e9), "fused_linear": Rate(10e-6, 25e9), "packed_linear": Rate(6e-6, 32e9),
              "attention": Rate(10e-6, 10e9), "convolution": Rate(10e-6, 20e9),
              "normalization": Rate(4e-6, 4e9), "copy": Rate(3e-6, 6e9), "pointwise": Rate(3e-6, 6e9)},
    dtype_speed={"float32": 1.0, "float64": 0.5, "bfloat16": 0.5, "float16": 0.3}, threads=1)
