"""The billing sync over the wire: fake Volcengine (HTTP, signed) → SyncService → gate → traffic."""

from __future__ import annotations

import json
import logging
import threading
import time

from sync.conftest import ACCOUNT, ENV, MIN, POOL, beijing_ms
from volc_quota_guard.errors import GateError
from volc_quota_guard.gate import Gate
from volc_quota_guard.sync import SyncService
from volc_quota_guard.volcengine.billing import BillingClient
from volc_quota_guard.volcengine.packages import PoolSpec

DAY = 86_400_000


def test_v4_false_block_day_does_not_block(make_world, caplog):
    """08-12: after 1,696,135 tokens with Bal=596,869 (B0=2,293,004), a small request still passes."""
    w = make_world("2026-08-12 08:00")
    w.fake.add_package(POOL, 2_293_004, acquired_ms=beijing_ms("2026-08-11 10:30"))
    svc = w.service()
    w.run("2026-08-12 13:36", every_ms=MIN, tokens=7_000, svc=svc, budget=1_696_135)
    assert w.served >= 1_680_000
    w.request(1_696_135 - w.served)  # land exactly on the seed's figure
    assert w.served == 1_696_135
    w.idle("2026-08-12 14:59", svc)
    with caplog.at_level(logging.INFO, logger="volc_quota_guard.sync"):
        svc.sync_account(ACCOUNT, svc.pools())
    assert "Bal=596,869" in caplog.text
    assert w.request(16)  # v4's limit was 596,869 - 300,000 = 296,869 < 1,696,135: a false block
    assert w.totals().billed == 0


def test_0813_lag_burst_does_not_bill_above_or_below_the_cap(make_world):
    """08-13 with a 14-min lag and bursts: no billing and no burn with B0 = 2,242,178 or 1.5M."""
    for b0 in (2_242_178, 1_500_000):
        w = make_world("2026-08-13 08:00")
        w.fake.add_package(POOL, b0, acquired_ms=beijing_ms("2026-08-12 10:30"))
        svc = w.service()
        w.run("2026-08-13 10:00", every_ms=MIN, tokens=5_000, svc=svc)
        w.run("2026-08-13 18:00", every_ms=20_000, tokens=10_700, svc=svc)  # ~150k per 14 min
        t = w.totals()
        assert (t.billed, t.burned) == (0, 0), b0
        assert w.refused > 0
        assert w.served >= min(b0, 2_000_000) - 150_000, "the guard wasted too much free quota"


def test_package_expiring_mid_day_with_balance_left_does_not_bill(make_world):
    """A package that expires at 15:00 with tokens left is taken off before it goes."""
    w = make_world("2026-08-13 12:00")
    w.fake.add_package(POOL, 400_000, acquired_ms=beijing_ms("2026-07-14 15:00"),
                       expires_ms=beijing_ms("2026-08-13 15:00"))
    w.fake.add_package(POOL, 600_000, acquired_ms=beijing_ms("2026-08-12 10:30"))
    svc = w.service()
    w.run("2026-08-13 15:00", every_ms=MIN, tokens=1_000, svc=svc)  # light: 180k of 400k used
    w.run("2026-08-13 20:00", every_ms=30_000, tokens=9_000, svc=svc)
    t = w.totals()
    assert (t.billed, t.burned) == (0, 0)
    assert t.expired == 220_000  # the old package did expire with tokens left (the consume task's job)
    # The quiet anchor after the pool ran out keeps 23,000 off: what the expired package settled
    # in its last 14-min lag window, which no balance shows, so the settled floor cannot prove it.
    assert w.served >= 180_000 + 600_000 - 90_000


def test_return_package_at_1030_lifts_the_limit_and_un_evicts(make_world):
    """An exhausted pool leaves routing; the 10:30 return package brings it back on the next sync."""
    w = make_world("2026-08-14 00:00", evict_below=10_000)
    w.fake.add_package(POOL, 600_000, acquired_ms=beijing_ms("2026-08-01 10:30"))
    w.fake.set_collection(POOL, day=_day("2026-08-13 12:00"), tokens=1_500_000)
    svc = w.service()
    w.run("2026-08-14 10:00", every_ms=MIN, tokens=8_000, svc=svc)
    evicted = w.gate.status(POOL).decision
    assert evicted.evicted_until > w.clock.now_ms(), "the pool should be out of routing"
    w.idle("2026-08-14 10:50", svc)
    back = w.gate.status(POOL).decision
    assert back.evicted_until == 0 and back.headroom > 1_000_000
    w.run("2026-08-14 13:00", every_ms=MIN, tokens=8_000, svc=svc)
    assert w.totals().billed == 0


def test_thirty_minute_lag_is_observed_before_it_bills(make_world):
    """With a true lag of 30 min and a 20 min floor, the observer raises Δ and nothing bills."""
    w = make_world("2026-08-14 06:00", lag_minutes=30)
    w.fake.add_package(POOL, 400_000, acquired_ms=beijing_ms("2026-08-01 10:30"))
    w.fake.set_collection(POOL, day=_day("2026-08-13 12:00"), tokens=1_200_000)
    svc = w.service()
    w.idle("2026-08-14 08:30", svc)
    w.run("2026-08-14 10:20", every_ms=MIN, tokens=3_000, svc=svc)
    state = json.loads(w.client.get(w.keyspace.pool(POOL).limit_state))
    worst = max(lag for _, lag in state["lags"])
    assert worst >= 25 * MIN, state["lags"]
    w.run("2026-08-14 20:00", every_ms=20_000, tokens=10_000, svc=svc)  # return at 10:30, then a rush
    t = w.totals()
    assert (t.billed, t.burned) == (0, 0)


def test_api_down_for_an_hour_stops_new_headroom_with_a_clear_log(make_world, caplog):
    """Failed syncs leave the snapshot to go stale; then the gate refuses and the log says why."""
    w = make_world("2026-08-14 09:00", snapshot_max_age_minutes=45)
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-13 10:30"))
    svc = w.service()
    svc.tick()
    assert w.request(1_000)
    w.fake.billing_down_until(w.clock.now_ms() + 60 * MIN)
    with caplog.at_level(logging.ERROR, logger="volc_quota_guard.sync"):
        w.idle("2026-08-14 09:50", svc)
    assert "billing API failed" in caplog.text and "BillingTransient" in caplog.text
    d = w.gate.reserve(POOL, "after-outage", 1_000)
    assert d.reason == "stale_snapshot"
    w.idle("2026-08-14 10:10", svc)
    assert w.request(1_000), "the first sync after the outage restores headroom"


def test_bad_credentials_are_loud_and_install_nothing(make_world, caplog):
    """An auth failure is logged at CRITICAL, and a pool with no snapshot stays closed."""
    w = make_world("2026-08-14 09:00")
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-13 10:30"))
    w.fake.inject_billing_fault("auth", count=10)
    svc = w.service()
    with caplog.at_level(logging.CRITICAL, logger="volc_quota_guard.sync"):
        outcome = svc.tick()[0]
    assert outcome.error and "BillingAuthError" in outcome.error
    assert any(r.levelno == logging.CRITICAL for r in caplog.records)
    assert w.gate.reserve(POOL, "r", 10).reason == "no_snapshot"


def test_throttling_is_retried_and_the_sync_succeeds(make_world):
    """Two throttled answers then success: one sync, snapshot installed."""
    w = make_world("2026-08-14 09:00")
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-13 10:30"))
    w.fake.inject_billing_fault("throttle", count=2)
    outcome = w.service().tick()[0]
    assert outcome.error is None and outcome.results[0].balance == 2_000_000
    assert w.fake.api_calls(ACCOUNT) == 3


def test_forty_five_packages_are_summed_across_pages(make_world):
    """45 packages come back over three pages and all count toward the pool's balance."""
    w = make_world("2026-08-14 09:00")
    for i in range(45):
        w.fake.add_package(POOL, 10_000 + i, acquired_ms=beijing_ms("2026-08-13 10:30"))
    outcome = w.service().tick()[0]
    assert outcome.results[0].balance == sum(10_000 + i for i in range(45))
    assert w.fake.api_calls(ACCOUNT) >= 3


def test_two_sync_services_make_one_api_call_per_interval(make_world):
    """Two processes' sync loops on one Redis: one billing call per 30-minute interval."""
    w = make_world("2026-08-14 09:00")
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-13 10:30"))
    a, b = w.service(), w.service()
    for _ in range(120):  # two hours, both ticking every minute
        a.tick()
        b.tick()
        w.clock.advance(MIN)
    # 09:00 (the first: the pool is held until its history covers Δ = 20 min), 09:20 (the
    # hold's end), then every 30 minutes from there: 09:50, 10:20, 10:50.
    assert w.fake.api_calls(ACCOUNT) == 5


def test_two_sync_threads_racing_make_one_call(make_world):
    """Both threads poll as fast as they can at one instant: only one calls the API."""
    w = make_world("2026-08-14 09:00")
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-13 10:30"))
    a, b = w.service(), w.service()
    a.start(poll_seconds=0.005)
    b.start(poll_seconds=0.005)
    deadline = time.monotonic() + 5
    while w.fake.api_calls(ACCOUNT) == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    a.stop()
    b.stop()
    assert w.fake.api_calls(ACCOUNT) == 1
    assert not any(t.name == "vqg-sync" and t.is_alive() for t in threading.enumerate())


def _day(text: str) -> int:
    from volc_quota_guard.clock import beijing_day

    return beijing_day(beijing_ms(text))


def test_a_balance_run_dry_is_reported_as_billing_and_closes_the_pool(make_world, caplog, monkeypatch,
                                                                      capsys):
    """The fake's balance reaches 0 (our traffic plus usage outside the proxy): the next sync logs
    💸 [BILLING], the pool admits nothing, no lag is taken from the frozen API, status shows it."""
    import json

    from backend import TEST_REDIS_URL
    from volc_quota_guard.cli import main
    from volc_quota_guard.limit import LimitState

    w = make_world("2026-08-13 09:00")
    w.fake.add_package(POOL, 300_000, acquired_ms=beijing_ms("2026-08-12 10:30"))
    svc = w.service()
    w.run("2026-08-13 10:00", every_ms=MIN, tokens=2_000, svc=svc)  # 120,000 through the guard
    w.fake.consume(POOL, 250_000)  # another app on the account: 70,000 past the free balance
    assert w.totals().billed == 70_000
    with caplog.at_level(logging.INFO, logger="volc_quota_guard.sync"):
        w.idle("2026-08-13 11:00", svc)
    billing = [r for r in caplog.records if "💸 [BILLING]" in r.getMessage()]
    assert billing and billing[0].levelno == logging.ERROR
    assert "reached 0 by consumption" in billing[0].getMessage()
    assert not w.request(1_000), "a pool whose free quota is spent must admit nothing"
    raw = w.client.get(w.keyspace.pool(POOL).limit_state)
    state = LimitState.from_json(json.loads(raw))
    assert state.billing_since_ms > 0
    assert all(at < state.billing_since_ms for at, _ in state.lags), "a lag was read off a frozen API"

    if TEST_REDIS_URL:
        monkeypatch.setenv("VQG_REDIS_URL", TEST_REDIS_URL)
    monkeypatch.setenv("VQG_KEY_PREFIX", w.keyspace.prefix)
    assert main(["status", "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)["pools"]
    assert row["billing_since_ms"] == state.billing_since_ms
    assert main(["status"]) == 0
    assert "BILLING" in capsys.readouterr().out


def test_a_store_outage_while_deciding_is_a_counted_sync_error(make_world, caplog):
    """Redis failing inside `due()` (reading the sync record) is logged as "store unreachable" and
    counted in vqg_sync_errors, not reported as an unexpected error with a traceback."""
    from sync.failing_store import FailingCommands
    from volc_quota_guard import metrics
    from volc_quota_guard.gate import Gate
    from volc_quota_guard.sync import SyncService
    from volc_quota_guard.volcengine.packages import PoolSpec

    w = make_world("2026-08-14 09:00")
    client = FailingCommands(w.client, "hgetall")  # the sync record's read
    svc = SyncService(w.cfg, Gate(client, w.keyspace, w.clock), lambda: [PoolSpec(POOL)])  # type: ignore[arg-type]
    errors = metrics.SYNC_ERRORS.labels(ACCOUNT, "StoreUnavailable")
    before = errors._value.get()
    with caplog.at_level(logging.ERROR, logger="volc_quota_guard.sync"):
        assert svc.tick() == []
    assert "store unreachable" in caplog.text and "unexpected error" not in caplog.text
    assert not any(r.exc_info for r in caplog.records)
    assert errors._value.get() == before + 1


def test_a_listing_that_stalled_past_its_lock_does_not_reopen_a_spent_pool(make_world, caplog):
    """Process 1's listing reads a balance of 200,000, then stalls; meanwhile the package runs dry
    and process 2's sync closes the pool (billing). Installed late, process 1's older listing
    reopened the pool and 20 more requests billed 100,000 (red-team, stop 37); it is dropped."""
    w = make_world("2026-08-13 09:00", lag_minutes=0)
    w.fake.add_package(POOL, 250_000, acquired_ms=beijing_ms("2026-08-12 10:30"))
    second = w.service()
    second.sync_account(ACCOUNT, second.pools())
    assert w.request(50_000)

    def stalled(account: str) -> BillingClient:
        real = BillingClient.for_account(account, config=w.cfg, env=ENV, wait_initial=0.01,
                                         wait_max=0.02, wait_jitter=0.0, attempts=3, page_interval=0)

        class Stalled:
            def list_resource_packages(self):
                listing = real.list_resource_packages()  # 200,000 left
                w.fake.consume(POOL, 250_000)  # outside the proxy: the package runs dry
                w.clock.advance(2 * MIN)
                second.sync_account(ACCOUNT, second.pools())  # sees 0: billing, pool closed
                return listing

        return Stalled()  # type: ignore[return-value]

    first = SyncService(w.cfg, Gate(w.client, w.keyspace, w.clock), lambda: [PoolSpec(POOL)], stalled)
    with caplog.at_level(logging.WARNING, logger="volc_quota_guard.sync"):
        first.sync_account(ACCOUNT, first.pools())
    assert "a later billing listing's snapshot is installed" in caplog.text
    billed = w.totals().billed
    assert billed > 0 and not any(w.request(5_000) for _ in range(20))
    assert w.totals().billed == billed


def test_one_pool_the_gate_refuses_does_not_stop_the_others(make_world, caplog, monkeypatch):
    """A snapshot the gate refuses for one pool is logged for it; the account's other pools sync,
    and the account retries within a minute instead of at the interval."""
    w = make_world("2026-08-13 09:00")
    other = f"{ACCOUNT}/doubao-seed-1-6-250615"
    w.fake.add_package(POOL, 500_000, acquired_ms=beijing_ms("2026-08-12 10:30"))
    w.fake.add_package(other, 500_000, acquired_ms=beijing_ms("2026-08-12 10:30"))
    svc = SyncService(w.cfg, Gate(w.client, w.keyspace, w.clock), lambda: [PoolSpec(POOL), PoolSpec(other)],
                      w.service()._lister_for)
    real = svc.gate.install_snapshot

    def refuse_first(pool, snapshot):
        if pool == POOL:
            raise GateError("bad_amount", "snapshot field 1 must be a non-negative integer")
        return real(pool, snapshot)

    monkeypatch.setattr(svc.gate, "install_snapshot", refuse_first)
    with caplog.at_level(logging.ERROR, logger="volc_quota_guard.sync"):
        out = svc.sync_account(ACCOUNT, svc.pools())
    assert [r.snapshot.balance for r in out.results] == [500_000]  # the other pool's
    assert f"{POOL}: the gate refused the snapshot" in caplog.text
    assert int(svc.records.sync_meta(ACCOUNT)["next_at"]) <= w.clock.now_ms() + MIN
    assert w.gate.status(other).decision.reason != "no_snapshot"


def test_a_process_with_other_walls_on_the_same_store_is_named(make_world, caplog):
    """Two proxies on one Redis with different VQG_SMALL_BUFFER / VQG_DAILY_CAP take turns
    installing their walls (red-team, stop 37: the cap flipped between 1M and 2M unnoticed);
    each process says so once."""
    w = make_world("2026-08-13 09:00")
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-12 10:30"))
    w.service().sync_account(ACCOUNT, [PoolSpec(POOL)])
    strict = SyncService(w.cfg.model_copy(update={"daily_cap": 1_000_000, "small_buffer": 300_000}),
                         Gate(w.client, w.keyspace, w.clock), lambda: [PoolSpec(POOL)],
                         w.service()._lister_for)
    with caplog.at_level(logging.WARNING, logger="volc_quota_guard.sync"):
        for _ in range(3):
            w.clock.advance(MIN)
            strict.sync_account(ACCOUNT, strict.pools())
    said = [r.message for r in caplog.records if "[CONFIG]" in r.message]
    assert len(said) == 1 and "SMALL_BUFFER=50,000 DAILY_CAP=2,000,000" in said[0]
    assert "300,000 and 1,000,000" in said[0]
