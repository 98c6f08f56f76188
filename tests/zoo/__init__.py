"""The model zoo: tiny `transformers` architectures (random weights, no download) through every mode of the
`rewrite` backend, each compared with eager on every output tensor.

One home for the zoo: ``python -m tests.zoo`` (``make zoo``) runs it all and prints a table;
``tests/test_zoo.py`` runs a subset in CI through the same `run_arch`.
"""
from .archs import ARCHS, BY_NAME, Arch
from .runner import MODES, ArchResult, ModeResult, compare, flatten, format_details, format_table, prepare_environment, run_arch

__all__ = ["ARCHS", "BY_NAME", "Arch", "MODES", "ArchResult", "ModeResult", "compare", "flatten", "format_details",
           "format_table", "prepare_environment", "run_arch"]
