#!/usr/bin/env python3
"""Run random scenarios against the guard; every one must bill 0 and burn 0.

    python scripts/fuzz_scenarios.py                          # seeds 0-199 (what CI runs)
    python scripts/fuzz_scenarios.py --seeds 200:2000 --redis redis://127.0.0.1:6379/0
    python scripts/fuzz_scenarios.py --seeds 98 --save-failures src/volc_quota_guard/scenarios
    python scripts/fuzz_scenarios.py --knowing usage,outputs   # what that knowledge would save

A failing seed's YAML is written to --save-failures (default: fuzz-failures/), ready to ship as a
regression scenario. Exit status 1 when any seed billed, burned or crashed.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from volc_quota_guard.simulator.fuzz import FAULTS, KNOWING, FuzzCase, knowing, run_fuzz, scenario_yaml


def seed_range(text: str) -> range:
    lo, _, hi = text.partition(":")
    return range(int(lo), int(hi)) if hi else range(int(lo), int(lo) + 1)


def waste(label: str, cases: list[FuzzCase]) -> str:
    """Served tokens, and both waste figures as shares of them: all of it (refused while free
    also beyond SMALL_BUFFER, the reserve stranded leaves out), then without what history starts
    cost (refused while young, held or under a lowered first-day cap, docs/limit.md)."""
    served = max(1, sum(c.served_tokens for c in cases))
    refused = sum(c.refused_while_free for c in cases)
    beyond = sum(c.refused_beyond_buffer for c in cases)
    stranded = sum(c.stranded for c in cases)
    steady_r = refused - sum(c.refused_at_start for c in cases)
    steady_s = stranded - sum(c.stranded_at_start for c in cases)
    return (f"{label}: {len(cases)} scenarios · served {served:,} · refused while free "
            f"{refused / served:.1%} (beyond SMALL_BUFFER {beyond / served:.1%}) · stranded "
            f"{stranded / served:.1%} · outside history starts {steady_r / served:.1%} / "
            f"{steady_s / served:.1%}")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=seed_range, default=range(0, 200), help="A:B (B excluded) or one seed")
    p.add_argument("--redis", default=None, help="run on this Redis server (faster), not embedded stores")
    p.add_argument("--workers", type=int, default=None, help="processes (default: every core)")
    p.add_argument("--save-failures", type=Path, default=Path("fuzz-failures"))
    p.add_argument("--worst", type=int, default=0, help="list the N seeds that wasted the most")
    p.add_argument("--knowing", type=lambda t: [w for w in t.split(",") if w], default=[],
                   help="rewrite each scenario so the guard knows these before the fact: "
                   + "; ".join(f"{k}: {v}" for k, v in KNOWING.items()))
    args = p.parse_args()
    try:
        knowing({"traffic": []}, args.knowing)
    except ValueError as exc:
        p.error(str(exc))
    started = time.perf_counter()
    cases = run_fuzz(args.seeds, args.workers, args.redis, args.knowing)
    failed = [c for c in cases if c.failed]
    for c in failed:
        args.save_failures.mkdir(parents=True, exist_ok=True)
        path = args.save_failures / f"fuzz-{c.seed}.yaml"
        path.write_text(scenario_yaml(c.seed, args.knowing))
        print(f"FAIL seed {c.seed}: billed {c.billed:,} burned {c.burned:,} {c.error or ''} -> {path}")
    print(f"{len(cases)} scenarios, {sum(c.requests for c in cases):,} requests, {len(failed)} failed, "
          f"{time.perf_counter() - started:.0f}s")
    print(f"billed {sum(c.billed for c in cases):,} · burned {sum(c.burned for c in cases):,}")
    print(waste("all pools", cases))
    for method, label in (("cheap", "cl100k counts"), ("ark-api", "Doubao (ark-api)"),
                          ("exact", "DeepSeek (exact)")):
        print(waste(f"  {label}", [c for c in cases if c.counting == method]))
    print("by what the seeds draw (a seed may draw several):")
    for fault, meaning in FAULTS.items():
        print(waste(f"  {fault} ({meaning})", [c for c in cases if fault in c.faults]))
    print(waste("  none of these", [c for c in cases if not c.faults]))
    if args.worst:
        def steady(c: FuzzCase) -> int:
            return c.refused_while_free - c.refused_at_start + c.stranded - c.stranded_at_start

        for rank, title in ((lambda c: c.refused_while_free + c.stranded, "all of it"),
                            (steady, "outside history starts")):
            print(f"the {args.worst} seeds that wasted the most, {title}:")
            for c in sorted(cases, key=rank, reverse=True)[:args.worst]:
                print(f"  seed {c.seed} ({c.counting}): served {c.served_tokens:,} refused while free "
                      f"{c.refused_while_free:,} stranded {c.stranded:,} · outside history starts "
                      f"{c.refused_while_free - c.refused_at_start:,} / "
                      f"{c.stranded - c.stranded_at_start:,}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
