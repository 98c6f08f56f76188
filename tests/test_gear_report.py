"""How many Dynamo graphs serve a geared function's gears, and why (issue 27's report).

`rewrite.explain` and the backend's `CompileReport.gear_graphs` count the Dynamo graphs per geared
function; a second graph names the guard that failed and the source line of the model's own code
that raised it; the `rewrite` logger says the same at INFO when that graph is compiled."""
from __future__ import annotations

import inspect
import logging

import pytest
import torch
from torch._dynamo.utils import counters

import rewrite
from rewrite.gears import set_dim_gears
from rewrite.gears.graphs import parse_reason
from rewrite.report import GearGraphs

GEARS = [1, 2, 4]
HERE = __file__.rsplit("/", 1)[-1]


class MLP(torch.nn.Module):
    """No Python branch on the batch: one Dynamo graph serves every gear."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 16)
        self.b = torch.nn.Linear(16, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


class BranchOnOne(torch.nn.Module):
    """The model's own code does something else for a batch of one: two Dynamo graphs."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a = torch.nn.Linear(8, 4)

    def forward(self, x):
        h = self.a(x)
        if x.shape[0] == 1:
            return torch.tanh(h) * 3
        return torch.relu(h) - h.mean(0)


IF_LINE = next(f"{HERE}:{inspect.getsourcelines(BranchOnOne.forward)[1] + k}"
               for k, line in enumerate(inspect.getsourcelines(BranchOnOne.forward)[0])
               if line.strip() == "if x.shape[0] == 1:")


def _inputs(first: int):
    """A call's input of each gear, the first call's (marked with the gears) first."""
    g = torch.Generator().manual_seed(first)
    x = torch.randn(first, 8, generator=g)
    set_dim_gears(x, {0: GEARS})
    return [x] + [torch.randn(b, 8, generator=g) for b in GEARS if b != first]


def _run_every_gear(model, first: int):
    backend = rewrite.get_backend()
    fn = torch.compile(model, backend=backend)
    counters.clear()
    with torch.no_grad():
        for x in _inputs(first) + [torch.randn(b, 8) for b in GEARS]:  # every gear, then every gear again
            torch.testing.assert_close(fn(x), model(x))
    return backend.report


@pytest.mark.parametrize("first", [1, 4])
def test_a_model_without_size_branches_is_served_by_one_graph(first, caplog):
    model = MLP().eval()
    with caplog.at_level(logging.INFO, logger="rewrite"):
        report = _run_every_gear(model, first)
    assert counters["stats"]["unique_graphs"] == 1
    assert report.gear_graphs == [GearGraphs("forward", f"{HERE}:{inspect.getsourcelines(MLP.forward)[1]}", GEARS,
                                             graphs=1, retraces=[])]
    assert "Dynamo graphs serve" not in caplog.text  # logged only when a second graph is compiled


@pytest.mark.parametrize("first", [1, 4])
def test_a_branch_on_the_batch_gets_two_graphs_and_the_report_names_the_guard_and_the_if(first, caplog):
    model = BranchOnOne().eval()
    with caplog.at_level(logging.INFO, logger="rewrite"):
        report = _run_every_gear(model, first)
    assert counters["stats"]["unique_graphs"] == 2
    (fn,) = report.gear_graphs
    assert (fn.function, fn.gears, fn.graphs) == ("forward", GEARS, 2)
    (why,) = fn.retraces
    # Traced first at the largest gear the graph assumes the batch is not 1, and a call at 1 fails that;
    # a first call at 1 is traced at its own size (the model's code branches there): batch 2 fails it.
    expected_guard = "x.size()[0] != 1" if first == 4 else "x.size()[0] == 1"
    assert (why.graph, why.guard, why.where, why.source) == (2, expected_guard, IF_LINE, "if x.shape[0] == 1:")
    line = (f"gears: forward: 2 Dynamo graphs serve gears [1, 2, 4]; graph 2 was traced because guard "
            f"`{expected_guard}` failed (from {IF_LINE} `if x.shape[0] == 1:`)")
    assert str(fn) == line
    logged = [r.getMessage() for r in caplog.records if r.name == "rewrite" and r.levelno == logging.INFO
              and "Dynamo graphs serve" in r.getMessage()]
    assert logged == [line]  # once, when graph 2 was compiled
    # The first graph's log already says which gears it leaves out and the line that forces it.
    left_out = [r.getMessage() for r in caplog.records if "cannot use graph" in r.getMessage()]
    assert left_out and all(f"(from {IF_LINE} `if x.shape[0] == 1:`)" in m or "outside the traced range" in m
                            for m in left_out)
    assert any(IF_LINE in m for m in left_out)


@pytest.mark.parametrize("first", [1, 4])
def test_explain_counts_the_graphs_every_gear_needs(first):
    # explain calls the other gears itself (without fullgraph: a first call at 1 restarts Dynamo's
    # trace at its own size, down the other side of the model's if).
    model = BranchOnOne().eval()
    x = _inputs(first)[0]
    with torch.no_grad():
        report = rewrite.explain(model, x)
        want = model(x)
    torch.testing.assert_close(report.result, want)
    (fn,) = report.gear_graphs
    assert fn.graphs == 2 and fn.retraces[0].source == "if x.shape[0] == 1:" and fn.retraces[0].where == IF_LINE
    assert str(fn) in str(report).splitlines()
    assert not report.notes

    torch._dynamo.reset()
    mlp = MLP().eval()
    x = _inputs(first)[0]
    with torch.no_grad():
        report = rewrite.explain(mlp, x)
        want = mlp(x)
    torch.testing.assert_close(report.result, want)
    assert [(g.function, g.graphs) for g in report.gear_graphs] == [("forward", 1)]
    assert "gears: forward: 1 Dynamo graph serves gears [1, 2, 4]" in str(report).splitlines()


def test_bert_is_served_by_one_graph_and_wrapped_forwards_are_named_by_their_class():
    bert = rewrite.models.bert().eval()
    ids = rewrite.models.token_batch(1, 8)
    set_dim_gears(ids, {0: GEARS})
    with torch.no_grad():
        report = rewrite.explain(bert, ids, config=rewrite.CompilerConfig())
        torch.testing.assert_close(report.result.last_hidden_state, bert(ids).last_hidden_state)
    # Dynamo enters transformers' forward through its decorator's wrapper: named by the method it wraps
    assert [(g.function, g.gears, g.graphs) for g in report.gear_graphs] == [("BertModel.forward", GEARS, 1)]
    assert report.gear_graphs[0].where.startswith("modeling_bert.py:")

    torch._dynamo.reset()
    seq = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.ReLU()).eval()
    x = _inputs(2)[0]
    with torch.no_grad():
        report = rewrite.explain(seq, x)
        torch.testing.assert_close(report.result, seq(x))
    (fn,) = report.gear_graphs
    assert (fn.function, fn.graphs) == ("Sequential.forward", 1) and fn.where.startswith("container.py:")


def test_without_dynamo_s_recorded_reasons_the_graph_is_still_counted(monkeypatch):
    # A torch without torch._dynamo.guard_failures: the reason is unknown, nothing fails.
    monkeypatch.delattr(torch._dynamo, "guard_failures")
    report = _run_every_gear(BranchOnOne().eval(), 4)
    (fn,) = report.gear_graphs
    assert fn.graphs == 2 and fn.retraces[0].guard is None and fn.retraces[0].text == "reason unknown"
    assert "graph 2 was traced for a reason Dynamo did not record (reason unknown)" in str(fn)


def test_reasons_that_name_no_source_line():
    tensor_match = parse_reason("0/0: tensor 'x' size mismatch at index 0. expected 4, actual 1", 3)
    assert (tensor_match.guard, tensor_match.where, tensor_match.source) == (
        "tensor 'x' size mismatch at index 0. expected 4, actual 1", None, None)
    assert str(tensor_match) == "graph 3 was traced because guard `tensor 'x' size mismatch at index 0. expected 4, " \
                                "actual 1` failed"
    shape = parse_reason("[1/0]: 2 <= x.size()[0]  # y = x[1]  # models/net.py:7 in forward (_refs/x.py:3 in f)\n"
                         "User stack trace:\n  ...", 2)
    assert (shape.guard, shape.where, shape.source) == ("2 <= x.size()[0]", "net.py:7", "y = x[1]")
    assert parse_reason("", 2).text == "reason unknown"
    # torch recorded only its own line (vit_mae's copy_ meta kernel): said so, not passed off as the model's
    in_torch = parse_reason("0/0: x.size()[0] == 1  # (_meta_registrations.py:681 in meta_copy_)", 2)
    assert (in_torch.guard, in_torch.where, in_torch.source, in_torch.in_torch) == (
        "x.size()[0] == 1", "_meta_registrations.py:681", None, True)
    assert str(in_torch) == ("graph 2 was traced because guard `x.size()[0] == 1` failed (raised inside torch at "
                             "_meta_registrations.py:681; torch recorded no line of the model's code)")
