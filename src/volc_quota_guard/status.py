"""One pool's status as plain values: what `volc-quota-guard status` prints and /metrics exports.

Read from the shared store through the gate: its state (one `status` call per pool, which also
does the gate's housekeeping), the limit estimator's state (observed lag) and the account's
sync record (last error), so every proxy instance and the CLI report the same truth.
"""

from __future__ import annotations

from typing import Any

from .clock import MINUTE_MS, MS_PER_DAY
from .config import Settings
from .gate import PPM, Gate
from .limit import YOUNG_MS, LimitState, assumed_lag_ms

LAG_WINDOW_MS = 7 * MS_PER_DAY  # the observed lags status reports


def _minutes(ms: int | None) -> float | None:
    return None if ms is None else round(ms / MINUTE_MS, 1)


def pool_status(gate: Gate, pool: str, cfg: Settings) -> dict[str, Any]:
    """One pool's status as plain JSON-able values (ms since the epoch, tokens, minutes)."""
    state = gate.status(pool)
    d = state.decision
    now = state.now_ms
    records = gate.records
    f = state.get
    if d.reason == "no_snapshot":
        return {"pool": pool, "now_ms": now, "has_snapshot": False}
    limit = LimitState.from_json(records.limit_state(pool))
    recent = [(at, lag) for at, lag in limit.lags if now - at <= LAG_WINDOW_MS]
    ours = limit.generation == f("hist_at")
    young = limit.unseen_off if limit.unseen_ref is not None and ours else 0
    unseen = max(young, limit.unseen_kept if ours else 0)
    meta = records.sync_meta(pool.split("/", 1)[0])
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
        "evicted_wall": (records.state_text(pool, "evicted_wall") or None) if evicted else None,
        "overruns": f("overruns"),
        "expired_reservations": f("expired_count"),
        "packages": len(state.packages),
        "next_expiry_ms": min(expiries) if expiries else None,
        "last_sync_error": meta.get("last_error") or None,
        # A sync found the free quota spent: usage since then was billed (see docs/limit.md).
        "billing_since_ms": limit.billing_since_ms or None,
        "estimate_correction": round(d.correction_ppm / PPM, 3),
        "exact_correction": round(d.exact_correction_ppm / PPM, 3),  # kx: DeepSeek, Ark's counts
        # Where the guard's usage history of the pool begins (None: before this was recorded),
        # and the hold while it is shorter than the lag (docs/limit.md, "History start").
        "history_start_ms": f("hist_at") if f("hist_at") > 1 else None,
        "held": f("hold_until") > 0,
        "held_until_ms": f("hold_until") or None,
        "hold_cause": ("state lost" if f("hist_lost") else "cold start") if f("hold_until") else None,
        "state_lost": bool(f("hist_lost")),
        # Today's usage the guard assumes it did not see (a first start, lost state): off the cap.
        "unseen_today": f("day_margin") if f("day_lost") and f("day_lost") == f("day") else 0,
        # What may have run unseen before the history began, kept off the balance wall: while the
        # history is young (YOUNG_MS at most), and after it until the API shows it settled
        # (docs/limit.md, "History start").
        "unseen_balance": unseen,
        "young_until_ms": f("hist_at") + YOUNG_MS if young else None,
    }
