"""``python -m tests.zoo [--only a,b] [--modes default,gears] [--family vision] [--device cuda] [-v]``: every
architecture in every mode, compared with eager; prints a table; exits 1 if any architecture fails (an XPASS
counts: the known defect is fixed and its marker must go). A failing architecture's details are printed as
soon as it fails, and again under the table. The timm and diffusers families are there where those libraries
import (``make zoo-vision``: ``--family timm,diffusers`` in ``.venv-torch2.14``)."""
from __future__ import annotations

import argparse
import sys
import time
import warnings

import torch

from .runner import prepare_environment


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.zoo", description=__doc__)
    p.add_argument("--only", default="", help="comma-separated architecture names")
    p.add_argument("--skip", default="", help="comma-separated architecture names to leave out")
    p.add_argument("--family", default="", help="comma-separated families (encoder, decoder, encoder-decoder, vision, "
                   "audio, multimodal, timm, diffusers)")
    p.add_argument("--modes", default="", help="comma-separated modes: default, reduce-overhead, gears")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where the models run (default cpu)")
    p.add_argument("--list", action="store_true", help="list the architectures and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="tracebacks of failing modes")
    args = p.parse_args(argv)
    prepare_environment()
    warnings.filterwarnings("ignore", category=UserWarning)  # Dynamo's notes on transformers code
    from . import BY_NAME, EVERY_ARCH, MODES, format_details, format_table, run_arch

    split = lambda s: [x.strip() for x in s.split(",") if x.strip()]  # noqa: E731
    archs = EVERY_ARCH
    if args.only:
        unknown = [n for n in split(args.only) if n not in BY_NAME]
        if unknown:
            p.error(f"unknown architectures {unknown}; known: {sorted(BY_NAME)}")
        archs = [BY_NAME[n] for n in split(args.only)]
    if args.family:
        # a family with no architecture here is an error, not an empty table that looks like a pass
        if missing := [f for f in split(args.family) if f not in {a.family for a in EVERY_ARCH}]:
            p.error(f"no architectures of families {missing} here; known: {sorted({a.family for a in EVERY_ARCH})} "
                    "(timm and diffusers need those libraries: make zoo-vision runs them in .venv-torch2.14)")
        archs = [a for a in archs if a.family in split(args.family)]
    archs = [a for a in archs if a.name not in split(args.skip)]
    modes = split(args.modes) or list(MODES)
    if bad := [m for m in modes if m not in MODES]:
        p.error(f"unknown modes {bad}; choose from {list(MODES)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("--device cuda: torch sees no CUDA device here")
    if args.list:
        for a in archs:
            print(f"{a.name:18s} {a.family}" + (f"  xfail {a.xfail}" if a.xfail else ""))
        return 0

    results, t0 = [], time.perf_counter()
    for i, arch in enumerate(archs, 1):
        res = run_arch(arch, modes, verbose=args.verbose, device=args.device)
        results.append(res)
        cells = "  ".join(f"{m} {r.status} {r.seconds:.1f}s" for m, r in res.modes.items())
        print(f"[{i}/{len(archs)}] {arch.name}: {cells} ({res.seconds:.1f}s)", file=sys.stderr, flush=True)
        if res.failed:  # at once, not only in the summary: a run stopped at a time limit keeps the why
            print(format_details([res]), file=sys.stderr, flush=True)
    print(format_table(results, modes))
    failed = [r.arch.name for r in results if r.failed]
    xfailed = [r.arch.name for r in results if any(m.status == "XFAIL" for m in r.modes.values())]
    print(f"\n{len(results)} architectures, {len(results) - len(failed)} passed, {len(failed)} failed "
          f"{failed if failed else ''}, {len(xfailed)} with known defects {xfailed if xfailed else ''}; "
          f"{time.perf_counter() - t0:.0f} s")
    details = format_details(results)
    if details:
        print("\n" + details)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
