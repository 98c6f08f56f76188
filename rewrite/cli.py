"""`python -m rewrite ...`: the demo, the rule catalogue and the rule checker.

    python -m rewrite demo                 compile MiniLM with batch gears; print what happened and timings
    python -m rewrite rules                print the optimization schedule: passes, rulesets, rules
    python -m rewrite check-rules MODULE   check every rule of a user's ruleset module numerically
"""
from __future__ import annotations

import argparse
import logging
import sys


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


def _demo(args) -> int:
    from .demo import run_demo

    run_demo(batches=args.batches, seq=args.seq)
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rewrite", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the compiler does")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="compile MiniLM with batch gears and report")
    demo.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    demo.add_argument("--seq", type=int, default=32)
    demo.set_defaults(run=_demo)
    sub.add_parser("rules", help="list rulesets and rules").set_defaults(run=_rules)
    check = sub.add_parser("check-rules", help="check a ruleset module's rules numerically")
    check.add_argument("module", help="importable module name holding RuleSet objects")
    check.set_defaults(run=_check_rules)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(name)s %(levelname)s: %(message)s")
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
