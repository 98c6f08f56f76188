"""How much padding static gears cost on the token traces, without running a model (issue 50).

    python benchmarks/token_padding.py [--requests 160 800] [--budgets 16 24 32]

For each token trace of `gears_tokens` (sentences, prefill) and each gear budget: gear pairs are planned by
``rewrite.gears.plan_gear_pairs`` on the first half of the trace (plus the pair that holds the largest request, as
the traffic benchmark serves them) and the second half is served by them; printed: the padding the plan predicted on
the recorded half, the padding of the served half (each request padded to the cheapest pair at or above it in both
dims: ``gear_fallback="pad"``), and the same where a request may also be split along its batch into runs of pairs
of its length or longer (the best split, by elements plus a fixed cost of 32 tokens per call, ``"fit"``'s choice).
Last, the share of a request's tokens that are its rows' own (the rest is the tokenizer's padding to its longest
row): what serving each row at its own length could save. Padding here is elements (batch x length), not time.
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from gears_tokens import TOKEN_TRACES, shape, token_trace  # noqa: E402

CALL_TOKENS = 32  # a call's fixed cost, in tokens of work (fit's splits pay it per part)


def _served_padding(pairs: list, requests: list, split: bool) -> float:
    real = run = 0
    for b, s in requests:
        if split:
            best = [0] + [None] * b  # best[m]: least work for the first m rows
            for m in range(1, b + 1):
                options = [best[max(m - pb, 0)] + pb * ps + CALL_TOKENS for pb, ps in pairs
                           if ps >= s and best[max(m - pb, 0)] is not None]
                best[m] = min(options) if options else None
            cost = best[b]
        else:
            cost = min(pb * ps for pb, ps in pairs if pb >= b and ps >= s) + CALL_TOKENS
        real += b * s + CALL_TOKENS
        run += cost
    return 1 - real / run


def main() -> None:
    from rewrite.gears import plan_gear_pairs

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[160, 800])
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 24, 32])
    opts = parser.parse_args()
    print("| trace | requests | pairs | predicted padding (recorded half) | served padding | served, with splits |")
    print("| --- | --- | --- | --- | --- | --- |")
    for trace in TOKEN_TRACES:
        for n in opts.requests:
            requests = token_trace(trace, n)
            recorded = [shape(r) for r in requests[: n // 2]]
            served = [shape(r) for r in requests[n // 2:]]
            top = (max(b for b, _ in recorded + served), max(s for _, s in recorded + served))
            for budget in opts.budgets:
                plan = plan_gear_pairs(recorded, max_gears=budget)
                pairs = sorted(set(plan.pairs) | {top})
                print(f"| {trace} | {n} | {budget} | {plan.expected_waste:.1%} | "
                      f"{_served_padding(pairs, served, False):.1%} | {_served_padding(pairs, served, True):.1%} |")
    for trace in TOKEN_TRACES:
        requests = token_trace(trace, max(opts.requests))
        padded = sum(len(r) * max(r) for r in requests)
        own = sum(sum(r) for r in requests)
        print(f"{trace}: the rows' own tokens are {own / padded:.2f} of the tokens of the requests as padded")


if __name__ == "__main__":
    main()
