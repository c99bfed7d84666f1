"""`volc-quota-guard status` — every guarded pool's walls, usage, sync and eviction at a glance.

Reads the shared store named by VQG_REDIS_URL (keys under VQG_KEY_PREFIX): the gate's state
(one `status` call per pool, which also does the gate's housekeeping), the limit estimator's
state (observed lag) and the account's sync record (last error).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

import redis
from rich.console import Console
from rich.table import Table

from ..clock import to_beijing
from ..config import Settings, load_settings
from ..gate import Gate
from ..keys import KeySpace
from ..limit import LimitState, assumed_lag_ms
from ..model import MAX_TIME
from ..store import connect
from . import pool_arg

MINUTE_MS = 60_000


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="show every guarded pool's walls, usage, sync and eviction",
                       description="Reads the shared store (VQG_REDIS_URL, VQG_KEY_PREFIX).")
    p.add_argument("--pool", action="append", default=[], type=pool_arg, metavar="ACCOUNT/MODEL",
                   help="only this pool (repeatable)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=run)


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v or "")


def _minutes(ms: int | None) -> float | None:
    return None if ms is None else round(ms / MINUTE_MS, 1)


def pool_status(gate: Gate, client: redis.Redis, keyspace: KeySpace, pool: str,
                cfg: Settings) -> dict[str, Any]:
    """One pool's status as plain JSON-able values (ms since the epoch, tokens, minutes)."""
    state = gate.status(pool)
    d = state.decision
    now = state.now_ms
    keys = keyspace.pool(pool)
    f = state.get
    if d.reason == "no_snapshot":
        return {"pool": pool, "now_ms": now, "has_snapshot": False}
    raw_limit = client.get(keys.limit_state)
    limit = LimitState.from_json(json.loads(raw_limit) if raw_limit else None)
    recent = [(at, lag) for at, lag in limit.lags if now - at <= 7 * 86_400_000]
    meta = {_text(k): _text(v) for k, v in client.hgetall(keyspace.sync_meta(pool.split("/", 1)[0])).items()}
    settled = min(f("settled"), f("ucum"))
    evicted_until = f("evicted_until")
    evicted = evicted_until > now
    expiries = [p["expires_ms"] for p in state.packages
                if p.get("expires_ms") and p["expires_ms"] > now and p.get("available", 0) > 0]
    return {
        "pool": pool,
        "now_ms": now,
        "has_snapshot": True,
        "balance_at_sync": f("balance"),
        "usage_at_sync": settled,  # lifetime usage the balance already reflects (estimate)
        # The free balance at the start of today (Beijing), as the guard estimates it.
        "b0_estimate": f("balance") + settled - (f("ucum") - f("day_usage")),
        "expiring": f("expiring"),
        "small_buffer": f("buffer"),
        "usage_today": f("day_usage"),
        "usage_yesterday": f("prev_day_usage"),
        "lifetime_usage": f("ucum"),
        "inflight": f("inflight"),
        "balance_wall": d.balance_wall,
        "balance_used": d.used_balance,  # lifetime usage + in-flight
        "collection_wall": d.daily_cap,
        "collection_used": d.used_today,  # today's usage + in-flight
        "headroom": d.headroom,
        "binding_wall": d.binding_wall,
        "synced_at_ms": f("snap_at"),
        "sync_age_minutes": _minutes(now - f("snap_at")),
        "valid_until_ms": f("valid_until"),
        "stale": now > f("valid_until"),
        "lag_observed_minutes": _minutes(recent[-1][1]) if recent else None,
        "lag_worst_minutes": _minutes(max(lag for _, lag in recent)) if recent else None,
        "lag_assumed_minutes": _minutes(assumed_lag_ms(limit, now, cfg.lag_floor_minutes * MINUTE_MS)),
        "evicted": evicted,
        "evicted_until_ms": evicted_until if evicted else None,
        "evicted_wall": (_text(client.hget(keys.state, "evicted_wall")) or None) if evicted else None,
        "overruns": f("overruns"),
        "expired_reservations": f("expired_count"),
        "packages": len(state.packages),
        "next_expiry_ms": min(expiries) if expiries else None,
        "last_sync_error": meta.get("last_error") or None,
        # A sync found the free quota spent: usage since then was billed (see docs/limit.md).
        "billing_since_ms": limit.billing_since_ms or None,
        "estimate_correction": round(d.correction_ppm / 1_000_000, 3),
        # Where the guard's usage history of the pool begins (None: before this was recorded),
        # and the hold while it is shorter than the lag (docs/limit.md, "History start").
        "history_start_ms": f("hist_at") if f("hist_at") > 1 else None,
        "held": f("hold_until") > 0,
        "held_until_ms": f("hold_until") or None,
        "hold_cause": ("state lost" if f("hist_lost") else "cold start") if f("hold_until") else None,
        "state_lost": bool(f("hist_lost")),
        # Today's usage the guard assumes it did not see (a first start, lost state): off the cap.
        "unseen_today": f("day_margin") if f("day_lost") and f("day_lost") == f("day") else 0,
    }


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
    keyspace = KeySpace(cfg.key_prefix)
    client = connect(cfg.redis_url, cfg.redis_cluster)
    gate = Gate(client, keyspace)
    pools = args.pool or gate.pools()
    rows = [pool_status(gate, client, keyspace, pool, cfg) for pool in pools]
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
