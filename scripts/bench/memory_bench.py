"""Redis memory one pool costs after a busy stretch: requests per day × days, on a real server.

    python scripts/bench/memory_bench.py [--url redis://127.0.0.1:6379/0] [--per-day 20000] [--days 3]

Drives reserve + settle through the gate on a manual clock (the scripts' retention rules apply
exactly as in production) and prints MEMORY USAGE per key. Not a test: numbers, not assertions.
"""

from __future__ import annotations

import argparse
import uuid

from volc_quota_guard.clock import ManualClock
from volc_quota_guard.gate import Gate, Snapshot
from volc_quota_guard.keys import KeySpace
from volc_quota_guard.store import connect

POOL = "bench/deepseek-v4-flash-ga-260731"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--per-day", type=int, default=20_000)
    ap.add_argument("--days", type=int, default=3)
    args = ap.parse_args()
    client = connect(args.url)
    ks = KeySpace(f"vqgmem-{uuid.uuid4().hex[:8]}")
    clock = ManualClock(1_786_550_400_000)  # 2026-08-13 00:00 Beijing
    gate = Gate(client, ks, clock)
    step = 86_400_000 // args.per_day
    try:
        for n in range(args.per_day * args.days):
            if n % 500 == 0:
                gate.install_snapshot(POOL, Snapshot(10**13, 0, 0, 0, 10**13, clock.now_ms() + 7_200_000, 0))
            rid = uuid.uuid4().hex
            gate.reserve(POOL, rid, 5_000)
            gate.settle(POOL, rid, 3_000)
            clock.advance(step)
        keys = ks.pool(POOL)
        print(f"| key ({args.per_day:,} requests/day, {args.days} days) | entries | bytes |")
        print("|---|---|---|")
        total = 0
        for name in ("state", "reservations", "deadlines", "resolved", "resolved_at", "timeline",
                     "timeline_index", "packages", "limit_state"):
            key = getattr(keys, name)
            size = client.memory_usage(key) or 0
            kind = client.type(key).decode()
            counter = {"hash": client.hlen, "zset": client.zcard}.get(kind)
            count = counter(key) if counter else int(bool(size))
            total += size
            print(f"| {name} | {count:,} | {size:,} |")
        print(f"| **total** | | **{total:,}** |")
    finally:
        for key in client.scan_iter(f"{ks.prefix}:*", count=1000):
            client.delete(key)


if __name__ == "__main__":
    main()
