"""`rewrite.inference`: inference-time options set on input tensors (TorchAir's spelling)."""
from .gears import set_dim_gears

__all__ = ["set_dim_gears"]
