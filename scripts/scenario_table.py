#!/usr/bin/env python3
"""Regenerate the scenario × strategy table of docs/simulator.md.

    python scripts/scenario_table.py                 # print the Markdown table
    python scripts/scenario_table.py --write         # replace it in docs/simulator.md

Each cell is `billed / burned / expired / refused-while-free` tokens; bold = billed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from volc_quota_guard.simulator import STRATEGIES, builtin_names, load_scenario, simulate
from volc_quota_guard.simulator.report import markdown_table

DOC = Path(__file__).resolve().parent.parent / "docs" / "simulator.md"
START, END = "<!-- scenario-table:start -->", "<!-- scenario-table:end -->"


def table(names: list[str]) -> str:
    rows = []
    for name in names:
        started = time.perf_counter()
        scenario = load_scenario(name)
        rows.append((name, [simulate(scenario, st) for st in STRATEGIES]))
        print(f"{name}: {time.perf_counter() - started:.1f}s", file=sys.stderr)
    return markdown_table(rows, STRATEGIES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"replace the table in {DOC}")
    parser.add_argument("scenario", nargs="*", help="only these shipped scenarios")
    args = parser.parse_args()
    md = table(args.scenario or builtin_names())
    if not args.write:
        print(md, end="")
        return 0
    text = DOC.read_text(encoding="utf-8")
    if START not in text or END not in text:
        print(f"{DOC} has no {START} … {END} block", file=sys.stderr)
        return 1
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(f"{head}{START}\n{md}{END}{tail}", encoding="utf-8")
    print(f"updated {DOC}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
