"""The grep-able log lines (formats in docs/operating.md, "Log lines"; extra `key=value` fields follow).

Numbers are in *today* coordinates: `Limit` is what today's usage (in-flight included) may
reach before a wall binds, i.e. `today + headroom` of the binding wall.
"""

from __future__ import annotations

import hashlib

from ..gate.values import Decision


def short_hash(text: str) -> str:
    """8 hex chars naming a pool in logs without spelling out the account."""
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def daily_limit(d: Decision) -> int:
    return d.used_today + d.headroom


def pre_block(model: str, d: Decision, reserve: int, reason: str | None = None,
              **fields: object) -> str:
    """`🚫 [PRE-BLOCK] {model} daily limit reached ({usage}+{reserve}/{limit})` + fields.

    `reason` defaults to the gate's (balance_wall, collection_wall, no_snapshot, …).
    """
    line = (f"🚫 [PRE-BLOCK] {model} daily limit reached "
            f"({d.used_today:,}+{reserve:,}/{daily_limit(d):,})")
    return _with_fields(line, {"reason": reason or d.reason, "wall": d.binding_wall, **fields})


def usage(model: str, pool: str, tokens: int | None, d: Decision, bal_at_sync: int | None,
          **fields: object) -> str:
    """`📊 [Usage] {model}:{hash}: +{tokens} (Today: X | BalAtSync: Y | Limit: Z)` + fields.

    `tokens` is None when the upstream reported no usage: the line says `+?`, never a guess.
    """
    shown = "?" if tokens is None else str(tokens)
    bal = "?" if bal_at_sync is None else f"{bal_at_sync:,}"
    line = (f"📊 [Usage] {model}:{short_hash(pool)}: +{shown} "
            f"(Today: {d.used_today:,} | BalAtSync: {bal} | Limit: {daily_limit(d):,})")
    return _with_fields(line, {**fields, "pool": pool})


def _with_fields(line: str, fields: dict[str, object]) -> str:
    extra = " ".join(f"{k}={v}" for k, v in fields.items() if v is not None and v != "")
    return f"{line} {extra}" if extra else line
