"""A compile unit: one graph AOTAutograd hands the backend, named once and carried through every stage.

Dynamo graph number N becomes one AOT graph for inference, or a forward and a backward graph for
training; the backend compiles each as a unit. The unit holds the graph's identity (number, kind,
name) and what each stage needs beside the graph itself (the config, the report), so the stages
after import (optimizer, gears, kernel backends, stream scheduler, graph dumps) take the unit
instead of reading that identity back out of a graph name. The graph keeps its own name: a gear's
static graph is named after its gear values, and dump files name both.

A graph built outside the backend (a loaded export, a graph built by hand in a test) belongs to a
detached unit: number 0, kind "inference".

The unit's execution policy (`rewrite.policy`) is resolved from its config and kind once, when the
unit is made: every stage after it reads the policy, none reads the mode from the config again.
"""
from __future__ import annotations

import dataclasses

from .config import CompilerConfig
from .ledger import Ledger
from .policy import ExecutionPolicy, resolve_policy
from .report import CompileReport, GraphReport

__all__ = ["CompileUnit", "Origin", "KINDS"]

KINDS = ("forward", "backward", "inference")


@dataclasses.dataclass(frozen=True)
class Origin:
    """What the user calls the code a graph was traced from: how recordings of the traffic
    (`rewrite.gears.recording`) name what they count."""

    function: str = ""  # "forward (model.py:12)"; "" unknown
    input_names: tuple = ()  # Dynamo's source name of each graph input (``L['x']``); () when they do not align
    dynamic: bool = False  # traced with ``dynamic=True``: a size-0/1 dim of an input was specialized, not static


@dataclasses.dataclass(frozen=True)
class CompileUnit:
    name: str  # "g{number}_{kind}" for the backend's units; the imported graph and its report carry it
    number: int  # the Dynamo graph's number: a forward and its backward share it; dump file names show it
    kind: str  # one of KINDS
    config: CompilerConfig
    report: GraphReport | None = None  # where stages count what they did and leave notes (None: a report of its own)
    # indices of graph inputs that stay in place across calls: the model's parameters and buffers, and tensors
    # marked with torch._dynamo.mark_static_address (a static KV cache); CUDA graphs read them where they are
    weights: tuple = ()
    origin: Origin | None = None  # the user's function and input names (None: a graph built outside the backend)
    # the slow-path counts of the compiled function the unit belongs to (rewrite.ledger): shared by its units
    ledger: Ledger | None = dataclasses.field(default=None, compare=False)
    policy: ExecutionPolicy = dataclasses.field(init=False, compare=False)  # how its graphs run, from config and kind

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"compile unit {self.name}: kind {self.kind!r} is not one of {KINDS}")
        object.__setattr__(self, "policy", resolve_policy(self.config, self.kind))  # frozen: set once, here
        if self.report is None:  # every stage reports to `report.note` / `report.count`, whoever made the unit
            object.__setattr__(self, "report", GraphReport(self.name))
        if self.ledger is None:
            object.__setattr__(self, "ledger", Ledger(self.config.strict))

    @classmethod
    def for_aot_graph(cls, number: int, kind: str, config: CompilerConfig, reports: CompileReport,
                      weights: tuple = (), origin: Origin | None = None,
                      ledger: Ledger | None = None) -> "CompileUnit":
        """The backend's unit for AOT graph ``kind`` of Dynamo graph ``number``, with a new report in ``reports``."""
        name = f"g{number}_{kind}"
        return cls(name, number, kind, config, reports.new_graph(name), tuple(weights), origin, ledger)

    @classmethod
    def detached(cls, name: str, config: CompilerConfig, report: GraphReport | None = None,
                 number: int = 0) -> "CompileUnit":
        """A unit for a graph built outside the backend."""
        return cls(name, number, "inference", config, report)
