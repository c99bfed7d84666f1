"""`volc-quota-guard status` — every guarded pool's walls, usage, sync and eviction at a glance.

Reads the shared store named by VQG_REDIS_URL (keys under VQG_KEY_PREFIX); each row is
`status.pool_status` (the same rows /metrics exports).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

from ..clock import to_beijing
from ..config import load_settings
from ..gate import Gate, KeySpace
from ..gate.store import connect
from ..gate.values import MAX_TIME
from ..status import pool_status
from . import pool_arg


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="show every guarded pool's walls, usage, sync and eviction",
                       description="Reads the shared store (VQG_REDIS_URL, VQG_KEY_PREFIX).")
    p.add_argument("--pool", action="append", default=[], type=pool_arg, metavar="ACCOUNT/MODEL",
                   help="only this pool (repeatable)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _when(ms: int | None, now: int) -> str:
    if ms is None:
        return "-"
    if ms >= MAX_TIME:
        return "next snapshot"
    t = to_beijing(ms)
    return f"{t:%H:%M}" if t.date() == to_beijing(now).date() else f"{t:%m-%d %H:%M}"


def _pair(used: int, wall: int) -> str:
    return f"{used:,} / {wall:,}"


def _print(console: Console, rows: list[dict[str, Any]], prefix: str) -> None:
    table = Table(title=f"volc-quota-guard pools (prefix {prefix!r})", title_justify="left",
                  caption="walls: used (in-flight included) / limit; the binding wall is bold; "
                          "lag: last observed / assumed", caption_justify="left")
    table.add_column("pool", no_wrap=True)
    for col in ("bal@sync", "B0≈", "today (+in-flight)", "lifetime", "balance wall",
                "collection wall", "headroom", "sync age", "lag"):
        table.add_column(col, justify="right")
    table.add_column("state")
    for r in rows:
        if not r["has_snapshot"]:
            table.add_row(r["pool"], *["-"] * 9, "[yellow]no snapshot: refusing[/]")
            continue
        now = r["now_ms"]
        state = []
        if r["evicted"]:
            state.append(f"[bold red]EVICTED[/] ({r['evicted_wall']} wall) until "
                         f"{_when(r['evicted_until_ms'], now)}")
        if r["held"]:
            state.append(f"[bold yellow]🕒 HELD[/] ({r['hold_cause']}) until "
                         f"{_when(r['held_until_ms'], now)}")
        elif r["unseen_balance"] and r["young_until_ms"]:
            state.append(f"[yellow]🕒 YOUNG[/] ({'state lost' if r['state_lost'] else 'cold start'}): "
                         f"{r['unseen_balance']:,} off the balance until {_when(r['young_until_ms'], now)} "
                         "at the latest")
        elif r["unseen_balance"]:
            state.append(f"[yellow]unseen not proven settled[/]: {r['unseen_balance']:,} off the balance "
                         "until the API shows it")
        elif r["state_lost"] and r["unseen_today"]:
            state.append("[yellow]⛔ state lost today[/]")
        if r["billing_since_ms"]:
            state.append(f"[bold red]💸 BILLING[/] since {_when(r['billing_since_ms'], now)}")
        if r["stale"]:
            state.append("[bold red]STALE snapshot[/]")
        if r["last_sync_error"]:
            state.append(f"[yellow]sync error: {r['last_sync_error'][:60]}[/]")
        if r["overruns"]:
            state.append(f"[yellow]{r['overruns']} overrun(s)[/]")
        walls = {"balance": _pair(r["balance_used"], r["balance_wall"]),
                 "collection": _pair(r["collection_used"], r["collection_wall"])}
        walls[r["binding_wall"]] = f"[bold]{walls[r['binding_wall']]}[/]"
        headroom = r["headroom"]
        observed = r["lag_observed_minutes"]
        lag = f"{'-' if observed is None else f'{observed:g}'} / {r['lag_assumed_minutes']:g} min"
        inflight = f" (+{r['inflight']:,})" if r["inflight"] else ""
        table.add_row(
            r["pool"], f"{r['balance_at_sync']:,}", f"{r['b0_estimate']:,}",
            f"{r['usage_today']:,}{inflight}", f"{r['lifetime_usage']:,}",
            walls["balance"], walls["collection"],
            f"[red]{headroom:,}[/]" if headroom < 0 else f"{headroom:,}",
            f"{r['sync_age_minutes']:g} min", lag, "; ".join(state) or "[green]ok[/]")
    console.print(table)


def run(args: argparse.Namespace) -> int:
    cfg = load_settings()
    gate = Gate(connect(cfg.redis_url, cfg.redis_cluster), KeySpace(cfg.key_prefix))
    pools = args.pool or gate.pools()
    rows = [pool_status(gate, pool, cfg) for pool in pools]
    if args.json:
        print(json.dumps({"key_prefix": cfg.key_prefix, "pools": rows}, ensure_ascii=False, indent=2))
        return 0
    console = Console(width=None if sys.stdout.isatty() else 200)
    if not rows:
        where = ("VQG_REDIS_URL" if cfg.redis_url
                 else "the embedded store (this process only: set VQG_REDIS_URL)")
        console.print(f"no guarded pools under prefix {cfg.key_prefix!r} in {where}")
        return 0
    _print(console, rows, cfg.key_prefix)
    return 0
