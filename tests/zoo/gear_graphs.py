"""``python -m tests.zoo.gear_graphs [--only a,b]``: Dynamo graphs per geared model, first call at the smallest
and at the largest gear (issue 27). Gears [1, 2, 4] on dim 0 of every input, set on the first call; then a call at
every gear, each compared with eager. Prints a markdown table (architecture, family, graphs with the first call at
1, at 4, and whether every call matched eager), then, for each model with more than one graph, the backend's gear
report (`CompileReport.gear_graphs`: the guard that failed and the line of the model's code that raised it)."""
from __future__ import annotations

import argparse
import sys
import warnings

GEARS = (1, 2, 4)


def graphs_for(arch, first_batch: int) -> tuple[int, bool, list]:
    """(Dynamo graphs compiled, every call equal to eager, the backend's gear report lines) for ``arch`` with its
    first call at ``first_batch``."""
    import torch
    from torch._dynamo.utils import counters

    import rewrite

    from .runner import compare, geared_inputs

    torch._dynamo.reset()
    model = arch.model()
    backend = rewrite.get_backend()
    compiled = torch.compile(model, backend=backend)
    first = arch.inputs(first_batch, seed=200)
    for t in geared_inputs(first):
        rewrite.inference.set_dim_gears(t, dim_gears={0: list(GEARS)})
    counters.clear()
    ok = True
    try:
        with torch.no_grad():
            for inputs in [first] + [arch.inputs(b, seed=300 + b) for b in GEARS]:
                ok &= compare(compiled(**inputs), model(**inputs))[0]
    except Exception as e:  # noqa: BLE001 - reported in the table
        print(f"{arch.name} (first call {first_batch}): {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        ok = False
    finally:
        from rewrite.gears.spec import restore_size_oblivious

        restore_size_oblivious()
    return int(counters["stats"]["unique_graphs"]), ok, [str(g) for g in backend.report.gear_graphs if g.graphs > 1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.zoo.gear_graphs", description=__doc__)
    p.add_argument("--only", default="", help="comma-separated architecture names")
    args = p.parse_args(argv)
    from . import EVERY_ARCH
    from .runner import prepare_environment

    prepare_environment()
    warnings.filterwarnings("ignore")
    names = {n.strip() for n in args.only.split(",") if n.strip()}
    rows, why = [], []
    for arch in EVERY_ARCH:
        if names and arch.name not in names:
            continue
        (g1, ok1, why1), (g4, ok4, why4) = graphs_for(arch, GEARS[0]), graphs_for(arch, GEARS[-1])
        rows.append((arch.name, arch.family, g1, g4, ok1 and ok4))
        why += [(arch.name, first, line) for first, lines in ((GEARS[0], why1), (GEARS[-1], why4)) for line in lines]
        print(f"{arch.name}: {g1} {g4} {'equal' if ok1 and ok4 else 'MISMATCH'}", file=sys.stderr, flush=True)
    print(f"| architecture | family | graphs, first call at {GEARS[0]} | graphs, first call at {GEARS[-1]} | equal to eager |")
    print("| --- | --- | --- | --- | --- |")
    for name, family, g1, g4, ok in rows:
        print(f"| {name} | {family} | {g1} | {g4} | {'yes' if ok else 'NO'} |")
    one = sum(g1 == 1 and g4 == 1 for _, _, g1, g4, _ in rows)
    print(f"\n{one} of {len(rows)} architectures: one graph whatever the first call; "
          f"{sum(ok for *_, ok in rows)} equal to eager at every call")
    if why:
        print("\nWhy more than one graph (the gear report, `CompileReport.gear_graphs`):\n")
        for name, first, line in why:
            print(f"- {name}, first call at {first}: {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
