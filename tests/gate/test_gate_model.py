"""The Lua gate against its pure-Python reference model, driven by Hypothesis."""

from __future__ import annotations

import uuid

import hypothesis.strategies as st
from hypothesis import event, settings
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from backend import TEST_REDIS_URL
from volc_quota_guard.clock import ManualClock, beijing_day, next_beijing_midnight_ms
from volc_quota_guard.errors import GateError
from volc_quota_guard.gate import PPM, Decision, Gate, Snapshot
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.gate.model import RESOLVED_MS, GateModel, Held
from volc_quota_guard.gate.store import connect

POOLS = ["acct-a/model-x", "acct-b/model-x"]
IDS = [f"call-{i}" for i in range(8)]
START = 1_786_636_800_000 - 40 * 60_000  # 2026-08-13 23:20 Beijing: a rollover is near
STATE_FIELDS = ["balance", "settled", "expiring", "buffer", "cap", "valid_until", "ucum", "day",
                "day_usage", "prev_day_usage", "inflight", "overruns", "expired_count",
                "evicted_until", "tl_floor", "snap_seq", "corr", "corr_at", "corr_n", "corr_min",
                "corr_max", "inflight_est", "inflight_est_res", "dr_day", "dr_chain", "dr_from",
                "dr_best", "dr_ucum", "unsure", "xcorr", "xcorr_at", "xcorr_n", "inflight_xest",
                "inflight_xest_res", "carry_day", "carry", "listed_at"]

amounts = st.integers(min_value=1, max_value=200_000)
bad_amounts = st.sampled_from([-1, 0, 1.5, 10**12, "12abc", ""])


class GateVersusModel(RuleBasedStateMachine):
    """Random reserve/settle/release/snapshot/time sequences give identical answers and state."""

    store_url: str | None = None  # None: the embedded store

    def __init__(self) -> None:
        super().__init__()
        self.client = connect(self.store_url)
        self.keyspace = KeySpace(f"vqgprop-{uuid.uuid4().hex[:10]}")
        self.clock = ManualClock(START)
        self.gate = Gate(self.client, self.keyspace, self.clock)
        self.model = GateModel()
        self.last_ucum = {p: 0 for p in POOLS}
        self.last_day = {p: (0, 0) for p in POOLS}
        self.overrun_seen = {p: False for p in POOLS}

    def teardown(self) -> None:
        for key in self.client.scan_iter(f"{self.keyspace.prefix}:*", count=1000):
            self.client.delete(key)

    def remembered(self, pool: str, rid: str) -> bool:
        """Resolved and still within the retention (so the next call cannot have trimmed it)."""
        p = self.model.pools.get(pool)
        return p is not None and rid in p.resolved and p.resolved[rid][2] > self.now - RESOLVED_MS

    @property
    def now(self) -> int:
        return self.clock.now_ms()

    def both(self, lua, model) -> Decision | None:
        """Run one verb on both; they must agree on the answer or on the error code."""
        try:
            expected = model()
        except GateError as exc:
            try:
                lua()
            except GateError as got:
                assert got.code == exc.code
                return None
            raise AssertionError(f"model raised {exc.code}, Lua did not") from None
        got = lua()
        assert got == expected
        event(f"{got.status}:{got.reason}")
        return got

    @initialize(balance=st.integers(200_000, 3_000_000), cap=st.integers(100_000, 2_000_000))
    def first_pool_has_a_snapshot(self, balance, cap):
        self.snapshot(POOLS[0], balance, 0, 0, 50_000, cap, 600, 1_000, 2 * PPM, PPM)

    @rule(pool=st.sampled_from(POOLS), balance=st.integers(0, 3_000_000),
          settled=st.integers(0, 3_000_000), expiring=st.integers(0, 300_000),
          buffer=st.integers(0, 100_000), cap=st.integers(1, 2_500_000),
          validity_min=st.integers(5, 600), evict_below=st.integers(0, 5_000),
          corr_min=st.integers(PPM, 3 * PPM), corr_extra=st.integers(0, 2 * PPM),
          day=st.none() | st.tuples(st.none() | st.integers(0, 3_000_000),
                                    st.integers(0, 2 * 86_400_000), st.none() | st.floats(0.0, 1.0)),
          listed_ago=st.none() | st.integers(0, 3_600_000),
          ladder=st.lists(st.tuples(st.integers(0, 86_400), st.integers(0, 500_000)), max_size=4))
    def snapshot(self, pool, balance, settled, expiring, buffer, cap, validity_min, evict_below,
                 corr_min, corr_extra, day=None, listed_ago=None, ladder=()):
        # The day's count: the API's step since a sync up to two days back, and a lifetime
        # usage counted a reconcile lag ago (up to today's).
        step, since_ago, from_frac = day if day is not None else (None, 0, None)
        p = self.model.pools.get(pool)
        snap = Snapshot(balance, settled, expiring, buffer, cap,
                        self.now + validity_min * 60_000, evict_below,
                        correction_min_ppm=corr_min, correction_max_ppm=corr_min + corr_extra,
                        day_step=step, day_since_ms=max(0, self.now - since_ago),
                        day_from=None if from_frac is None else int((p.ucum if p else 0) * from_frac),
                        listed_at_ms=0 if listed_ago is None else self.now - listed_ago,
                        # Expiries past the snapshot's validity (seconds after it), soonest first.
                        ladder=tuple(sorted((self.now + validity_min * 60_000 + 1000 * s, a)
                                            for s, a in ladder)))
        self.both(lambda: self.gate.install_snapshot(pool, snap),
                  lambda: self.model.install_snapshot(pool, snap, self.now))
        self.overrun_seen[pool] = False  # a new wall: start the no-overrun count afresh

    @rule(pool=st.sampled_from(POOLS), rid=st.sampled_from(IDS), ttl_s=st.integers(1, 3600))
    def renew(self, pool, rid, ttl_s):
        live = pool in self.model.pools and rid in self.model.pools[pool].reservations
        before = self.model.pools[pool].reservations[rid].deadline if live else None
        d = self.both(lambda: self.gate.renew(pool, rid, ttl_s * 1000),
                      lambda: self.model.reserve(pool, rid, 1, 1, ttl_s * 1000, self.now, renew=True))
        if d is not None:
            assert d.reason != "admitted", "a renewal admitted"
            if before is not None and before > self.now:  # still live (else swept: expired)
                after = self.model.pools[pool].reservations[rid].deadline
                assert after == max(before, self.now + ttl_s * 1000)

    @rule(pool=st.sampled_from(POOLS), rid=st.sampled_from(IDS), wanted=amounts,
          least_frac=st.floats(0.01, 1.0), input_frac=st.floats(0.0, 1.0), ttl_s=st.integers(1, 3600),
          exact=st.booleans(), run_s=st.sampled_from([0, 600, 7_200, 86_400, 200_000]))
    def reserve(self, pool, rid, wanted, least_frac, input_frac, ttl_s, exact, run_s=0):
        least = max(1, int(wanted * least_frac))
        est = int(least * input_frac)  # the tokenizer's part, reserved times k (exact: kx)
        remembered = self.remembered(pool, rid)
        d = self.both(lambda: self.gate.reserve(pool, rid, wanted, least, ttl_s * 1000, est, exact,
                                                run_ms=run_s * 1000),
                      lambda: self.model.reserve(pool, rid, wanted, least, ttl_s * 1000, self.now, est,
                                                 exact, run_ms=run_s * 1000))
        if d is not None and d.reason == "admitted":
            assert not remembered, "a resolved id was reserved again"
            extra = d.input_reserved - est
            p = self.model.pools[pool]
            assert extra >= 0 and d.input_reserved * PPM >= est * (p.kx if exact else d.correction_ppm)
            assert p.reservations[rid].exact == exact
            assert least + extra <= d.amount <= wanted + extra
            if not self.overrun_seen[pool]:
                assert d.used_balance <= d.balance_wall and d.used_today <= d.daily_cap
                # ... and within the wall less what expires while Ark may still run this call
                off = sum(a for t, a in p.ladder if t <= self.now + run_s * 1000)
                assert d.used_balance <= d.balance_wall - off or d.reason == "duplicate"

    @rule(pool=st.sampled_from(POOLS), rid=st.sampled_from(IDS),
          actual=st.one_of(st.none(), st.integers(0, 500_000)),
          measured=st.one_of(st.none(), st.integers(0, 600_000)), estimated=st.booleans(),
          running=st.booleans())
    def settle(self, pool, rid, actual, measured, estimated, running):
        remembered = self.remembered(pool, rid)
        d = self.both(lambda: self.gate.settle(pool, rid, actual, measured, estimated, running),
                      lambda: self.model.settle(pool, rid, actual, self.now, measured, estimated,
                                                running))
        if d is not None:
            self.overrun_seen[pool] |= d.overrun
            if d.reason in ("settled", "unreserved"):
                assert not remembered, "a resolved id was counted twice"

    @precondition(lambda self: any(p.reservations for p in self.model.pools.values()))
    @rule(data=st.data(), ratio=st.floats(0.0, 1.0))
    def undercounting_tokenizer_settles(self, data, ratio):
        """An in-flight request whose prompt the tokenizer under-counted — up to the worst ratio the
        pool has seen (k) — and whose output ran to its cap: no wall is passed if none was full."""
        pool = data.draw(st.sampled_from([p for p in POOLS if p in self.model.pools
                                          and self.model.pools[p].reservations]))
        self.status(pool)  # housekeeping first, so what we read is what the settle sees
        p = self.model.pools[pool]
        if not p.reservations:
            return
        rid = data.draw(st.sampled_from(sorted(p.reservations)))
        h: Held = p.reservations[rid]
        k = p.kx if h.exact else p.k  # an exact count under-counted by up to its own correction
        true_input = int(h.est * k // PPM * ratio) if ratio < 1.0 else h.est * k // PPM
        hb, hc = p.headrooms()
        d = self.both(lambda: self.gate.settle(pool, rid, h.amount - h.est_res + true_input, true_input),
                      lambda: self.model.settle(pool, rid, h.amount - h.est_res + true_input, self.now,
                                                true_input))
        assert d is not None and d.reason == "settled"
        if hb >= 0 and hc >= 0:
            assert p.ucum <= p.balance_wall() and p.day_usage <= p.cap, "an under-count passed a wall"
            assert p.ucum + p.worst_case_inflight() <= p.balance_wall()
            assert p.day_usage + p.worst_case_inflight() <= p.cap

    @rule(pool=st.sampled_from(POOLS), rid=st.sampled_from(IDS))
    def release(self, pool, rid):
        self.both(lambda: self.gate.release(pool, rid),
                  lambda: self.model.release(pool, rid, self.now))

    @rule(pool=st.sampled_from(POOLS), rid=st.sampled_from(IDS), bad=bad_amounts)
    def bad_input_writes_nothing(self, pool, rid, bad):
        before = self.client.hgetall(self.keyspace.pool(pool).state)
        for call in (lambda: self.gate.reserve(pool, rid, bad),
                     lambda: self.gate.reserve(pool, rid, 10, bad if bad != "" else -3),
                     lambda: self.gate.settle(pool, rid, bad if bad not in ("", 0) else -3)):
            try:
                call()
            except GateError as exc:
                assert exc.code == "bad_amount"
            else:
                raise AssertionError(f"{bad!r} was accepted")
        assert self.client.hgetall(self.keyspace.pool(pool).state) == before

    @rule(seconds=st.integers(1, 600))
    def time_passes(self, seconds):
        self.clock.advance(seconds * 1000)

    @rule(hours=st.integers(1, 12))
    def long_quiet(self, hours):
        self.clock.advance(hours * 3_600_000)

    @rule()
    def beijing_midnight(self):
        self.clock.set(next_beijing_midnight_ms(self.now) + 1_000)

    @precondition(lambda self: bool(self.model.pools))
    @rule(pool=st.sampled_from(POOLS))
    def status(self, pool):
        self.both(lambda: self.gate.status(pool).decision,
                  lambda: self.model.status(pool, self.now))

    @invariant()
    def state_matches_model_and_invariants_hold(self):
        for pool in POOLS:
            keys = self.keyspace.pool(pool)
            raw = {k.decode(): v.decode() for k, v in self.client.hgetall(keys.state).items()}
            m = self.model.pools.get(pool)
            if m is None:
                assert raw == {}, "a pool without a snapshot was written"
                continue
            for name in STATE_FIELDS:
                assert int(raw[name]) == getattr(m, name), name
            live = {k.decode(): Held.parse(v.decode())
                    for k, v in self.client.hgetall(keys.reservations).items()}
            assert live == m.reservations
            assert m.inflight == sum(h.amount for h in live.values()), "in-flight != live reservations"
            assert m.inflight_est == sum(h.est for h in live.values() if not h.exact)
            assert m.inflight_xest == sum(h.est for h in live.values() if h.exact)
            assert m.held() >= m.worst_case_inflight(), "in-flight held less than its worst case"
            assert not set(live) & set(m.resolved), "an id is both live and resolved"
            assert m.ucum >= self.last_ucum[pool], "lifetime usage decreased"
            day, usage = self.last_day[pool]
            assert m.day >= day
            if m.day == day:
                assert m.day_usage >= usage, "today's usage decreased"
            self.last_ucum[pool] = m.ucum
            self.last_day[pool] = (m.day, m.day_usage)
            assert m.day == beijing_day(self.now) or m.day == self.last_day[pool][0]


class OnEmbeddedStore(GateVersusModel):
    """The embedded store (fakeredis, Lua 5.4): always checked, the demo and Redis-less users run on it."""


class OnTestRedis(GateVersusModel):
    """The real Redis server (Lua 5.1) when VQG_TEST_REDIS_URL names one, as in CI."""

    store_url = TEST_REDIS_URL


_PROPERTY = settings(max_examples=200, stateful_step_count=30, deadline=None)
OnEmbeddedStore.TestCase.settings = _PROPERTY
OnTestRedis.TestCase.settings = _PROPERTY
test_gate_matches_model_on_embedded_store = OnEmbeddedStore.TestCase
if TEST_REDIS_URL:  # without a server the embedded run above is the whole check
    test_gate_matches_model_on_redis = OnTestRedis.TestCase
