"""`rewrite.inference`: inference-time options set on input tensors (TorchAir's spelling).

``set_dim_gears(tensor, dim_gears={dim: [sizes...]})`` declares the sizes a dimension may take;
the graph is then compiled once per gear (see `rewrite.gears`).
"""
from .gears import GearError, get_dim_gears, set_dim_gears

__all__ = ["set_dim_gears", "get_dim_gears", "GearError"]
