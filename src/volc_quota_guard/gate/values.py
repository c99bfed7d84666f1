"""What the gate answers and takes: plain values, no Redis (the pure modules build on them).

`Decision` is every verb's answer, `Snapshot` what a billing sync installs, `PoolState` what
`status` reads. The bounds are the ones the Lua checks its arguments against
(`resources/lua/_common.lua`); the reference model (`model.py`) and the hook use these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PPM = 1_000_000  # the estimate correction is carried in parts per million
MAX_REQUEST = 100_000_000  # the gate's per-request ceiling (tokens)
MAX_AMOUNT = 10**15  # any snapshot amount
MAX_TIME = 4_102_444_800_000  # 2100-01-01: "until the next snapshot" (evicted at the balance wall)


def corrected(est: int, k: int) -> int:
    """ceil(est × k / PPM): the input reserved for a prompt the tokenizer counted as `est`
    (the Lua's `corrected`)."""
    return (est * k + PPM - 1) // PPM


@dataclass(frozen=True)
class Decision:
    """The gate's answer. `amount` is what was granted, counted or released."""

    status: str  # "ok" | "refused"
    reason: str
    amount: int
    headroom: int
    used_balance: int  # lifetime usage + in-flight
    balance_wall: int
    used_today: int  # today's usage + in-flight
    daily_cap: int
    inflight: int
    evicted_until: int
    overrun: bool
    balance_at_sync: int = 0  # for log lines: saves a read of the pool state
    input_reserved: int = 0  # reserve: the estimated input with the correction applied
    correction_ppm: int = PPM  # the pool's estimate correction k now, parts per million
    exact_correction_ppm: int = PPM  # the exact class's correction kx now (gate.md, "Exact counts")
    # What a process remembers of the pool (sync.py's checkpoint): the state's generation and
    # Beijing day, today's and lifetime usage with in-flight prompts at the miscount ceiling
    # (what a wipe's lost reservations count), and the settled usage of the last snapshot.
    generation: int = 0
    day: int = 0
    today_worst: int = 0
    lifetime_worst: int = 0
    settled: int = 0
    ucum: int = 0  # lifetime usage: never lower later in the same generation (a rollback if it is)
    carry_day: int = 0  # usage also counted on this Beijing day (calls Ark may bill after midnight)
    carry: int = 0

    @property
    def admitted(self) -> bool:
        return self.status == "ok" and self.reason in ("admitted", "duplicate")

    @property
    def refused_at_wall(self) -> bool:
        """Refused for lack of headroom (not a missing or stale snapshot): a smaller count may fit."""
        return self.reason in ("balance_wall", "collection_wall", "expiry_wall")

    @property
    def binding_wall(self) -> str:
        """The wall closer to being hit: 'balance' or 'collection'."""
        b = self.balance_wall - self.used_balance
        c = self.daily_cap - self.used_today
        return "balance" if b <= c else "collection"

    def usage_and_limit(self) -> tuple[int, int]:
        """(usage incl. in-flight, limit) of the binding wall, for log lines."""
        if self.binding_wall == "balance":
            return self.used_balance, self.balance_wall
        return self.used_today, self.daily_cap


@dataclass(frozen=True)
class Snapshot:
    """What a billing sync learned about one pool, in lifetime-cumulative coordinates."""

    balance: int  # balance_at_sync: free tokens the API reported
    settled_usage: int  # usage_at_sync: our lifetime usage the API had most likely settled
    expiring: int  # kept off the wall: expiring before `valid_until_ms`, or used unseen (limit.py)
    small_buffer: int
    daily_cap: int
    valid_until_ms: int
    evict_below: int = 1_000
    packages: list[dict[str, Any]] = field(default_factory=list)  # for status, not for the walls
    correction_min_ppm: int = 17 * PPM // 10  # k's floor, and k before any measured settle
    correction_max_ppm: int = 3 * PPM  # k never goes above this
    hold_until_ms: int = 0  # > 0: the pool's history is too short to trust the balance (limit.py)
    hold_cap: int = 0  # ... and lifetime usage may not pass this until a snapshot without a hold
    unseen_day_tokens: int = 0  # when this snapshot creates the state: today's usage not seen
    # Today's count from the billing API (limit.py `day_step`): the consumption the API settled
    # since the previous sync at most (None = not bounded: the count starts again here), that
    # sync's time, and our lifetime usage a reconcile lag ago (None = our history is shorter).
    day_step: int | None = None
    day_since_ms: int = 0
    day_from: int | None = None
    # The state generation (hist_at) this snapshot was computed from; 0: a new state. Installing
    # it into another generation (the store lost its data after the sync read the state) is
    # refused (`generation`): the sync must take the lost-state path instead.
    generation: int = 0
    # When the billing listing this snapshot was computed from began (gate clock, ms; 0 = by
    # hand). One from an older listing than the installed one's is refused (`older_listing`).
    listed_at_ms: int = 0
    # Packages expiring after `valid_until_ms` plus the longest call, as (expires at ms, free
    # tokens), soonest first: a call Ark may run past one is admitted without it (reserve's run).
    ladder: tuple[tuple[int, int], ...] = ()


def ladder_arg(s: Snapshot) -> str:
    """The expiry ladder as the gate stores it: "t:a,t:a"."""
    return ",".join(f"{t}:{a}" for t, a in s.ladder)


@dataclass(frozen=True)
class PoolState:
    """Everything `status` shows about one pool."""

    pool: str
    decision: Decision
    now_ms: int
    fields: dict[str, int]
    packages: list[dict[str, Any]]

    def get(self, name: str) -> int:
        return self.fields.get(name, 0)
