"""The check_backend campaign: equivalent variants of random graphs and the model zoo's graphs through
Inductor and rewrite, each compared with eager (`rewrite.testing.check_backend`, issue 45).

    .venv/bin/python benchmarks/check_backends.py [--static 2000] [--batch 8] [--dynamic 300]
        [--zoo bert,gpt2,...|all] [--variants 3] [--examples 3] [--seed 0] [--no-record]

Three parts, each with its own backends (`rewrite.testing.targets`):

* static: random graphs (`rewrite.testing.graphs`: elementwise, scalar, shape, reduction, matmul ops over
  float32/float64/int64/int32/int8/bool, inputs seasoned with NaN, +-inf, -0.0 and extreme integers),
  ``--batch`` of them side by side per compile (`union_case`: a compile's fixed cost is most of it), through
  Inductor (default, ``dynamic=True``, freezing) and rewrite (default mode past tier-up, reduce-overhead with
  static kernels);
* dynamic: random programs with symbolic sizes (`rewrite.testing.dynamic.programs`), run at sizes 0, 1, 2,
  the traced ones and the largest, through Inductor (default, ``dynamic=True``) and rewrite (default, gears);
* zoo: the graphs Dynamo captures from the model zoo (tests/zoo, weights frozen into constants), through
  Inductor (default, freezing) and rewrite (default past tier-up, reduce-overhead with static kernels).

Every finding is shrunk and written as a script under benchmarks/out/check_backends/; each script is then run
in a fresh process to confirm it reproduces. Prints a table and writes the "check_backends" section of
benchmarks/RESULTS.md (``--no-record``: print only).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

STATIC_TARGETS = ("inductor", "inductor-dynamic", "inductor-freezing", "rewrite", "rewrite-reduce-overhead")
DYNAMIC_TARGETS = ("inductor", "inductor-dynamic", "rewrite", "rewrite-gears")
ZOO_TARGETS = ("inductor", "inductor-freezing", "rewrite", "rewrite-reduce-overhead")
DEFAULT_ZOO = ("bert", "gpt2", "llama", "t5", "vit", "resnet", "whisper_encoder")
OUT = os.path.join(HERE, "out", "check_backends")


def _zoo_cases(names):
    from rewrite.testing import capture_graphs
    from tests.zoo import ARCHS, BY_NAME, prepare_environment

    prepare_environment()
    archs = ARCHS if names == ["all"] else [BY_NAME[n] for n in names]
    for arch in archs:
        model = arch.model()
        inputs = arch.inputs(2, 0)
        keys = list(inputs)

        def fn(*args, _model=model, _keys=tuple(keys)):
            return _model(**dict(zip(_keys, args)))

        try:
            cases, notes = capture_graphs(fn, [inputs[k] for k in keys], name=arch.name)
        except Exception as e:  # noqa: BLE001 - a model Dynamo cannot capture is reported, not fatal
            print(f"zoo {arch.name}: capture failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
            continue
        for note in notes:
            print(f"zoo {note}", flush=True)
        yield from cases


def _verify(finding) -> str:
    """Run the finding's script in a fresh process: "reproduces", "does not reproduce" or the error."""
    if not finding.script_path:
        return "no script"
    env = {**os.environ, "PYTHONPATH": ROOT}
    try:
        done = subprocess.run([sys.executable, finding.script_path], capture_output=True, text=True, timeout=600,
                              env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return "timed out"
    if done.returncode == 1 and "REPRODUCED" in done.stdout:
        return "reproduces"
    if done.returncode == 0:
        return "does not reproduce"
    tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["?"]
    return f"script failed (exit {done.returncode}): {tail[0][:160]}"


def _part(name, cases, targets, args):
    from rewrite.testing import check_graphs

    t0 = time.perf_counter()
    last = [t0]

    def progress(case, report):
        now = time.perf_counter()
        if now - last[0] > 30:
            last[0] = now
            print(f"  {name}: {report.graphs} graphs ({report.cases} compiled), {report.variants} variants, "
                  f"{report.compiles} compiles, {len(report.findings)} findings, {now - t0:.0f} s", flush=True)

    report = check_graphs(cases, list(targets), variants=args.variants, examples=args.examples, seed=args.seed,
                          shrink_seconds=args.shrink_seconds, repro_dir=os.path.join(OUT, name), on_case=progress)
    report.seconds = time.perf_counter() - t0
    print(report, flush=True)
    return report


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--static", type=int, default=2000, help="random static graphs (default 2000)")
    p.add_argument("--batch", type=int, default=8, help="static graphs compiled together (default 8)")
    p.add_argument("--dynamic", type=int, default=300, help="random dynamic-shape programs (default 300)")
    p.add_argument("--zoo", default=",".join(DEFAULT_ZOO), help="zoo architectures (comma-separated, 'all', or '')")
    p.add_argument("--variants", type=int, default=3, help="extraction picks per graph (default 3; the original too)")
    p.add_argument("--examples", type=int, default=3, help="input draws per variant and backend (default 3)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--shrink-seconds", type=float, default=60.0)
    p.add_argument("--no-record", action="store_true", help="print only; leave RESULTS.md alone")
    args = p.parse_args(argv)

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import logging
    import tempfile

    import torch

    # Dynamo's recompile warnings (sizes 0 and 1 recompile by design here) would drown the progress lines.
    logging.getLogger("torch._dynamo").setLevel(logging.ERROR)
    # Cold compiler caches, as a user's first compile: rewrite's kernel cache and Inductor's caches in fresh folders.
    os.environ.setdefault("XDG_CACHE_HOME", tempfile.mkdtemp(prefix="check-backends-cache-"))
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", tempfile.mkdtemp(prefix="check-backends-inductor-"))
    torch.manual_seed(args.seed)
    from benchmarks._results import machine_line, markdown_table, record_section
    from rewrite.testing.backends import random_cases

    start = time.perf_counter()
    parts = []
    if args.static:
        cases = random_cases(args.static, batch=args.batch, seed=args.seed)
        parts.append(("static", STATIC_TARGETS, _part("static", cases, STATIC_TARGETS, args)))
    if args.dynamic:
        cases = random_cases(args.dynamic, dynamic=True, seed=args.seed)
        parts.append(("dynamic", DYNAMIC_TARGETS, _part("dynamic", cases, DYNAMIC_TARGETS, args)))
    zoo = [n for n in args.zoo.split(",") if n]
    if zoo:
        parts.append(("zoo", ZOO_TARGETS, _part("zoo", _zoo_cases(zoo), ZOO_TARGETS, args)))
    checking = time.perf_counter() - start

    rows, findings = [], []
    for name, targets, report in parts:
        for t in targets:
            stats = report.per_target.get(t, {"compiles": 0, "runs": 0, "findings": 0, "seconds": 0.0})
            rows.append([name, report.graphs, report.cases, report.variants, t, stats["compiles"], stats["runs"],
                         stats["findings"], f"{stats['seconds']:.0f}"])
        variant_findings = [f for f in report.findings if f.kind == "variant"]
        if variant_findings:
            rows.append([name, report.graphs, report.cases, report.variants, "eager (variant vs original)", "", "",
                         len(variant_findings), ""])
        for f in report.findings:
            findings.append((name, f, _verify(f)))
    wall = time.perf_counter() - start
    summary = {"wall_seconds": wall, "checking_seconds": checking, "parts": {name: {"graphs": r.graphs, "compiled": r.cases, "variants": r.variants,
                                                       "compiles": r.compiles, "runs": r.runs, "seconds": r.seconds,
                                                       "findings": len(r.findings)} for name, _, r in parts},
               "findings": [{"part": n, "target": f.target, "case": f.case, "variant": f.variant, "kind": f.kind,
                             "why": f.why.splitlines()[0], "script": f.script_path, "verified": v}
                            for n, f, v in findings]}
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "summary.json"), "w") as fh:
        json.dump(summary, fh, indent=1)

    command = "benchmarks/check_backends.py " + " ".join(argv if argv is not None else sys.argv[1:])
    lines = [
        "## Equivalent-graph testing of compilers (benchmarks/check_backends.py, issue 45)",
        "",
        f"`{command.strip()}` (`make check-backends` runs the full size); {machine_line()}. The machine was shared "
        f"with other jobs: the wall time ({wall / 60:.1f} min, {checking / 60:.1f} min checking and the rest running each "
        f"finding's script again) says how long this run took here, not how fast it can be.",
        "",
        "Each graph is saturated with rewrite's exact rules and up to 3 more graphs are extracted from the e-graph "
        "(cheapest, costliest, random; duplicates dropped), so each row's variants include the originals. Each variant "
        "is compiled by the backend and called on the example inputs, then on drawn ones (NaN, +-inf, -0.0, extreme "
        "integers; dynamic programs at sizes 0, 1, 2, the traced ones and the largest, gears at their edges), each "
        "call compared with eager on the same variant (per-dtype tolerance; a float difference counts only where the "
        "compiled value is farther from a float64 reference than twice eager's error). Static random graphs are "
        "compiled 8 side by side (graphs / compiled).",
        "",
        markdown_table(["part", "graphs", "compiled", "variants", "backend", "compiles", "calls compared", "findings",
                        "s"], rows),
    ]
    if findings:
        lines += ["", "Findings (each shrunk, its script run again in a fresh process):", ""]
        lines += [markdown_table(["part", "backend", "graph (variant)", "what differs", "script"],
                                 [[n, f.target, f"{f.case} ({f.variant})", f.why.splitlines()[0][:160].replace("|", "/"),
                                   v] for n, f, v in findings])]
    else:
        lines += ["", "No findings: every compiled variant agreed with eager."]
    text = "\n".join(lines)
    print()
    print(text)
    if not args.no_record:
        record_section("check_backends", text, force=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
