"""Where a pool's history begins: a first start on a busy account, state lost under running
processes (issue 14). Fake Volcengine over HTTP → SyncService → gate, on one manual clock."""

from __future__ import annotations

import contextlib
import json
import logging

import pytest

from sync.conftest import ACCOUNT, MIN, POOL, beijing_ms
from volc_quota_guard.gate import Decision, Gate, Snapshot
from volc_quota_guard.gate import scripts as gate_scripts
from volc_quota_guard.limit import LimitState, assumed_lag_ms
from volc_quota_guard.sync import SyncService
from volc_quota_guard.volcengine.packages import PoolSpec

HELD = {"cold_start_admit_tokens": 0, "unseen_day_tokens": 200_000}  # the production defaults


def _wipe(w) -> None:
    """Every key of the world's store goes (its own prefix on the shared server: a FLUSHALL)."""
    for key in w.client.scan_iter(f"{w.keyspace.prefix}:*", count=1000):
        w.client.delete(key)


def _busy_start(make_world, **settings):
    """Issue 14 run 1: 150,300 tokens ran straight on Ark a minute before the guard's first start;
    the API (4 min behind) does not show them. Then traffic as fast as it goes."""
    w = make_world("2026-08-20 10:00", lag_minutes=4, small_buffer=10_000, **settings)
    w.fake.add_package(POOL, 300_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    w.fake.consume(POOL, 150_300)
    svc = w.service()
    return w, svc


def test_a_first_start_on_a_busy_account_keeps_the_unseen_bound_off_and_bills_nothing(make_world, caplog):
    """The first sync logs why, keeps the unseen bound (200,000) off the wall from the start
    instead of holding the pool, serves what is left above it at once, and nothing is billed;
    without the bound the same run bills (issue 14 run 1)."""
    w, svc = _busy_start(make_world, **HELD)
    with caplog.at_level(logging.WARNING, logger="volc_quota_guard.sync"):
        w.run("2026-08-20 10:20", every_ms=5_000, tokens=2_000, svc=svc)
    assert ("🕒 [COLD-START] acct-a/deepseek-v4-flash-ga-260731: the guard's history of this pool "
            "begins now; 200,000 tokens assumed used unseen are off today's cap until Beijing "
            "midnight; the balance wall keeps 200,000 tokens off until the API shows that much "
            "settled (a ceiling for at most 8 h, the lowest estimate after; no quiet stretch takes "
            "the balance as exact before 25 h)") in caplog.text
    assert caplog.text.count("[COLD-START]") == 1
    st = w.gate.status(POOL)
    assert st.get("hold_until") == 0
    # The wall is the first balance (300,000: the API does not show the 150,300) less the bound
    # and SMALL_BUFFER: 90,000, all of it served in the first 20 minutes.
    assert 80_000 <= w.served <= 90_000 and w.refused > 0
    w.run("2026-08-20 11:00", every_ms=5_000, tokens=2_000, svc=svc)
    t = w.totals()
    assert (t.billed, t.burned) == (0, 0), t

    # The same run without the bound and with the operator's allowance wide open bills.
    old, svc = _busy_start(make_world, cold_start_admit_tokens=10**9, unseen_day_tokens=0)
    for _ in range(150):  # as fast as it goes: 2,000 tokens every half second
        svc.tick()
        old.request(2_000, duration_ms=500)
    assert old.totals().billed > 100_000


def test_a_first_start_without_an_unseen_bound_holds_for_the_lag(make_world, caplog):
    """An operator who says nothing ran unseen (VQG_UNSEEN_DAY_TOKENS=0) still gets the hold: the
    pool admits nothing (VQG_COLD_START_ADMIT_TOKENS) until its history covers Δ (20 min), then
    serves again, and the 150,300 that did run unseen settle inside the 4-min lag: no bill."""
    w, svc = _busy_start(make_world, cold_start_admit_tokens=0, unseen_day_tokens=0)
    with caplog.at_level(logging.WARNING, logger="volc_quota_guard.sync"):
        w.run("2026-08-20 10:20", every_ms=5_000, tokens=2_000, svc=svc)
    assert "; held until 10:20 (Beijing): the balance API may not show the last 20 min" in caplog.text
    assert w.served == 0 and w.refused > 200
    held = w.gate.status(POOL)
    assert held.get("hold_until") == beijing_ms("2026-08-20 10:20") and held.decision.headroom <= 0
    w.clock.advance(1_000)  # the sync runs a second after the hold's end
    w.run("2026-08-20 11:00", every_ms=5_000, tokens=2_000, svc=svc)
    assert w.gate.status(POOL).get("hold_until") == 0
    assert w.served >= 50_000
    t = w.totals()
    assert (t.billed, t.burned) == (0, 0), t


@pytest.mark.parametrize("first", [0, 60_000])
def test_what_ran_unseen_takes_no_more_than_the_first_balance(make_world, first):
    """Usage before the history began drew on the packages there were, and a free balance stops
    at 0 (the rest is billed): it can take no more than the first balance off, and nothing off a
    package that arrives later. Before stop 42 the young ceiling kept all 200,000 off: fuzz seed 0
    (an empty pool whose package came five hours in) refused its whole first evening."""
    w = make_world("2026-08-20 10:00", lag_minutes=4, small_buffer=10_000, **HELD)
    if first:
        w.fake.add_package(POOL, first, acquired_ms=beijing_ms("2026-08-19 09:00"))
    svc = w.service()
    svc.tick()
    young = LimitState.from_json(w.gate.records.limit_state(POOL))
    assert young.unseen_room == first and young.unseen_bound == 200_000
    w.clock.advance(5 * MIN)
    w.fake.add_package(POOL, 500_000, acquired_ms=w.clock.now_ms())
    w.clock.advance(5 * MIN)  # the API shows it
    w.idle("2026-08-20 10:30", svc)
    st = w.gate.status(POOL)
    assert st.get("balance") == first + 500_000
    assert st.decision.balance_wall == first + 500_000 - first - 10_000  # `first` off, not 200,000
    w.run("2026-08-20 12:00", every_ms=MIN, tokens=20_000, svc=svc)
    assert w.totals().billed == 0 and w.served >= 300_000


def test_a_wipe_under_two_processes_is_reported_by_the_one_that_remembers(make_world, caplog):
    """After a wipe a fresh process recreates the pool (it knows nothing: COLD-START, not held);
    the running one finds the generation changed, reports ⛔ STATE-LOST, marks it in Redis,
    raises today's count to its checkpoint and syncs at once: the pool is held as lost state,
    with what it saw unsettled kept off the wall; both processes see the hold."""
    w = make_world("2026-08-20 13:00", lag_minutes=4, small_buffer=10_000, **HELD)
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    old = w.service()
    w.idle("2026-08-20 13:21", old)
    w.run("2026-08-20 14:05", every_ms=20_000, tokens=5_000, svc=old)
    old.tick()  # its checkpoint of today
    today = w.gate.status(POOL).get("day_usage")
    assert today >= 600_000
    _wipe(w)
    fresh = w.service()
    with caplog.at_level(logging.WARNING, logger="volc_quota_guard.sync"):
        fresh.tick()
        assert "[COLD-START]" in caplog.text and "[STATE-LOST]" not in caplog.text
        st = w.gate.status(POOL)
        assert st.get("hist_lost") == 0 and st.get("hold_until") == 0
        assert st.decision.balance_wall == st.get("balance") - 200_000 - 10_000  # A alone
        old.tick()
    lost = [r.getMessage() for r in caplog.records if "[STATE-LOST]" in r.getMessage()]
    assert len(lost) == 1 and f"today's usage restored to {today:,}" in lost[0], lost
    assert "; the next sync keeps " in lost[0] and "off the balance wall" in lost[0]
    st = w.gate.status(POOL)
    assert st.get("hist_lost") == 1 and st.get("day_usage") == today
    assert st.get("hold_until") == st.get("hist_at") + 20 * MIN  # the old process's sync, this tick
    assert st.decision.daily_cap == 2_000_000 - 200_000  # today's unseen part, whoever created it
    young = LimitState.from_json(w.gate.records.limit_state(POOL))
    assert young.lost and young.unseen_bound > 200_000  # the margin and what the old one saw unsettled
    for svc in (old, fresh):
        assert w.gate.reserve(POOL, f"probe-{id(svc)}", 1_000).reason == "balance_wall"
    old.tick()
    assert sum("[STATE-LOST]" in r.getMessage() for r in caplog.records) == 1, "logged once"


def test_a_checkpoint_counts_in_flight_prompts_at_the_miscount_ceiling(make_world, caplog):
    """A wipe takes the in-flight reservations with it; their settles then find nothing, so the
    checkpoint counts them as a settle without usage would: the prompts at corr_max (red team)."""
    w = make_world("2026-08-20 13:00", lag_minutes=4, small_buffer=10_000, **HELD)
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    old = w.service()
    w.idle("2026-08-20 13:21", old)
    w.run("2026-08-20 13:40", every_ms=MIN, tokens=5_000, svc=old)
    d = w.gate.reserve(POOL, "in-flight", 20_000, input_tokens=10_000)
    assert d.admitted and d.input_reserved == 17_000
    old.tick()
    st = w.gate.status(POOL)
    today = st.get("day_usage") + st.get("inflight") + (30_000 - 17_000)  # 10,000 x 3.0, held at 1.7
    _wipe(w)
    with caplog.at_level(logging.WARNING, logger="volc_quota_guard.sync"):
        w.clock.advance(MIN)
        old.tick()
    lost = [r.getMessage() for r in caplog.records if "[STATE-LOST]" in r.getMessage()]
    assert len(lost) == 1 and f"today's usage restored to {today:,}" in lost[0], lost


def test_counters_gone_with_the_sync_record_kept_is_state_lost_for_any_process(make_world, caplog):
    """The pool's keys vanish but the account's sync record survives: even a process that never
    saw the pool knows from Redis that it had a history, and holds it as lost state while the
    process that was running (it polled a minute ago) has not polled the new generation; once
    it has, its view is in the bound and the hold ends."""
    w = make_world("2026-08-20 13:00", lag_minutes=4, **HELD)
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    first = w.service()
    w.idle("2026-08-20 13:21", first)
    w.run("2026-08-20 13:40", every_ms=MIN, tokens=5_000, svc=first)
    for key in w.client.scan_iter(f"{w.keyspace.prefix}:{{{POOL}}}:*"):
        w.client.delete(key)
    assert w.client.exists(w.keyspace.sync_meta(ACCOUNT))
    w.clock.advance(31 * MIN)  # the next interval sync
    first.heartbeat(ACCOUNT, w.clock.now_ms() - 1_000)  # it polls on (a second ago)
    newcomer = w.service()
    with caplog.at_level(logging.WARNING, logger="volc_quota_guard.sync"):
        newcomer.tick()
    assert "⛔ [STATE-LOST] acct-a/deepseek-v4-flash-ga-260731: the pool's counters" in caplog.text
    assert "today's usage before the loss is unknown" in caplog.text
    st = w.gate.status(POOL)
    assert st.get("hist_lost") == 1 and st.get("hold_until") > w.clock.now_ms()
    assert st.decision.daily_cap == 2_000_000 - 200_000
    assert st.decision.balance_wall == 0  # held: VQG_COLD_START_ADMIT_TOKENS
    newcomer.tick()
    assert w.gate.status(POOL).get("hold_until") > w.clock.now_ms(), "still waiting for the first"
    w.clock.advance(newcomer.report_window_ms() + 1_000)
    first.tick()  # polls the new generation: says what it saw unsettled, and syncs
    st = w.gate.status(POOL)
    young = LimitState.from_json(w.gate.records.limit_state(POOL))
    assert st.get("hold_until") == 0 and young.lost and young.unseen_bound >= 200_000
    assert st.decision.balance_wall == st.get("balance") - young.unseen_bound - 50_000


def test_a_lost_generation_waits_a_few_polls_and_not_for_a_process_that_stopped(make_world):
    """A process that stopped cleanly took its stamp with it: not waited for. The lost generation
    is held only for the report window (three polls and 2 s: any live process reports by then),
    then serves under the bound of what this one saw."""
    w = make_world("2026-08-20 13:00", lag_minutes=4, **HELD)
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    gone, svc = w.service(), w.service()
    gone.tick()
    w.idle("2026-08-20 13:21", svc)
    gone.stop()
    assert w.gate.records.sync_meta(ACCOUNT)[f"seen:{gone.owner}"].startswith("stopped:")
    w.run("2026-08-20 13:40", every_ms=MIN, tokens=5_000, svc=svc)
    _wipe(w)
    w.clock.advance(1_000)
    svc.tick()
    st = w.gate.status(POOL)
    assert st.get("hist_lost") == 1 and st.get("hold_until") > w.clock.now_ms()
    w.clock.advance(svc.report_window_ms() + 1_000)
    svc.tick()
    st = w.gate.status(POOL)
    assert st.get("hold_until") == 0 and st.decision.balance_wall > 0


def test_a_wipe_after_a_young_history_ended_by_age_keeps_its_bound_in_a_process_that_only_polled(
        make_world):
    """Fuzz seed 1602's family with two processes (billed 45,357 with one): 100,000 tokens ran
    just before an 08:00 first start, the API 20 hours behind. P syncs; the young history ends by
    age at 16:00 unproven, so the bound stays off (`unseen_kept`); P spends most of the pool and
    stops. Q, which never synced, reads the bound from the shared state at its polls: after the
    wipe it keeps it off the new generation too, and an hour of traffic through Q bills nothing
    (90,000 when Q's checkpoint held only the usage it saw)."""
    w = make_world("2026-08-20 08:00", lag_minutes=1_200, small_buffer=10_000, **HELD)
    w.fake.add_package(POOL, 1_000_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    w.fake.consume(POOL, 100_000)
    p = w.service()
    w.idle("2026-08-20 16:05", p, step_ms=5 * MIN)
    st = LimitState.from_json(w.gate.records.limit_state(POOL))
    assert st.unseen_ref is None and st.unseen_kept == 200_000 and st.unseen_held == 200_000
    w.run("2026-08-20 17:00", every_ms=10_000, tokens=10_000, svc=p, budget=650_000)
    q = w.service()
    _tick(q)
    assert q.checkpoints[POOL].unseen == 200_000
    assert q.checkpoints[POOL].unsettled >= 650_000 + 200_000
    p.stop()
    w.services.remove(p)
    _tick(q)  # reads P's stop: nothing of P to wait for after the wipe
    _wipe(w)
    w.clock.advance(1_000)
    served = _after_the_wipe(w, q)
    assert w.totals().billed == 0, w.totals()
    assert 0 < served <= 150_000  # what is provably free: 1,000,000 less 650,000 and the bound


@contextlib.contextmanager
def own_sightings(svc):
    """Run as `svc`'s own OS process would: with its own gate answers (`_SIGHTINGS` is per
    interpreter; services sharing one see each other's, kinder than real processes)."""
    mine = svc.__dict__.setdefault("_own_sightings", {})
    saved, gate_scripts._SIGHTINGS = gate_scripts._SIGHTINGS, mine
    try:
        yield
    finally:
        gate_scripts._SIGHTINGS = saved


def _tick(svc) -> None:
    with own_sightings(svc):
        svc.tick()


def _ask(w, svc, tokens: int) -> bool:
    w.seq += 1
    with own_sightings(svc):
        d = svc.gate.reserve(POOL, f"req-{w.seq}", tokens)
        if d.admitted:
            w.fake.consume(POOL, tokens)
            svc.gate.settle(POOL, f"req-{w.seq}", tokens)
    return d.admitted


def _after_the_wipe(w, via) -> int:
    """Traffic through `via`, 10,000 every 5 s for an hour, every service polling before each:
    the tokens served."""
    end, served = w.clock.now_ms() + 60 * MIN, 0
    while w.clock.now_ms() < end:
        for svc in w.services:
            _tick(svc)
        served += 10_000 if _ask(w, via, 10_000) else 0
        w.clock.advance(5_000)
    return served


@pytest.mark.parametrize("other", ["reports", "hook_only", "sync_thread_stuck", "started_late"])
def test_a_burst_another_process_admitted_before_a_wipe_is_never_billed(make_world, other):
    """Red-team of stop 42 (each bills 290,000 without its fix, 0 with the Δ_assumed hold before):
    process Q admits 500,000 a second after P's poll, the store is wiped, the API is 14 min
    behind. `reports`: Q's report reached a pool P had recreated as lost and was ignored (only a
    first report raised the bound). `hook_only`: Q runs no billing sync (VQG_SYNC_ENABLED=false):
    it stamps, never reports, so P waits Δ_assumed. `sync_thread_stuck`: Q's last poll was 25
    min ago (it was forgotten after 10). `started_late`: Q's first stamp went with the wipe
    before P read it: the report window covers it."""
    w = make_world("2026-08-20 13:00", lag_minutes=14, small_buffer=10_000, **HELD)
    w.fake.add_package(POOL, 1_000_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    p = w.service()
    q = None
    if other == "hook_only":
        q = SyncService(w.cfg, Gate(w.client, w.keyspace, w.clock), lambda: [PoolSpec(POOL)],
                        billing=False)
        w.services.append(q)
    elif other in ("reports", "sync_thread_stuck"):
        q = w.service()
    if q is not None:
        _tick(q)
    for _ in range(21):
        _tick(p)
        if other != "sync_thread_stuck" and q is not None:
            _tick(q)
        w.clock.advance(MIN)
    if other == "started_late":
        w.clock.advance(1_000)
        q = w.service()
        _tick(q)  # its first poll: P has not read its stamp
    assert q is not None
    for _ in range(10):
        assert _ask(w, q, 50_000)
    w.clock.advance(2_000)
    _wipe(w)
    w.clock.advance(1_000)
    if other == "sync_thread_stuck":
        w.services.remove(q)  # it does not poll again
    _tick(p)
    served = _after_the_wipe(w, p)
    assert w.totals().billed == 0, w.totals()
    assert served >= 250_000  # not refused for good: it serves what is provably free


def test_estimates_of_a_lost_generation_are_not_carried_into_the_new_one(make_world):
    """A limit state left from the old generation (its free-total estimate in the old lifetime
    coordinates) is dropped; only the observed lags are kept."""
    w = make_world("2026-08-20 13:00", lag_minutes=4, **HELD)
    w.fake.add_package(POOL, 500_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    svc = w.service()
    w.idle("2026-08-20 13:21", svc)
    w.run("2026-08-20 14:00", every_ms=MIN, tokens=5_000, svc=svc)
    keys = w.keyspace.pool(POOL)
    old = LimitState.from_json(json.loads(w.client.get(keys.limit_state)))
    stale = old.to_json() | {"lowest_free_total": 10**9, "lags": [[w.clock.now_ms(), 30 * MIN]]}
    _wipe(w)
    w.client.set(keys.limit_state, json.dumps(stale))
    svc.tick()
    new = LimitState.from_json(json.loads(w.client.get(keys.limit_state)))
    assert new.generation == w.gate.status(POOL).get("hist_at") != old.generation
    assert new.lowest_free_total is None  # the history does not cover Δ: no estimate is a bound
    assert new.lags == ((w.clock.now_ms(), 30 * MIN),)
    # The kept 30-min lag sets Δ_assumed = 30 × 1.25 + 2 = 39.5 min (no hold: the only process).
    assert assumed_lag_ms(new, w.clock.now_ms(), 20 * MIN) == int(30 * MIN * 1.25) + 2 * MIN


@pytest.mark.parametrize("admit", [0, 30_000])
def test_the_operator_bound_is_all_a_held_pool_admits(make_world, admit):
    """While held, lifetime usage of the new history may reach VQG_COLD_START_ADMIT_TOKENS (0 by
    default) and no more, however much the lagging balance shows."""
    w = make_world("2026-08-20 10:00", lag_minutes=4, cold_start_admit_tokens=admit)
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    svc = w.service()
    w.run("2026-08-20 10:19", every_ms=20_000, tokens=2_000, svc=svc)
    assert w.served == admit - admit % 2_000


def test_a_checkpoint_counts_as_unsettled_only_what_the_balance_has_not_proven_settled(make_world):
    """Fuzz seed 240: the API current (lag 0) but Δ_assumed 20 min, so the snapshot's estimate
    called the last 20 min of our usage unsettled, and a wipe then took 4,009,432 off the new
    generation's free total. The settled floor (what the balance lost, time order) proves the
    API showed it: the checkpoint keeps only what no balance drop covers yet."""
    w = make_world("2026-08-20 13:00", lag_minutes=0, small_buffer=10_000, unseen_day_tokens=0)
    w.fake.add_package(POOL, 5_000_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    svc = w.service()
    w.idle("2026-08-20 13:21", svc)
    w.run("2026-08-20 13:40", every_ms=20_000, tokens=20_000, svc=svc)  # 60,000 a minute
    w.clock.advance(MIN)
    svc.tick()
    st = w.gate.status(POOL)
    assert st.get("ucum") - st.get("settled") >= 15 * 60_000  # the estimate's "unsettled"
    seen = svc.checkpoints[POOL]
    assert seen.floor is not None and seen.unsettled <= 60_000 + st.get("inflight"), seen


@pytest.mark.parametrize("b0", [5_000_000, 1_300_000])
@pytest.mark.parametrize("when", ["before_sync", "inside_sync", "inside_sync_two_workers"])
def test_a_wipe_between_the_syncs_read_and_its_install_is_lost_state(make_world, caplog, when, b0):
    """The store comes back empty after a sync read the pool's state and before it installs the
    snapshot computed from it. Installed anyway, the snapshot created a fresh generation that the
    sync took for the one it had read: no hold, no recovered count, no `⛔ [STATE-LOST]`, and a
    single process burned 1,400,000 (red-team pass, stop 35). The install now names the
    generation it was computed from; another is refused and the sync starts again, as lost state."""
    w = make_world("2026-08-13 06:00", cold_start_admit_tokens=0, unseen_day_tokens=200_000)
    w.fake.add_package(POOL, b0, acquired_ms=beijing_ms("2026-08-12 10:30"))
    svc = w.service()
    other = w.service() if when.endswith("two_workers") else None
    w.idle("2026-08-13 08:00", svc)
    if other:
        other.tick()
    w.run("2026-08-13 13:00", every_ms=MIN, tokens=10_000, svc=svc,
          budget=b0 - 300_000 if b0 < 2_000_000 else 1_500_000)
    if other:
        other.tick()
    real = svc.gate.install_snapshot
    armed = {"on": when.startswith("inside_sync")}

    def install(pool: str, snapshot: Snapshot) -> Decision:
        if armed["on"]:
            armed["on"] = False
            w.gate.records.clear()  # Redis restarted empty right after the sync's reads
        return real(pool, snapshot)

    svc.gate.install_snapshot = install  # type: ignore[method-assign]
    if when == "before_sync":
        w.gate.records.clear()
    svc.sync_account(ACCOUNT, svc.pools(), "manual")
    end = beijing_ms("2026-08-13 23:50")
    while w.clock.now_ms() < end:
        if other:
            other.tick()
        w.run("2026-08-13 23:50", every_ms=MIN, tokens=10_000, svc=svc, budget=w.served + 10_000)
    t = w.totals()
    assert (t.billed, t.burned) == (0, 0), t
    assert any("STATE-LOST" in r.getMessage() for r in caplog.records), "the loss was never reported"
