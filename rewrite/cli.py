"""`python -m rewrite ...`: the demo, the rule catalogue and the rule checker.

    python -m rewrite demo                 compile MiniLM with batch gears; print what happened and timings
    python -m rewrite rules                print the optimization schedule: passes, rulesets, rules
    python -m rewrite check-rules MODULE   check every rule of a user's ruleset module numerically
    python -m rewrite check-pass MOD:FN    check a torch.fx pass on random graphs (rewrite.testing.check_fx_pass)
    python -m rewrite check-backend MOD:FN --shapes 4,8 --backend inductor
                                           check a compiler on equivalent variants of a function's graphs
                                           (rewrite.testing.check_backend); --random N: on random graphs
    python -m rewrite cache ls|info KEY|clear [--dir D]   the compile cache's entries and their key fields
"""
from __future__ import annotations

import argparse
import atexit
import logging
import os
import sys
import tempfile


def _rules(_args) -> int:
    from .optimizer import describe_schedule

    print(describe_schedule())
    return 0


def _check_rules(args) -> int:
    from .testing import check_ruleset_module

    try:
        report = check_ruleset_module(args.module)
    except ValueError as e:  # bad module name or no rulesets in it: say so, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report)
    return 0 if getattr(report, "ok", True) else 1


def _check_pass(args) -> int:
    import torch

    from .testing import check_fx_pass, load_pass

    try:
        pass_fn = load_pass(args.spec)
        dtypes = [getattr(torch, name, None) for name in args.dtypes or ()] or None
        if dtypes and not all(isinstance(d, torch.dtype) for d in dtypes):
            raise ValueError(f"--dtypes {' '.join(args.dtypes)}: name torch dtypes such as float32 int64 bool")
        report = check_fx_pass(pass_fn, examples=args.examples, dynamic=args.dynamic, dtypes=dtypes, ops=args.ops,
                               takes=args.takes, tolerance=args.tolerance and tuple(args.tolerance))
    except ValueError as e:  # a bad name or option: say so, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    except AssertionError as e:  # a counterexample: print it
        print(e)
        return 1
    print(report)
    return 0


def _parse_shape(text: str):
    """``4,8`` (float32), ``4,8:int64``, ``:float64`` (a 0-d tensor) -> (shape, dtype)."""
    import torch

    dims, _, dtype_name = text.partition(":")
    dtype = getattr(torch, dtype_name or "float32", None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"--shapes {text!r}: {dtype_name!r} is no torch dtype (float32, int64, bool...)")
    try:
        shape = [int(d) for d in dims.replace("x", ",").split(",") if d.strip()]
    except ValueError:
        raise ValueError(f"--shapes {text!r}: sizes must be integers, e.g. 4,8 or 4,8:int64") from None
    return shape, dtype


def _check_backend(args) -> int:
    import torch

    from .testing import BackendMismatch, check_backend, check_graphs, load_pass
    from .testing.backends import random_cases

    tolerance = None if args.exact else (tuple(args.tolerance) if args.tolerance else "dtype")
    backends = args.backend or ["inductor"]
    common = dict(variants=args.variants, rules=args.rules, examples=args.examples, tolerance=tolerance,
                  seed=args.seed, repro_dir=args.repro_dir, shrink_seconds=args.shrink_seconds)
    try:
        if args.random:
            cases = random_cases(args.random, dynamic=args.dynamic, batch=args.batch, seed=args.seed or 0)
            report = check_graphs(cases, backends, **common)
        else:
            if not args.spec:
                raise ValueError("name the function to check (module:function), or --random N for random graphs")
            fn = load_pass(args.spec)
            if isinstance(fn, type) and issubclass(fn, torch.nn.Module):
                fn = fn().eval()
            if args.inputs:
                inputs = tuple(load_pass(args.inputs)())
            elif args.shapes:
                gen = torch.Generator().manual_seed(args.seed or 0)
                inputs = []
                for text in args.shapes:
                    shape, dtype = _parse_shape(text)
                    if dtype.is_floating_point:
                        inputs.append(torch.randn(shape, generator=gen).to(dtype))
                    else:
                        inputs.append(torch.randint(0, 2 if dtype == torch.bool else 16, shape, generator=gen).to(dtype))
            else:
                raise ValueError("give the inputs: --shapes 4,8 [4,8:int64 ...] or --inputs module:function")
            report = check_backend(fn, *inputs, backend=backends, dynamic=args.dynamic, raise_on_failure=False,
                                   **common)
    except BackendMismatch as e:
        print(e)
        return 1
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(report)
    return 0 if report.ok else 1


def _calibrate(args) -> int:
    from .cost import calibrate, current

    if args.show:
        print(current().describe())
        return 0
    cal, path = calibrate(quick=args.quick)
    print(cal.describe())
    print(f"saved to {path}" if path else "not saved (the cache folder is not writable)")
    return 0


def _cache(args) -> int:
    import json
    import os

    from .cache import store

    shown = store.printable(args.dir)
    if not os.path.isdir(args.dir):
        print(f"no cache folder {shown}")
        return 0 if args.action != "info" else 2
    if args.action == "ls":  # labels and paths come from files: control characters are escaped
        print(store.describe_entries(args.dir))
    elif args.action == "clear":  # only entries (and scratch folders) this user's rewrite signed
        print(f"removed {store.clear(args.dir)} entries from {shown}")
    else:
        if not args.key:
            print("error: python -m rewrite cache info KEY (an entry's path or hash prefix, as `cache ls` prints)",
                  file=sys.stderr)
            return 2
        found = store.find(args.dir, args.key)
        if not found:
            print(f"error: no entry {args.key!r} in {shown}", file=sys.stderr)
            return 2
        for rel, record in found:  # json.dumps escapes control characters itself
            print(store.printable(rel))
            print(json.dumps(record, indent=1, sort_keys=True) if isinstance(record, dict)
                  else store.printable(f"damaged: {record}"))
    return 0


def _demo(args) -> int:
    from .demo import run_demo

    run_demo(batches=args.batches, seq=args.seq)
    return 0


def _hypothesis_home_outside_cwd() -> None:
    """The checkers draw with hypothesis, which keeps a ``.hypothesis`` folder (example database, a cache of
    constants) in the working directory: a command run in a user's project must not leave one there. Unless the
    user chose a place (HYPOTHESIS_STORAGE_DIRECTORY), it goes to a temporary folder removed at exit."""
    if os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
        return
    try:
        from hypothesis.configuration import set_hypothesis_home_dir
    except ImportError:  # without the test extra the command says which extra it needs
        return
    home = tempfile.TemporaryDirectory(prefix="rewrite-hypothesis-")
    atexit.register(home.cleanup)
    set_hypothesis_home_dir(home.name)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rewrite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="-v: log rewrite's report (INFO on the rewrite logger); -vv: egglog's rule-by-rule "
                             "INFO lines too (hundreds of thousands of lines for the demo)")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compile MiniLM with batch gears and report")
    demo.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    demo.add_argument("--seq", type=int, default=32)
    demo.set_defaults(run=_demo)
    sub.add_parser("rules", help="list rulesets and rules").set_defaults(run=_rules)
    check = sub.add_parser("check-rules", help="check a ruleset module's rules numerically")
    check.add_argument("module", help="importable module name holding RuleSet objects")
    check.set_defaults(run=_check_rules)
    cal = sub.add_parser("calibrate", help="measure the cost model on this machine and cache it")
    cal.add_argument("--quick", action="store_true", help="a few hundredths of a second (rough figures)")
    cal.add_argument("--show", action="store_true", help="print the cached (or default) figures, measure nothing new")
    cal.set_defaults(run=_calibrate)
    fx = sub.add_parser("check-pass", help="check a torch.fx pass on random graphs, print a counterexample")
    fx.add_argument("spec", metavar="module:function", help="the pass: gets a GraphModule, returns one or None")
    fx.add_argument("--examples", type=int, default=200, help="random graphs to check (default 200)")
    fx.add_argument("--dynamic", action="store_true", help="graphs with symbolic sizes, run at several sizes")
    fx.add_argument("--dtypes", nargs="+", metavar="DTYPE", help="input dtypes, e.g. float32 int64 bool")
    fx.add_argument("--ops", nargs="+", metavar="OP", help="op generators to draw graphs from (names in OPS)")
    fx.add_argument("--takes", choices=["module", "graph"], help="pass gm.graph instead of gm (Inductor style)")
    fx.add_argument("--tolerance", type=float, nargs=2, metavar=("RTOL", "ATOL"), help="compare within a tolerance")
    fx.set_defaults(run=_check_pass)
    cb = sub.add_parser("check-backend", help="compile equivalent variants of a function's graphs with a backend and "
                        "compare each with eager (rewrite.testing.check_backend)")
    cb.add_argument("spec", nargs="?", metavar="module:function",
                    help="the function (or nn.Module class, built with no arguments) to check")
    cb.add_argument("--shapes", nargs="+", metavar="SHAPE", help="random inputs: 4,8 (float32) or 4,8:int64 ...")
    cb.add_argument("--inputs", metavar="module:function", help="a function returning the inputs (a tuple)")
    cb.add_argument("--backend", action="append", metavar="NAME",
                    help="backend under test (repeatable): inductor, inductor-dynamic, inductor-freezing, rewrite, "
                         "rewrite-reduce-overhead, rewrite-dynamic, rewrite-gears, eager, or any torch.compile "
                         "backend name (default inductor)")
    cb.add_argument("--variants", type=int, default=4, help="extraction picks per graph (default 4)")
    cb.add_argument("--examples", type=int, default=10, help="input draws per variant and backend (default 10)")
    cb.add_argument("--rules", choices=["exact", "all"], default="exact", help="exact rules only, or inexact ones too")
    cb.add_argument("--dynamic", action="store_true", help="symbolic sizes; run at sizes 0, 1, 2, ... and gear edges")
    cb.add_argument("--exact", action="store_true", help="compare bit for bit (default: within the dtype's tolerance)")
    cb.add_argument("--tolerance", type=float, nargs=2, metavar=("RTOL", "ATOL"), help="compare within a tolerance")
    cb.add_argument("--random", type=int, metavar="N", help="check N random graphs instead of a function")
    cb.add_argument("--batch", type=int, default=1, help="--random: graphs compiled together per compile (static)")
    cb.add_argument("--seed", type=int, help="vary the draws (default: the same every run)")
    cb.add_argument("--repro-dir", metavar="DIR", help="write a reproduction script per finding here")
    cb.add_argument("--shrink-seconds", type=float, default=60.0, help="time to shrink each finding (default 60)")
    cb.set_defaults(run=_check_backend)
    cache = sub.add_parser("cache", help="list, inspect or clear a compile cache folder")
    cache.add_argument("action", choices=["ls", "info", "clear"])
    cache.add_argument("key", nargs="?", help="info: an entry's path or hash prefix (as `ls` prints)")
    cache.add_argument("--dir", default=".rewrite_cache", help="the cache folder (default .rewrite_cache); clear removes "
                       "only entries this user's rewrite signed, never other files")
    cache.set_defaults(run=_cache)
    args = parser.parse_args(argv)
    from .extras import MissingExtra

    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(name)s %(levelname)s: %(message)s")
    if args.verbose >= 2:  # `import rewrite` sets egglog's loggers to WARNING (rewrite.logs)
        from .logs import EGGLOG_LOGGERS

        for name in EGGLOG_LOGGERS:
            logging.getLogger(name).setLevel(logging.INFO)
    if args.command in ("check-pass", "check-backend", "check-rules"):
        _hypothesis_home_outside_cwd()
    try:
        return args.run(args)
    except MissingExtra as e:  # an optional dependency: say which extra to install, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
