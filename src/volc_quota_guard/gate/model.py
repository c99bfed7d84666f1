"""A pure-Python reference model of the gate: the specification the Lua is checked against.

Same verbs, same arguments, same answers as `resources/lua/*.lua`, on plain dicts. The
Hypothesis state machine in tests/gate/test_gate_model.py drives both and compares every answer.
Keep this file boring: clarity beats speed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..clock import beijing_day
from ..errors import GateError
from .values import MAX_AMOUNT, MAX_REQUEST, MAX_TIME, PPM, Decision, Snapshot, corrected, ladder_arg

RESOLVED_MS = 21_600_000  # resolved ids: 6 h
CARRY_MS = RESOLVED_MS  # an expired reservation this close to midnight counts on the next day too
TIMELINE_MS = 172_800_000  # timeline minutes: 48 h
SWEEP_LIMIT = 1000
TRIM_LIMIT = 100
CORR_HALF_LIFE_MS = 86_400_000  # the correction's excess over 1.0 halves per day
CORR_MIN_INPUT = 200  # estimates smaller than this teach nothing (template overhead)
XCORR_FLOOR = 1_100_000  # the exact class's least factor (template and version drift)
XCORR_CEIL = 1_500_000  # the exact class's miscount ceiling in the admission's risk


@dataclass(frozen=True)
class Held:
    """A live reservation: amount held, deadline, estimated input, input reserved (k applied),
    and whether the estimate is an exact count (its own class: kx, the exact ceiling)."""

    amount: int
    deadline: int
    est: int = 0
    est_res: int = 0
    exact: bool = False

    @classmethod
    def parse(cls, record: str) -> Held:
        """A reservation record as the Lua writes it: `amount:deadline:est:est_res[:x]`."""
        parts = record.split(":")
        exact = len(parts) == 5 and parts[4] == "x"
        amount, deadline, est, est_res = (int(v) for v in parts[:4])
        return cls(amount, deadline, est, est_res, exact)


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
    listed_at: int = 0
    corr: int = 0  # the peak measured ratio (ppm), 0 = none yet
    corr_at: int = 0
    corr_n: int = 0
    corr_min: int = 17 * PPM // 10
    corr_max: int = 3 * PPM
    inflight_est: int = 0
    inflight_est_res: int = 0
    dr_day: int = 0  # today's count reconciled from the billing API (snapshot.lua)
    dr_chain: int = 0
    dr_from: int = 0
    dr_best: int = 0
    dr_ucum: int = 0
    unsure: int = 0  # lifetime usage counted without a measurement
    carry_day: int = 0  # expired reservations Ark may bill on Beijing day carry_day
    carry: int = 0
    lost_carry_day: int = 0  # a lost generation's carry (recover.lua; the model has no recover)
    lost_carry: int = 0
    xcorr: int = 0  # the exact class's peak measured ratio (ppm), 0 = none yet
    xcorr_at: int = 0
    xcorr_n: int = 0
    inflight_xest: int = 0
    inflight_xest_res: int = 0
    hist_at: int = 0  # the state's generation: when it was created
    ladder: tuple[tuple[int, int], ...] = ()  # (expires at, free tokens) past the snapshot's lookahead
    k: int = PPM  # the correction now (derived, not stored)
    kx: int = XCORR_FLOOR  # the exact class's correction now (derived, not stored)
    reservations: dict[str, Held] = field(default_factory=dict)
    resolved: dict[str, tuple[str, int, int]] = field(default_factory=dict)  # id -> (how, counted, at)
    timeline: dict[int, int] = field(default_factory=dict)  # minute -> lifetime usage

    # -- walls -------------------------------------------------------------------------------
    def balance_wall(self) -> int:
        return self.balance + self.settled - self.expiring - self.buffer

    def cheap_margin(self) -> int:
        return max(0, corrected(self.inflight_est, self.k) - self.inflight_est_res)

    def exact_margin(self) -> int:
        return max(0, corrected(self.inflight_xest, self.kx) - self.inflight_xest_res)

    def margin(self) -> int:
        """What in-flight requests may use beyond their reservations if each one's prompt is
        under-counted by today's k, or kx for exact counts (they were reserved with the k of
        their time)."""
        return self.cheap_margin() + self.exact_margin()

    def held(self) -> int:
        return self.inflight + self.margin()

    def worst_case_inflight(self) -> int:
        """What the in-flight requests may consume if each prompt is under-counted by today's k
        and each output runs to its cap. The invariant: `held() >= worst_case_inflight()`, so a
        pool with headroom >= 0 stays within its walls however its in-flight requests settle."""
        return sum(h.amount - h.est_res + h.est * (self.kx if h.exact else self.k) // PPM
                   for h in self.reservations.values())

    def xcorr_max(self) -> int:
        """The most kx may learn: the pool's corr_max, never under the exact floor."""
        return max(self.corr_max, XCORR_FLOOR)

    def xceiling(self) -> int:
        """The exact class's miscount ceiling: XCORR_CEIL, at most what kx may learn."""
        return min(XCORR_CEIL, self.xcorr_max())

    def miscount_risk(self, est: int, est_res: int, exact: bool = False) -> int:
        """What the in-flight prompts, plus one of `est` reserved as `est_res`, could use beyond
        `held()` were each cheap count corr_max times too low (a class the pool never measured)
        and each exact count XCORR_CEIL times (at most corr_max). Each class's part is >= 0."""
        ce, cr, xe, xr = (0, 0, est, est_res) if exact else (est, est_res, 0, 0)
        cheap = (corrected(self.inflight_est + ce, self.corr_max)
                 - (self.inflight_est_res + cr) - self.cheap_margin())
        exact_risk = (corrected(self.inflight_xest + xe, self.xceiling())
                      - (self.inflight_xest_res + xr) - self.exact_margin())
        return max(0, cheap) + max(0, exact_risk)

    def unmeasured(self, h: Held, now: int) -> int:
        """A reservation whose usage never came, as counted: its output and its prompt at its
        class's miscount ceiling."""
        ceiling = max(self.xcorrection(now), self.xceiling()) if h.exact else self.corr_max
        return h.amount + max(0, corrected(h.est, ceiling) - h.est_res)

    def day_count(self) -> int:
        """Today's usage as the daily cap counts it: ours, or less where the API showed less."""
        carried = (self.carry if self.carry_day == self.day else 0) + \
            (self.lost_carry if self.lost_carry_day == self.day else 0)
        if self.dr_day != self.day:
            return carried + self.day_usage
        return carried + min(self.day_usage, self.dr_best + max(0, self.ucum - self.dr_ucum))

    def headrooms(self) -> tuple[int, int]:
        return (self.balance_wall() - (self.ucum + self.held()),
                self.cap - (self.day_count() + self.held()))

    # -- the estimate correction ---------------------------------------------------------------
    @staticmethod
    def decay(peak: int, at: int, now: int) -> int:
        """A peak ratio with its excess over 1.0 halved for each full day since `at`."""
        if peak <= PPM:
            return PPM
        halvings = min(60, max(0, now - at) // CORR_HALF_LIFE_MS)
        return PPM + (peak - PPM) // 2**halvings

    def decayed_peak(self, now: int) -> int:
        return self.decay(self.corr, self.corr_at, now)

    def correction(self, now: int) -> int:
        """k now: the decayed peak within [corr_min, corr_max]; corr_min is k before any
        measurement, covering a traffic class the pool has not seen yet."""
        return min(max(self.decayed_peak(now), self.corr_min), self.corr_max)

    def xcorrection(self, now: int) -> int:
        """kx now: the exact class's decayed peak within [XCORR_FLOOR, xcorr_max]."""
        return min(max(self.decay(self.xcorr, self.xcorr_at, now), XCORR_FLOOR), self.xcorr_max())

    def observe(self, est: int, measured: int, now: int, exact: bool = False) -> None:
        """A measured settle: its ratio becomes its class's peak when it reaches the decayed one."""
        if est < CORR_MIN_INPUT:
            return
        ratio = min((measured * PPM + est - 1) // est, self.xcorr_max() if exact else self.corr_max)
        if exact:
            self.xcorr_n = min(self.xcorr_n + 1, 1_000_000_000)
            if ratio >= self.decay(self.xcorr, self.xcorr_at, now):
                self.xcorr, self.xcorr_at = ratio, now
        else:
            self.corr_n = min(self.corr_n + 1, 1_000_000_000)
            if ratio >= self.decayed_peak(now):
                self.corr, self.corr_at = ratio, now
        self.k, self.kx = self.correction(now), self.xcorrection(now)

    def hold(self, rid: str, h: Held) -> None:
        self.reservations[rid] = h
        self.inflight += h.amount
        if h.exact:
            self.inflight_xest += h.est
            self.inflight_xest_res += h.est_res
        else:
            self.inflight_est += h.est
            self.inflight_est_res += h.est_res

    def unreserve(self, rid: str) -> Held:
        h = self.reservations.pop(rid)
        self.inflight -= h.amount
        if h.exact:
            self.inflight_xest -= h.est
            self.inflight_xest_res -= h.est_res
        else:
            self.inflight_est -= h.est
            self.inflight_est_res -= h.est_res
        return h

    # -- housekeeping ------------------------------------------------------------------------
    def add_usage(self, n: int, now: int, unsure: bool = False) -> None:
        if n <= 0:
            return
        self.ucum += n
        self.day_usage += n
        self.unsure += n if unsure else 0
        self.timeline[now // 60_000] = self.ucum

    def resolve(self, rid: str, how: str, counted: int, now: int) -> None:
        self.resolved[rid] = (how, counted, now)

    def carry_over(self, counted: int, now: int) -> None:
        """Usage of a call Ark may still run: this close to midnight, counted on the next day too."""
        next_day = beijing_day(now) + 1
        if beijing_day(now + CARRY_MS) == next_day:
            if self.carry_day != next_day:
                self.carry_day, self.carry = next_day, 0
            self.carry += counted

    def housekeep(self, now: int) -> None:
        today = beijing_day(now)
        if today > self.day:
            self.prev_day_usage = self.day_usage if today == self.day + 1 else 0
            self.day_usage = 0
            self.day = today
        due = sorted((h.deadline, rid) for rid, h in self.reservations.items() if h.deadline <= now)
        for _, rid in due[:SWEEP_LIMIT]:
            amount = self.unmeasured(self.unreserve(rid), now)
            self.add_usage(amount, now, unsure=True)
            self.resolve(rid, "expired", amount, now)
            self.expired_count += 1
            self.carry_over(amount, now)
        cutoff = now - RESOLVED_MS
        old = sorted((at, rid) for rid, (_, _, at) in self.resolved.items() if at <= cutoff)
        for _, rid in old[:TRIM_LIMIT]:
            del self.resolved[rid]
        for minute in sorted(m for m in self.timeline if m <= (now - TIMELINE_MS) // 60_000)[:TRIM_LIMIT]:
            self.tl_floor = max(self.tl_floor, self.timeline.pop(minute))
        self.k, self.kx = self.correction(now), self.xcorrection(now)

    def update_eviction(self) -> None:
        hb, hc = self.headrooms()
        if hb < self.evict_below:
            self.evicted_until, self.evicted_wall = MAX_TIME, "balance"
        elif hc < self.evict_below:
            self.evicted_until = (self.day + 1) * 86_400_000 - 28_800_000
            self.evicted_wall = "collection"
        else:
            self.evicted_until, self.evicted_wall = 0, ""

    def answer(self, status: str, reason: str, amount: int, overrun: bool = False,
               input_reserved: int = 0) -> Decision:
        hb, hc = self.headrooms()
        ceiling = self.corr_max or 3 * PPM
        worst = self.inflight + sum(max(0, corrected(est, ceiling) - res) for est, res in (
            (self.inflight_est, self.inflight_est_res), (self.inflight_xest, self.inflight_xest_res)))
        return Decision(status, reason, amount, min(hb, hc), self.ucum + self.held(),
                        self.balance_wall(), self.day_count() + self.held(), self.cap,
                        self.inflight, self.evicted_until, overrun, self.balance, input_reserved,
                        self.k, self.kx, self.hist_at, self.day, self.day_usage + worst,
                        self.ucum + worst, self.settled, self.ucum, self.carry_day, self.carry)


_NO_SNAPSHOT = Decision("refused", "no_snapshot", 0, 0, 0, 0, 0, 0, 0, 0, False, 0, 0, 0, 0)


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
                now: int, input_tokens: int = 0, exact: bool = False, renew: bool = False,
                run_ms: int = 0) -> Decision:
        least = wanted if least is None else least
        self._check_id(rid)
        if not _is_int(wanted, 1, MAX_REQUEST) or not _is_int(least, 1, wanted) \
                or not _is_int(input_tokens, 0, least):
            raise GateError("bad_amount", "amounts out of range")
        if not _is_int(ttl_ms, 1000, 604_800_000):
            raise GateError("bad_ttl", "ttl out of range")
        if not _is_int(run_ms, 0, MAX_TIME):
            raise GateError("bad_time", "the run must be empty or ms")
        p = self.pools.get(pool)
        if p is None:
            return _NO_SNAPSHOT
        p.housekeep(now)
        status, reason, granted = "refused", "", 0
        est_res = corrected(input_tokens, p.kx if exact else p.k)
        if rid in p.reservations:
            h = p.reservations[rid]
            status, reason, granted, est_res = "ok", "duplicate", h.amount, h.est_res
            if now + ttl_ms > h.deadline:  # asked again while it runs: the deadline moves on
                p.reservations[rid] = replace(h, deadline=now + ttl_ms)
        elif renew:
            reason = "unknown_id"
        elif rid in p.resolved:
            reason = "resolved"
        elif now > p.valid_until:
            reason = "stale_snapshot"
        else:
            extra = est_res - input_tokens
            hb, hc = p.headrooms()
            # Were every in-flight prompt corr_max times its count, usage would stay within the
            # true free balance (wall + buffer) and the daily cap.
            risk = p.miscount_risk(input_tokens, est_res, exact)
            hb, hc = min(hb, hb + p.buffer - risk), min(hc, hc - risk)
            # packages that expire while Ark may still run this call
            off = sum(a for t, a in p.ladder if t <= now + run_ms) if run_ms > 0 else 0
            grant = min(wanted + extra, hb - off, hc)
            if grant >= least + extra:
                status, reason, granted = "ok", "admitted", grant
                p.hold(rid, Held(grant, now + ttl_ms, input_tokens, est_res, exact))
            elif off > 0 and min(hb, hc) >= least + extra:
                reason = "expiry_wall"  # it fits unless Ark runs it past an expiry
            else:
                reason = "balance_wall" if hb <= hc else "collection_wall"
        p.update_eviction()
        return p.answer(status, reason, granted, input_reserved=est_res)

    def settle(self, pool: str, rid: str, actual: int | None, now: int,
               measured_input: int | None = None, estimated: bool = False,
               running: bool = False) -> Decision:
        self._check_id(rid)
        if actual is not None and not _is_int(actual, 0, MAX_REQUEST):
            raise GateError("bad_amount", "actual out of range")
        if measured_input is not None and not _is_int(measured_input, 0, MAX_REQUEST):
            raise GateError("bad_amount", "measured input out of range")
        p = self.pools.get(pool)
        if p is None:
            raise GateError("unknown_pool", "pool has no snapshot")
        p.housekeep(now)
        above = False
        if rid in p.reservations:
            h = p.unreserve(rid)
            unsure = actual is None or estimated
            counted = actual if actual is not None and not unsure else max(actual or 0, p.unmeasured(h, now))
            above = actual is not None and actual > h.amount
            reason = "settled"
            p.add_usage(counted, now, unsure=unsure)
            if running or estimated:
                p.carry_over(counted, now)
            p.resolve(rid, "settled", counted, now)
            if measured_input is not None and actual is not None:
                p.observe(h.est, measured_input, now, h.exact)
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
            amount = p.unreserve(rid).amount
            p.resolve(rid, "released", 0, now)
            reason = "released"
        elif rid in p.resolved:
            reason = "duplicate"
        else:
            p.resolve(rid, "released", 0, now)  # a reserve landing later finds it resolved
        p.update_eviction()
        return p.answer("ok", reason, amount)

    def install_snapshot(self, pool: str, s: Snapshot, now: int) -> Decision:
        values = (s.balance, s.settled_usage, s.expiring, s.small_buffer, s.daily_cap,
                  s.evict_below)
        if not all(_is_int(v, 0, MAX_AMOUNT) for v in values):
            raise GateError("bad_amount", "snapshot fields must be non-negative integers")
        if not _is_int(s.valid_until_ms, 0, MAX_TIME) or s.valid_until_ms <= now:
            raise GateError("bad_time", "valid_until must be in the future")
        if not (_is_int(s.correction_max_ppm, PPM, 100 * PPM)
                and _is_int(s.correction_min_ppm, PPM, s.correction_max_ppm)):
            raise GateError("bad_amount", "correction: 1e6 <= min <= max <= 1e8 ppm")
        if not all(v is None or _is_int(v, 0, hi) for v, hi in (
                (s.day_step, MAX_AMOUNT), (s.day_since_ms, MAX_TIME), (s.day_from, MAX_AMOUNT))):
            raise GateError("bad_amount", "day reconcile: step, since and from must be non-negative integers")
        p = self.pools.get(pool)
        if not _is_int(s.generation, 0, MAX_TIME):
            raise GateError("bad_amount", "generation must be a non-negative integer")
        if not _is_int(s.listed_at_ms, 0, MAX_TIME):
            raise GateError("bad_time", "listed_at must be empty or ms since the epoch")
        if not all(_is_int(t, 0, MAX_TIME) and _is_int(a, 0, MAX_AMOUNT) for t, a in s.ladder) \
                or len(ladder_arg(s)) > 4096:
            raise GateError("bad_amount", 'the expiry ladder must be "t:a,t:a" (at most 4096 bytes)')
        if s.listed_at_ms and p is not None and s.listed_at_ms < p.listed_at <= now:
            raise GateError("older_listing", "a snapshot from a later billing listing is installed")
        if s.generation and (p is None or max(p.hist_at, 1) != s.generation):
            raise GateError("generation", "the pool state is not the generation this snapshot was "
                                          "computed from")
        if p is None:
            p = self.pools[pool] = PoolModel(day=beijing_day(now), hist_at=now)
        p.housekeep(now)
        p.listed_at = max(p.listed_at, s.listed_at_ms) if p.listed_at <= now else s.listed_at_ms
        p.snap_at, p.balance, p.expiring, p.buffer, p.cap = (
            now, s.balance, s.expiring, s.small_buffer, s.daily_cap)
        p.valid_until, p.evict_below = s.valid_until_ms, s.evict_below
        p.ladder = s.ladder
        p.settled = min(s.settled_usage, p.ucum)
        p.snap_seq += 1
        p.corr_min, p.corr_max = s.correction_min_ppm, s.correction_max_ppm
        p.k, p.kx = p.correction(now), p.xcorrection(now)
        counted = p.day_count()
        known_from = p.dr_from if s.day_from is None else s.day_from
        if s.day_step is not None and p.dr_day == p.day:
            p.dr_chain, p.dr_from = p.dr_chain + s.day_step, known_from
        elif s.day_step is not None and 0 < s.day_since_ms and beijing_day(s.day_since_ms) < p.day:
            p.dr_day, p.dr_chain, p.dr_from = p.day, s.day_step, known_from
        else:
            p.dr_day, p.dr_chain, p.dr_from = p.day, p.day_usage + p.inflight, p.ucum
        p.dr_best, p.dr_ucum = min(counted, p.dr_chain + max(0, p.ucum - p.dr_from)), p.ucum
        p.update_eviction()
        return p.answer("ok", "installed", 0)

    def status(self, pool: str, now: int) -> Decision:
        p = self.pools.get(pool)
        if p is None:
            return _NO_SNAPSHOT
        p.housekeep(now)
        p.update_eviction()
        return p.answer("ok", "stale_snapshot" if now > p.valid_until else "status", now)
