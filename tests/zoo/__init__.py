"""The model zoo: tiny architectures (random weights, no download) through every mode of the `rewrite` backend,
each compared with eager on every output tensor. ``ARCHS`` are `transformers` models (tests/zoo/archs.py);
``VISION_ARCHS`` are `timm` and `diffusers` models (tests/zoo/vision_archs.py), present only where those libraries
import (``.venv-torch2.14``: timm needs torchvision, which pairs with torch 2.14.1 here).

One home for the zoo: ``python -m tests.zoo`` (``make zoo``) runs every architecture that imports and prints a table;
``make zoo-vision`` runs the timm and diffusers families in ``.venv-torch2.14``. ``tests/test_zoo.py`` and
``tests/test_zoo_vision.py`` run subsets in CI through the same `run_arch`.
"""
from .archs import ARCHS, Arch
from .runner import MODES, ArchResult, ModeResult, compare, flatten, format_details, format_table, prepare_environment, run_arch
from .vision_archs import VISION_ARCHS

EVERY_ARCH = ARCHS + VISION_ARCHS
BY_NAME = {a.name: a for a in EVERY_ARCH}
assert len(BY_NAME) == len(EVERY_ARCH), "duplicate architecture names"

__all__ = ["ARCHS", "BY_NAME", "EVERY_ARCH", "VISION_ARCHS", "Arch", "MODES", "ArchResult", "ModeResult", "compare",
           "flatten", "format_details", "format_table", "prepare_environment", "run_arch"]
