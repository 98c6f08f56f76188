"""rewrite.testing needs hypothesis (the test extra). The package face imports this module first, so a missing
hypothesis is an error naming the extra that installs it, not a bare ModuleNotFoundError from whichever
submodule imports it first."""
from __future__ import annotations

from ..extras import require

require("hypothesis", "rewrite.testing")
