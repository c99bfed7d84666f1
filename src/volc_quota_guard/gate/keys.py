"""Every Redis key the guard uses is built here.

All keys of one pool share the hash tag `{<pool>}` so a single Lua call touches one
slot and runs on Redis Cluster.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_POOL_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}/[A-Za-z0-9._:-]{1,128}$")


def pool_id(account: str, model: str) -> str:
    """The pool of one (Volcengine account, upstream Ark model): ``account/model``."""
    pool = f"{account}/{model}"
    validate_pool(pool)
    return pool


def validate_pool(pool: str) -> str:
    if not _POOL_RE.match(pool):
        raise ValueError(
            f"bad pool id {pool!r}: expected 'account/model' of letters, digits, '.', '_', '-' (':' in model)"
        )
    return pool


@dataclass(frozen=True)
class PoolKeys:
    """The keys of one pool, in the order the gate scripts take them."""

    state: str  # hash: snapshot fields, counters, day, eviction
    reservations: str  # hash: request id -> "amount:deadline_ms"
    deadlines: str  # zset: request id scored by its deadline
    resolved: str  # hash: request id -> "how:counted" (settled/released/expired)
    resolved_at: str  # zset: request id scored by when it resolved (for trimming)
    timeline: str  # hash: minute -> lifetime usage at the end of that minute
    timeline_index: str  # zset: minute scored by itself (ordered lookup)
    packages: str  # string: JSON list of the pool's packages at the last sync
    limit_state: str  # string: JSON of the limit estimator's state (limit.LimitState)

    def gate_keys(self, verb: str = "") -> list[str]:
        """KEYS of a gate script; `snapshot` also writes the package list."""
        extra = [self.packages] if verb == "snapshot" else []
        return [
            self.state,
            self.reservations,
            self.deadlines,
            self.resolved,
            self.resolved_at,
            self.timeline,
            self.timeline_index,
            *extra,
        ]


class KeySpace:
    """Builds keys under one prefix (``VQG_KEY_PREFIX``)."""

    def __init__(self, prefix: str = "vqg") -> None:
        if "{" in prefix or "}" in prefix:
            raise ValueError("the key prefix may not contain braces")
        self.prefix = prefix

    def pool(self, pool: str) -> PoolKeys:
        validate_pool(pool)
        base = f"{self.prefix}:{{{pool}}}"
        return PoolKeys(
            state=f"{base}:state",
            reservations=f"{base}:res",
            deadlines=f"{base}:deadlines",
            resolved=f"{base}:resolved",
            resolved_at=f"{base}:resolved_at",
            timeline=f"{base}:timeline",
            timeline_index=f"{base}:timeline_idx",
            packages=f"{base}:packages",
            limit_state=f"{base}:limit",
        )

    def pools_index(self) -> str:
        """Set of every pool that ever had a snapshot (for `status`)."""
        return f"{self.prefix}:pools"

    def sync_lock(self, account: str) -> str:
        return f"{self.prefix}:sync_lock:{account}"

    def sync_meta(self, account: str) -> str:
        return f"{self.prefix}:sync_meta:{account}"

    def consume_done(self, pool: str, day: int) -> str:
        """The consume task's once-per-Beijing-day claim (SET NX), then its outcome (JSON)."""
        return f"{self.prefix}:{{{validate_pool(pool)}}}:consume:{day}"

    def consume_history(self, pool: str) -> str:
        """Hash: ``<day>:natural`` (a Beijing day's usage without the consume task's) and
        ``<day>:task`` (the task's own), and ``first_day`` of the history, for the forecast."""
        return f"{self.prefix}:{{{validate_pool(pool)}}}:consume_hist"

    def response_chain(self, response_id: str) -> str:
        """String: tokens Ark re-reads as input when a request names this stored response
        (``previous_response_id``); expires with Ark's storage. Not per pool: a follow-up may
        name it through another model (red-team, stop 38: a 60,100-token conversation re-read
        through a model declaring a 5,000-token window billed 60,155 against 8,576 reserved)."""
        if not 1 <= len(response_id) <= 512:
            raise ValueError("response id must be 1-512 characters")
        return f"{self.prefix}:resp:{{{response_id}}}"

    def pattern(self) -> str:
        return f"{self.prefix}:*"
