"""Static kernels (seed 002, 静态Kernel编译): one kernel per recorded op signature, built once, reused.

Switched on with ``config.experimental_config.aclgraph._aclnn_static_shape_kernel = True`` in
reduce-overhead mode. While each gear's plan is made (`rewrite.exec.program`), every op's
signature (op, dtypes, sizes, strides, arguments) is recorded in the seed's layout (`build_folder`);
ops the C generator supports (`cgen`) become static-kernel steps of the plan. After the last
gear, `StaticKernels.build` looks for the kernels in the artifacts of the build folder, builds
what is missing into one new artifact (one C compile; under the folder's lock, so processes on
one machine build each kernel once; a lock held too long is bypassed, never waited on without
bound: `build_folder`), and loads them. The build folder must be this user's and closed to others'
writes (`build_folder`); one that is not is an `UntrustedBuildDir` error, or, for a tier-up, a warning. Later processes find everything and build
nothing.

Kernels are keyed by their signature, torch version, device (CPU model and flags) and generator
version (`signature.kernel_key`); an artifact for another torch, device or generator is stale,
one that fails any check is damaged, and either way the kernels are built anew, never trusted.

Where things are: `static_kernels.py` (`StaticKernels`, the engine: decide, record, build, bind; `build_dir`,
the one choice of the build folder; `check_build_folder`, its check when the backend is made),
`signature.py` (op signatures and kernel keys), `cgen/` (C code per signature), `fusion.py` (neighbouring
pointwise steps as one kernel), `compiler.py` (C to a loaded shared library), `artifact.py` (the signed
``static_kernel_{datetime}.run``), `build_folder.py` (the build folder: both defaults, its trust rule, its lock).
"""
from __future__ import annotations

from .static_kernels import (PACK_MIN, StaticKernelError, StaticKernels, UntrustedBuildDir, build_dir,
                             check_build_folder)
from .build_folder import LockBusy

__all__ = ["StaticKernels", "StaticKernelError", "UntrustedBuildDir", "LockBusy", "check_build_folder", "build_dir",
           "PACK_MIN"]
