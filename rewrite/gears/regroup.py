"""``inference_config.padded_tokens = "skip"``: a request's rows run in groups of similar own length, each group cut
to its longest row, so the positions the attention mask marks as padding are not computed.

A tokenizer pads a request of ``b`` sentences to its longest (``padding=True``). With lengths log-normal, the rows'
own tokens are 0.41 (sentence embeddings) and 0.59 (a decoder's prefill) of the padded request's
(benchmarks/token_padding.py). Gears pad further, to the next gear. Grouping the rows by their own length, each group
run at the gear that fits its longest row, computes little more than the real tokens.

When it is sound, proven on the graph (`rewrite.gears.padding`), never guessed:

* the sequence axis pads: positions added at the end never reach a real position, and the proof needs only one
  input's zeros there, whatever the others hold (`_SymbolPlan.masks`: the attention mask; a proof that needs no
  input's zeros, as ``is_causal`` alone, names no mask and nothing is skipped);
* the batch axis splits: rows are independent, so a subset of the rows runs alone with the same results.

A row whose mask is zero from position ``l`` on is then, at its first ``l`` positions, what the model computes
for it at sequence length ``l``: a group of rows cut to its longest own length gives each of them its real outputs.

**What differs from eager**: outputs at the positions skipped (a row's trailing mask zeros) hold 0, where eager
holds what the model computes for a padding token there. Every output at a real position, and every output
without the sequence dim (a pooled embedding), is eager's. Hence opt-in.

How groups are chosen: the rows sorted by own length, a dynamic programme cuts them into runs; a run of ``r``
rows whose longest is ``l`` costs the predicted seconds of serving ``(r, l)`` with the gears (padded to the
cheapest gear that holds it, or split along the batch under ``gear_fallback="fit"``), from the gears' measured
latency (`rewrite.gears.fit`). A call whose best plan is itself, uncut, runs as it is.
"""
from __future__ import annotations

import bisect
import dataclasses
import math

import torch

from ..ir import SymMeta
from .fit import plan_fit
from .padding import INDEP, Row, size_output, tied_positions

__all__ = ["Regrouper", "Run", "plan_regroup", "group_shapes", "CALL_TOKENS"]

CALL_TOKENS = 256  # a call's fixed cost (dispatch, gather and scatter), in tokens' work: MiniLM-sized on a CPU


@dataclasses.dataclass(frozen=True)
class Run:
    """One gear call of a regrouped call: its rows (indices into the call's; None: all of them, in order), cut to
    ``length``, run at ``gear`` (the gear's key: padded up to it where larger); ``split``: its group of rows runs as
    several such calls."""

    rows: list | None
    length: int
    gear: tuple
    split: bool = False


@dataclasses.dataclass(frozen=True)
class _Choice:
    """The cheapest way to serve (rows, length) with the gears: ``parts`` (rows, batch gear) at the sequence gear
    ``length``, predicted to take ``seconds``."""

    seconds: float
    length: int = 0
    parts: tuple = ()


_NONE = _Choice(math.inf)  # no gear holds the size


@dataclasses.dataclass(frozen=True)
class _Output:
    """Where one output keeps the batch rows and the sequence (None: not along it), or its value from the sizes."""

    batch_dim: int | None = None
    seq_dim: int | None = None
    size: object = None  # a SymMeta output: its expression in the gear symbols


def plan_regroup(padder, symbols: list, gears: list, fallback: str):
    """A `Regrouper` for a geared graph, or (None, why not)."""
    if fallback not in ("pad", "fit"):
        return None, f"the groups run at sizes between gears, which gear_fallback={fallback!r} does not serve " \
                     "(use 'pad' or 'fit')"
    if padder is None:
        return None, "no gear axis may be padded"
    axes = tied_positions(gears, len(symbols))
    seqs = [a for a in axes if all(padder.can_pad(p) and padder.plans[p].masks for p in a)]
    if not seqs:
        return None, "no gear axis is proven paddable by an attention mask's zeros alone"
    seq = seqs[0]
    masks = sorted({m for p in seq for m in padder.plans[p].masks})
    batches = [a for a in axes if a is not seq and all(padder.can_split(p) for p in a)
               and {i for i, _ in masks} <= {i for p in a for i, _ in padder.plans[p].inputs}]
    if not batches:
        return None, "no gear axis keeps the attention mask's rows independent (the batch must split)"
    batch = batches[0]
    outputs = []
    for j, (states, meta) in enumerate(zip(padder.output_states, padder.output_metas)):
        if isinstance(meta, SymMeta):
            outputs.append(_Output(size=meta))
            continue
        where = []
        for axis in (batch, seq):
            found = {states.get(p, INDEP) for p in axis}
            plain = {st for st in found if isinstance(st, Row) and st.k == 1 and st.outer == 1}
            if found == {INDEP}:
                where.append(None)
            elif len(found) == 1 and plain:
                where.append(next(iter(plain)).dim)
            else:
                return None, f"output {j} keeps a gear axis's rows in a way the groups cannot be joined ({found})"
        if where[0] is None and where[1] is not None:
            return None, f"output {j} has the sequence but not the batch"
        outputs.append(_Output(*where))
    return Regrouper(padder, symbols, batch, seq, masks, outputs), None


class Regrouper:
    """Serves a call as groups of rows cut to their own length (see the module's docstring)."""

    def __init__(self, padder, symbols: list, batch: list, seq: list, masks: list, outputs: list):
        self.symbols = symbols
        self.batch, self.seq = batch, seq  # key positions of the two axes
        self.masks = masks  # (input index, sequence dim): the attention mask(s)
        self.batch_inputs = sorted({x for p in batch for x in padder.plans[p].inputs})
        self.seq_inputs = sorted({x for p in seq for x in padder.plans[p].inputs})
        self.batch_scalars = sorted({i for p in batch for i in padder.plans[p].scalars})
        self.seq_scalars = sorted({i for p in seq for i in padder.plans[p].scalars})
        self.outputs = outputs
        self.batch_dim_of = {i: d for i, d in self.batch_inputs}
        # (version of the measurements, each gear's predicted seconds, {other key values: (sequence gears, {sequence
        # gear: {batch gear: seconds}})}, {(rows, sequence gear, other key values): predicted seconds}); one tuple, so a
        # thread reads one consistent cache
        self._cache = (None, {}, {}, {})

    def lengths(self, args, b: int, n: int) -> list[int]:
        """Each row's own length: one past its last position where a mask is non-zero (at least 1)."""
        own = None
        for i, d in self.masks:
            x = args[i].movedim((self.batch_dim_of[i], d), (0, 1)).reshape(b, n, -1).ne(0).any(-1)
            last = (x * torch.arange(1, n + 1, device=x.device)).amax(1)
            own = last if own is None else torch.maximum(own, last)
        return own.clamp(min=1).tolist()

    def plan(self, lengths: list[int], key: tuple, cost) -> list | None:
        """The `Run`s a call is served as, or None when no plan serves it (a size past every gear). ``cost(rows,
        length)``: the cheapest `_Choice` for serving that size with the gears."""
        groups, seconds = _cheapest_groups(lengths, lambda rows, length: cost(rows, length).seconds)
        if math.isinf(seconds):
            return None
        b = len(lengths)
        runs = []
        for rows, length in groups:
            choice = cost(len(rows), length)
            at = 0
            for part, batch_gear in choice.parts:
                gear = tuple(batch_gear if p in self.batch else choice.length if p in self.seq else v
                             for p, v in enumerate(key))
                chosen = rows[at: at + part]
                runs.append(Run(None if len(chosen) == b else chosen, length, gear, len(choice.parts) > 1))
                at += part
        return runs

    def serve(self, args, key: tuple, runs: list, run_at):
        """Serve ``runs`` (from `plan`), each with ``run_at(its key, its gear, its inputs)``; each output's rows
        joined in one buffer."""
        b, n = key[self.batch[0]], key[self.seq[0]]
        outs = None
        for run in runs:
            part = list(args)
            idx = None
            if run.rows is not None:
                idx = torch.tensor(run.rows, device=args[self.masks[0][0]].device)
                for i, d in self.batch_inputs:
                    part[i] = part[i].index_select(d, idx)
            if run.length != n:
                for i, d in self.seq_inputs:
                    # contiguous, as a padded input (torch.cat) is: a gear's code may view its input as it was traced
                    part[i] = part[i].narrow(d, 0, run.length).contiguous()
                for i in self.seq_scalars:
                    part[i] = run.length
            rows = b if run.rows is None else len(run.rows)
            for i in self.batch_scalars:
                part[i] = rows
            part_key = tuple(rows if p in self.batch else run.length if p in self.seq else v
                             for p, v in enumerate(key))
            got = run_at(part_key, run.gear, part)
            if part_key == key:
                return got  # the call as it is, in one run
            if outs is None:
                outs = [self._buffer(o, x, b, n) for o, x in zip(self.outputs, got)]
            for o, buf, x in zip(self.outputs, outs, got):
                if o.batch_dim is not None:
                    rows_of = buf.narrow(o.seq_dim, 0, run.length) if o.seq_dim is not None else buf
                    if idx is None:
                        rows_of.copy_(x)
                    else:
                        rows_of.index_copy_(o.batch_dim, idx, x)
        real = {s.symbol: v for s, v in zip(self.symbols, key)}
        for j, o in enumerate(self.outputs):
            if o.size is not None:
                outs[j] = size_output(o.size, real)
        return tuple(outs)

    @staticmethod
    def _buffer(o: _Output, x, b: int, n: int):
        """The whole call's buffer for an output (zeros where positions are skipped); the first group's value
        for one that holds neither axis."""
        if o.batch_dim is None:
            return x
        shape = list(x.shape)
        shape[o.batch_dim] = b
        if o.seq_dim is not None:
            shape[o.seq_dim] = n
        return x.new_zeros(shape)

    def costs(self, key: tuple, version, seconds, fit: bool) -> callable:
        """``cost(rows, length)`` for calls like ``key`` (its other sizes): the cheapest `_Choice`, a sequence gear
        that holds the length and the batch gears its rows run as, padded (or, with ``fit``, split), from each
        gear's predicted seconds (``seconds()``, asked for only when ``version``, the measurements', changed);
        cached until then."""
        cached_version, per_gear, tables, memo = self._cache
        if cached_version != version:
            per_gear, tables, memo = seconds(), {}, {}
            self._cache = (version, per_gear, tables, memo)
        rest = tuple(v for p, v in enumerate(key) if p not in self.batch and p not in self.seq)
        if rest not in tables:
            at = {}  # sequence gear -> {batch gear: seconds}, the gears that hold the call's other sizes
            for g, t in per_gear.items():
                if tuple(v for p, v in enumerate(g) if p not in self.batch and p not in self.seq) == rest:
                    at.setdefault(g[self.seq[0]], {})[g[self.batch[0]]] = t
            tables[rest] = (sorted(at), at)
        lengths, at = tables[rest]

        def cost(rows: int, length: int) -> _Choice:
            k = bisect.bisect_left(lengths, length)
            if k == len(lengths):
                return _NONE
            ck = (rows, lengths[k], rest)
            if ck not in memo:
                memo[ck] = min((_rows_choice(rows, s, at[s], fit) for s in lengths[k:]), key=lambda c: c.seconds)
            return memo[ck]
        return cost


def _cheapest_groups(lengths: list[int], cost) -> tuple[list, float]:
    """The rows cut into groups of consecutive own lengths with the least total ``cost(rows, longest)``: a dynamic
    programme over the rows sorted by length. ([(row indices, longest own length)], its cost)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    ls = [lengths[i] for i in order]
    best = [(0.0, 0)] + [None] * len(ls)  # rows done -> (cost, where the last group starts)
    for j in range(1, len(ls) + 1):
        best[j] = min((best[i][0] + cost(j - i, ls[j - 1]), i) for i in range(j))
    cuts, j = [], len(ls)
    while j:
        cuts.append((best[j][1], j))
        j = best[j][1]
    return [(order[i:j], ls[j - 1]) for i, j in reversed(cuts)], best[-1][0]


def group_shapes(requests, call_tokens: int = CALL_TOKENS) -> list[tuple[int, int]]:
    """The (rows, length) calls that requests run as under ``padded_tokens="skip"``, before any gear rounds them: each
    request (the list of its rows' own lengths) cut into the groups that cost least when a call costs its rows x
    length plus ``call_tokens``. Plan gears on these (`plan_gear_pairs`) rather than on the padded requests' shapes."""
    shapes = []
    for lengths in requests:
        if not lengths or min(lengths) < 1:
            raise ValueError(f"a request is a non-empty list of its rows' own lengths (each >= 1), got {lengths!r}")
        groups, _ = _cheapest_groups(list(lengths), lambda rows, length: rows * length + call_tokens)
        shapes += [(len(rows), length) for rows, length in groups]
    return shapes


def _rows_choice(rows: int, length: int, sizes: dict, fit: bool) -> _Choice:
    """Serving ``rows`` at sequence gear ``length`` with its batch gears ``sizes`` ({rows: seconds}): the smallest
    that holds them, or (``fit``) the cheapest split."""
    if fit:
        plan = plan_fit(rows, list(sizes), sizes)
        return _Choice(plan.seconds, length, plan.parts) if plan is not None else _NONE
    fits = [(t, g) for g, t in sizes.items() if g >= rows]
    if not fits:
        return _NONE
    t, g = min(fits)
    return _Choice(t, length, ((rows, g),))
