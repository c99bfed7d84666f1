"""`volc-quota-guard simulate SCENARIO` — run a scenario against the guard and the seed's formulas.

SCENARIO is a YAML file (format: docs/simulator.md) or the name of a shipped scenario
(`--list` shows them). The guard runs the production gate, limit and sync on a fresh embedded
store with a simulated clock; the Volcengine side is the fake ledger.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from rich.console import Console

from ..simulator import STRATEGIES, builtin_names, description, load_scenario, simulate
from ..simulator.report import plot, print_table, require_matplotlib, to_json


def strategies_arg(value: str) -> list[str]:
    """`guard`, `v6`, `guard,v6` or `all`."""
    names = list(STRATEGIES) if value == "all" else [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in STRATEGIES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"unknown strategy {', '.join(bad) or value!r}: "
            f"use {', '.join(STRATEGIES)}, a comma list, or all")
    return list(dict.fromkeys(names))


def register(sub: Any) -> None:
    p = sub.add_parser(
        "simulate",
        help="simulate a scenario against the guard and the historical formulas",
        description="Runs a scenario (YAML file or shipped name) in simulated Beijing time: the "
                    "guard's real gate/limit/sync on an embedded store, or a historical formula "
                    "(v2/v4/v5/v6), against the fake Volcengine ledger.",
    )
    p.add_argument("scenario", nargs="?", help="a scenario YAML file, or a shipped scenario's name")
    p.add_argument("--strategy", type=strategies_arg, default=["guard"], metavar="NAME",
                   help=f"{', '.join(STRATEGIES)}, a comma list, or all (default: guard)")
    p.add_argument("--json", action="store_true", help="machine-readable output (SCENARIOS.md)")
    p.add_argument("--plot", metavar="OUT.png", help="draw balances, limits, blocks and billing "
                                                     "over time (needs matplotlib)")
    p.add_argument("--env", action="store_true",
                   help="take the guard's other settings (VQG_LAG_FLOOR_MINUTES, …) from the "
                        "environment instead of the defaults; the scenario's buffer, cap and "
                        "sync interval still win")
    p.add_argument("--list", action="store_true", help="list the shipped scenarios and exit")
    p.add_argument("-v", "--verbose", action="store_true", help="print the guard's sync log lines")
    p.set_defaults(func=run)


def _list(console: Console) -> int:
    for name in builtin_names():
        console.print(f"[bold]{name}[/]")
        console.print(f"  {description(name)}", highlight=False)
    return 0


def run(args: argparse.Namespace) -> int:
    console = Console(width=None if sys.stdout.isatty() else 160)
    if args.list:
        return _list(console)
    if not args.scenario:
        print("volc-quota-guard simulate: a SCENARIO (file or shipped name) is required; "
              "--list shows the shipped ones", file=sys.stderr)
        return 2
    if args.plot:
        require_matplotlib()  # fail before a long run, not after
    scenario = load_scenario(args.scenario)
    if args.verbose:
        import logging

        logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    results = [simulate(scenario, name, series=bool(args.plot), from_env=args.env,
                        verbose=args.verbose) for name in args.strategy]
    if args.plot:
        plot(scenario, results, args.plot)
    if args.json:
        print(to_json(results))
    else:
        print_table(console, scenario, results)
        if args.plot:
            console.print(f"plot: {args.plot}")
    return 0
