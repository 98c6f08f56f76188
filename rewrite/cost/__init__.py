"""The cost model: what an op, or a graph, takes on this machine (``rewrite.cost``).

model.py prices ops and graphs, counting sizes as sizes.py does, with the figures of rates.py;
calibration.py measures those rates and holds the process's figures; kernel_times.py measures GEMM
and attention kernels at a graph's own static shapes; timing.py times a kernel for both; machine.py
keeps both kinds of figures in the one per-machine file. Nothing here imports a layer above it.
"""
from .calibration import calibrate, current, use
from .kernel_times import CONVOLUTION_PARAMS, KernelTimes
from .machine import FiguresError, cache_path
from .model import (FAMILIES, FOLD_SIZE_LIMIT, SIZE_S, call_inputs, dispatch_overhead, family_of, flops,
                    folds_at_compile_time, foldable_target, for_static_kernels, graph_cost, is_weight, moves_no_data,
                    node_cost, op_cost, pointwise_pass, single_thread_cost)
from .rates import DEFAULT, Calibration, Rate
from .sizes import SYMBOL_SIZE, nbytes, numel

__all__ = ["op_cost", "node_cost", "graph_cost", "numel", "nbytes", "flops", "moves_no_data", "family_of",
           "call_inputs", "folds_at_compile_time", "foldable_target", "is_weight", "dispatch_overhead",
           "single_thread_cost", "pointwise_pass", "for_static_kernels", "FAMILIES", "SIZE_S", "SYMBOL_SIZE", "FOLD_SIZE_LIMIT",
           "Rate", "Calibration", "DEFAULT", "current", "use", "calibrate", "KernelTimes", "CONVOLUTION_PARAMS",
           "FiguresError", "cache_path"]
