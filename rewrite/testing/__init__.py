"""Property-based checking for rules and passes: for now all in `strategies`, to be split by job."""
from . import strategies as _module
from .strategies import *  # noqa: F401,F403
from .strategies import (  # noqa: F401 - public names outside __all__ that callers use
    GRAPH_DTYPES, MAX_DIM, MAX_RANK, SCALAR_CANDIDATES, OpGen, permutations_of, reshapes, shape_of, shapes, tolerance,
)

__all__ = _module.__all__
