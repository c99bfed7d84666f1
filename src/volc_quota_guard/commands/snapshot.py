"""`volc-quota-guard snapshot POOL --balance N` — install a pool's snapshot by hand.

For operators (seed a pool before the billing sync runs, or override it during an incident)
and for tests. The walls use this process's VQG_SMALL_BUFFER and VQG_DAILY_CAP.
"""

from __future__ import annotations

import argparse

from ..config import settings
from ..gate import Gate, Snapshot
from ..gate.keys import KeySpace
from ..gate.store import connect
from . import pool_arg


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("snapshot", help="install a pool's balance snapshot by hand")
    p.add_argument("pool", type=pool_arg, help="account/model, e.g. default/deepseek-v4-flash-ga-260731")
    p.add_argument("--balance", type=int, required=True, help="free tokens the console shows now")
    p.add_argument("--usage-at-sync", type=int, default=None,
                   help="lifetime usage the balance already reflects (default: recorded usage "
                        "as of VQG_LAG_FLOOR_MINUTES ago)")
    p.add_argument("--expiring", type=int, default=0, help="free tokens expiring within --valid-minutes")
    p.add_argument("--valid-minutes", type=int, default=None,
                   help="how long the snapshot gives headroom (default VQG_SNAPSHOT_MAX_AGE_MINUTES)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    cfg = settings()
    gate = Gate(connect(cfg.redis_url, cfg.redis_cluster), KeySpace(cfg.key_prefix))
    now = gate.now_ms()
    usage = args.usage_at_sync
    if usage is None:
        usage = gate.usage_at(args.pool, now - cfg.lag_floor_minutes * 60_000)
    minutes = args.valid_minutes or cfg.snapshot_max_age_minutes
    start, top = cfg.correction_ppm()
    d = gate.install_snapshot(args.pool, Snapshot(
        balance=args.balance, settled_usage=usage, expiring=args.expiring,
        small_buffer=cfg.small_buffer, daily_cap=cfg.daily_cap,
        valid_until_ms=now + minutes * 60_000, evict_below=cfg.evict_below,
        correction_min_ppm=start, correction_max_ppm=top))
    print(f"{args.pool}: snapshot installed — balance wall {d.balance_wall:,} "
          f"(used {d.used_balance:,}), collection wall {d.daily_cap:,} (today {d.used_today:,}), "
          f"headroom {d.headroom:,}, valid {minutes} min")
    return 0
