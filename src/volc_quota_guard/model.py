"""A pure-Python reference model of the gate: the specification the Lua is checked against.

Same verbs, same arguments, same answers as `resources/lua/*.lua`, on plain dicts. The
Hypothesis state machine in tests/test_gate_model.py drives both and compares every answer.
Keep this file boring: clarity beats speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .clock import beijing_day
from .errors import GateError
from .gate import Decision, Snapshot

MAX_REQUEST = 100_000_000
MAX_AMOUNT = 10**15
MAX_TIME = 4_102_444_800_000
RESOLVED_MS = 21_600_000  # resolved ids: 6 h
TIMELINE_MS = 172_800_000  # timeline minutes: 48 h
SWEEP_LIMIT = 1000
TRIM_LIMIT = 100


@dataclass
class PoolModel:
    snap_at: int = 0
    valid_until: int = 0
    balance: int = 0
    settled: int = 0
    expiring: int = 0
    buffer: int = 0
    cap: int = 0
    evict_below: int = 0
    ucum: int = 0
    day: int = 0
    day_usage: int = 0
    prev_day_usage: int = 0
    inflight: int = 0
    overruns: int = 0
    expired_count: int = 0
    evicted_until: int = 0
    evicted_wall: str = ""
    tl_floor: int = 0
    snap_seq: int = 0
    reservations: dict[str, tuple[int, int]] = field(default_factory=dict)  # id -> (amount, deadline)
    resolved: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # id -> (how, counted, at)
    timeline: dict[int, int] = field(default_factory=dict)  # minute -> lifetime usage

    # -- walls -------------------------------------------------------------------------------
    def balance_wall(self) -> int:
        return self.balance + self.settled - self.expiring - self.buffer

    def headrooms(self) -> tuple[int, int]:
        return (self.balance_wall() - (self.ucum + self.inflight),
                self.cap - (self.day_usage + self.inflight))

    # -- housekeeping ------------------------------------------------------------------------
    def add_usage(self, n: int, now: int) -> None:
        if n <= 0:
            return
        self.ucum += n
        self.day_usage += n
        self.timeline[now // 60_000] = self.ucum

    def resolve(self, rid: str, how: str, counted: int, now: int) -> None:
        self.resolved[rid] = (how, counted, now)

    def housekeep(self, now: int) -> None:
        today = beijing_day(now)
        if today > self.day:
            self.prev_day_usage = self.day_usage if today == self.day + 1 else 0
            self.day_usage = 0
            self.day = today
        due = sorted((d, rid) for rid, (_, d) in self.reservations.items() if d <= now)
        for _, rid in due[:SWEEP_LIMIT]:
            amount, _ = self.reservations.pop(rid)
            self.inflight -= amount
            self.add_usage(amount, now)
            self.resolve(rid, "expired", amount, now)
            self.expired_count += 1
        cutoff = now - RESOLVED_MS
        old = sorted((at, rid) for rid, (_, _, at) in self.resolved.items() if at <= cutoff)
        for _, rid in old[:TRIM_LIMIT]:
            del self.resolved[rid]
        for minute in sorted(m for m in self.timeline if m <= (now - TIMELINE_MS) // 60_000)[:TRIM_LIMIT]:
            self.tl_floor = max(self.tl_floor, self.timeline.pop(minute))

    def update_eviction(self) -> None:
        hb, hc = self.headrooms()
        if hb < self.evict_below:
            self.evicted_until, self.evicted_wall = MAX_TIME, "balance"
        elif hc < self.evict_below:
            self.evicted_until = (self.day + 1) * 86_400_000 - 28_800_000
            self.evicted_wall = "collection"
        else:
            self.evicted_until, self.evicted_wall = 0, ""

    def answer(self, status: str, reason: str, amount: int, overrun: bool = False) -> Decision:
        hb, hc = self.headrooms()
        return Decision(status, reason, amount, min(hb, hc), self.ucum + self.inflight,
                        self.balance_wall(), self.day_usage + self.inflight, self.cap,
                        self.inflight, self.evicted_until, overrun, self.balance)


_NO_SNAPSHOT = Decision("refused", "no_snapshot", 0, 0, 0, 0, 0, 0, 0, 0, False)


def _is_int(v: object, lo: int, hi: int) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


class GateModel:
    """The gate's semantics over in-memory pools; every verb takes an explicit `now` (ms)."""

    def __init__(self) -> None:
        self.pools: dict[str, PoolModel] = {}

    def _check_id(self, rid: str) -> None:
        if not (1 <= len(rid.encode()) <= 256):
            raise GateError("bad_id", "request id must be 1-256 bytes")

    def reserve(self, pool: str, rid: str, wanted: int, least: int | None, ttl_ms: int,
                now: int) -> Decision:
        least = wanted if least is None else least
        self._check_id(rid)
        if not _is_int(wanted, 1, MAX_REQUEST) or not _is_int(least, 1, wanted):
            raise GateError("bad_amount", "amounts out of range")
        if not _is_int(ttl_ms, 1000, 604_800_000):
            raise GateError("bad_ttl", "ttl out of range")
        p = self.pools.get(pool)
        if p is None:
            return _NO_SNAPSHOT
        p.housekeep(now)
        status, reason, granted = "refused", "", 0
        if rid in p.reservations:
            status, reason, granted = "ok", "duplicate", p.reservations[rid][0]
        elif rid in p.resolved:
            reason = "resolved"
        elif now > p.valid_until:
            reason = "stale_snapshot"
        else:
            hb, hc = p.headrooms()
            grant = min(wanted, hb, hc)
            if grant >= least:
                status, reason, granted = "ok", "admitted", grant
                p.reservations[rid] = (grant, now + ttl_ms)
                p.inflight += grant
            else:
                reason = "balance_wall" if hb <= hc else "collection_wall"
        p.update_eviction()
        return p.answer(status, reason, granted)

    def settle(self, pool: str, rid: str, actual: int | None, now: int) -> Decision:
        self._check_id(rid)
        if actual is not None and not _is_int(actual, 0, MAX_REQUEST):
            raise GateError("bad_amount", "actual out of range")
        p = self.pools.get(pool)
        if p is None:
            raise GateError("unknown_pool", "pool has no snapshot")
        p.housekeep(now)
        above = False
        if rid in p.reservations:
            reserved, _ = p.reservations.pop(rid)
            p.inflight -= reserved
            counted = reserved if actual is None else actual
            above = counted > reserved
            reason = "settled"
            p.add_usage(counted, now)
            p.resolve(rid, "settled", counted, now)
        elif rid in p.resolved:
            how, before, _ = p.resolved[rid]
            if actual is not None and how in ("expired", "released"):
                counted = max(0, actual - before)
                above = counted > 0
                reason = "late_settle"
                p.add_usage(counted, now)
                p.resolve(rid, "settled", before + counted, now)
            else:
                counted, reason = 0, "duplicate"
        else:
            counted = actual or 0
            above = counted > 0
            reason = "unreserved"
            p.add_usage(counted, now)
            p.resolve(rid, "settled", counted, now)
        hb, hc = p.headrooms()
        overrun = above and (hb < 0 or hc < 0)
        if overrun:
            p.overruns += 1
        p.update_eviction()
        return p.answer("ok", reason, counted, overrun)

    def release(self, pool: str, rid: str, now: int) -> Decision:
        self._check_id(rid)
        p = self.pools.get(pool)
        if p is None:
            raise GateError("unknown_pool", "pool has no snapshot")
        p.housekeep(now)
        reason, amount = "unknown_id", 0
        if rid in p.reservations:
            amount, _ = p.reservations.pop(rid)
            p.inflight -= amount
            p.resolve(rid, "released", 0, now)
            reason = "released"
        elif rid in p.resolved:
            reason = "duplicate"
        p.update_eviction()
        return p.answer("ok", reason, amount)

    def install_snapshot(self, pool: str, s: Snapshot, now: int) -> Decision:
        values = (s.balance, s.settled_usage, s.expiring, s.small_buffer, s.daily_cap,
                  s.evict_below)
        if not all(_is_int(v, 0, MAX_AMOUNT) for v in values):
            raise GateError("bad_amount", "snapshot fields must be non-negative integers")
        if not _is_int(s.valid_until_ms, 0, MAX_TIME) or s.valid_until_ms <= now:
            raise GateError("bad_time", "valid_until must be in the future")
        p = self.pools.get(pool)
        if p is None:
            p = self.pools[pool] = PoolModel(day=beijing_day(now))
        p.housekeep(now)
        p.snap_at, p.balance, p.expiring, p.buffer, p.cap = (
            now, s.balance, s.expiring, s.small_buffer, s.daily_cap)
        p.valid_until, p.evict_below = s.valid_until_ms, s.evict_below
        p.settled = min(s.settled_usage, p.ucum)
        p.snap_seq += 1
        p.update_eviction()
        return p.answer("ok", "installed", 0)

    def status(self, pool: str, now: int) -> Decision:
        p = self.pools.get(pool)
        if p is None:
            return _NO_SNAPSHOT
        p.housekeep(now)
        p.update_eviction()
        return p.answer("ok", "stale_snapshot" if now > p.valid_until else "status", now)
