"""Dynamic-shape gears: a symbolic graph becomes one static graph per allowed shape."""
from __future__ import annotations

__all__ = ["set_dim_gears", "collect_gear_specs", "compile_dynamic"]


def set_dim_gears(tensor, dim_gears):
    raise NotImplementedError("set_dim_gears: gears are not built yet")


def collect_gear_specs(example_inputs, config):
    """The gears recorded on the example inputs by `set_dim_gears`, or None when there are none."""
    return None


def compile_dynamic(graph, gear_spec, config, report, build_static, graph_number):
    """Compile a graph with size symbols: per gear when gears exist, else run it symbolically."""
    return build_static(graph)
