"""Faults in time: the billing API down for hours, Beijing midnight with requests in flight,
and proxy hosts whose clocks disagree. On the test store backend, with a ManualClock."""

from __future__ import annotations

import asyncio
import time
import types
from collections.abc import Iterator

import httpx
import litellm
import pytest
import redis
from fault_support import (
    ACCOUNT,
    CREDENTIALS,
    DEPLOYMENTS,
    MIN,
    MODEL,
    POOL,
    BillingWorld,
    beijing_ms,
    call,
    check_books,
    response,
    success_kwargs,
)

from backend import TEST_REDIS_URL
from volc_quota_guard.clock import ManualClock, next_beijing_midnight_ms
from volc_quota_guard.config import load_settings
from volc_quota_guard.fake import FakeVolcengine, Ledger
from volc_quota_guard.gate import AsyncGate, Gate, Snapshot
from volc_quota_guard.gate import scripts as gate_mod
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.gate.store import connect_async
from volc_quota_guard.proxy import hook as hook_mod
from volc_quota_guard.proxy.hook import QuotaGuard
from volc_quota_guard.proxy.refusals import QuotaRefused


@pytest.fixture
def fake_at() -> Iterator:
    """Start a fake Volcengine on a ManualClock set to a Beijing time."""
    started: list[FakeVolcengine] = []

    def start(when: str) -> tuple[ManualClock, FakeVolcengine]:
        clock = ManualClock(beijing_ms(when))
        fake = FakeVolcengine({ACCOUNT: tuple(CREDENTIALS.values())}, ledger=Ledger(lag_minutes=14),
                              clock=clock).start()
        started.append(fake)
        return clock, fake

    yield start
    for fake in started:
        fake.stop()


def test_billing_api_down_for_hours_goes_stale_retries_gently_and_recovers(
        fake_at, client: redis.Redis, keyspace: KeySpace) -> None:
    """A four-hour billing outage: the snapshot is kept (never replaced by a failed sync) until
    VQG_SNAPSHOT_MAX_AGE_MINUTES, then every request is refused as stale (429 naming it) with
    about one API attempt a minute; the first sync after the outage lets traffic through, and
    nothing is ever billed."""
    clock, fake = fake_at("2026-08-14 09:00")
    fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-13 10:30"))
    cfg = load_settings(billing_endpoint=fake.url, snapshot_max_age_minutes=90,
                        cold_start_admit_tokens=10**9, unseen_day_tokens=0)  # an idle account
    w = BillingWorld(clock, fake, cfg, client, keyspace)
    assert set(w.minutes(30, 5_000)) == {"admitted"}
    installed = w.gate.status(POOL)
    down_from = clock.now_ms()
    fake.billing_down_until(down_from + 4 * 60 * MIN)
    calls_before = fake.api_calls(ACCOUNT)

    reasons = w.minutes(4 * 60, 5_000)
    after = w.gate.status(POOL)
    assert after.get("snap_seq") == installed.get("snap_seq")  # failed syncs install nothing
    fresh = (installed.get("valid_until") - down_from) // MIN  # minutes the snapshot had left
    assert set(reasons[: fresh - 1]) == {"admitted"} and len(reasons[: fresh - 1]) > 30
    assert set(reasons[fresh + 1:]) == {"stale_snapshot"}
    attempts = fake.api_calls(ACCOUNT) - calls_before
    assert 4 * 60 // 2 <= attempts <= 2 * (4 * 60 + 1), attempts  # ~1 a minute, 2 tries each

    async def refused_through_hook() -> None:
        guard = QuotaGuard(cfg, AsyncGate(connect_async(TEST_REDIS_URL), keyspace, clock))
        with pytest.raises(QuotaRefused) as refused:
            await guard.async_pre_call_deployment_hook(call(max_tokens=100), "acompletion")
        assert refused.value.status_code == 429 and "quota snapshot too old" in str(refused.value)

    asyncio.run(refused_through_hook())
    assert w.minutes(3, 5_000)[1:] == ["admitted", "admitted"]  # back within a sync poll
    totals = fake.pool_totals(POOL)
    assert totals.billed == 0 and totals.consumed == w.gate.status(POOL).get("ucum")


def test_beijing_midnight_with_requests_in_flight(client: redis.Redis, keyspace: KeySpace) -> None:
    """Reservations made before Beijing midnight that settle or expire after it count on the new
    day and hold its cap while open; yesterday's count is kept; the collection-wall eviction
    set before midnight lifts at midnight for the router."""
    clock = ManualClock(beijing_ms("2026-08-14 23:58:00"))
    gate = Gate(client, keyspace, clock)
    midnight = next_beijing_midnight_ms(clock.now_ms())
    gate.install_snapshot(POOL, Snapshot(10**9, 0, 0, 0, 10_000, clock.now_ms() + 120 * MIN, 1_000))
    gate.reserve(POOL, "early", 7_000)
    gate.settle(POOL, "early", 7_000)
    assert gate.reserve(POOL, "crossing", 1_600).admitted  # settles after midnight
    assert gate.reserve(POOL, "lost", 800, ttl_ms=90_000).admitted  # never settles: expires after
    d = gate.status(POOL).decision
    assert d.used_today == 9_400 and d.evicted_until == midnight  # 600 left < evict_below
    assert gate.reserve(POOL, "too-big", 1_000).reason == "collection_wall"

    async def routable() -> bool:
        guard = QuotaGuard(load_settings(), AsyncGate(connect_async(TEST_REDIS_URL), keyspace, clock))
        try:
            kept = await guard.async_filter_deployments("g", DEPLOYMENTS, None, {})
        except QuotaRefused:
            return False
        return kept == DEPLOYMENTS

    assert asyncio.run(routable()) is False
    clock.set(midnight + 30_000)
    assert asyncio.run(routable()) is True  # the deadline passed: no call to the store needed

    d = gate.reserve(POOL, "new-day", 9_000, least=1_000)
    assert d.admitted and d.amount == 10_000 - 1_600 - 800  # open reservations hold today's cap
    clock.set(midnight + 60_000)
    assert gate.settle(POOL, "crossing", 1_500).reason == "settled"
    clock.set(midnight + 120_000)  # "lost" passes its deadline
    state = gate.status(POOL)
    assert state.get("expired_count") == 1
    assert state.get("prev_day_usage") == 7_000  # yesterday as it was at midnight
    assert state.get("day_usage") == 1_500 + 800  # settled and expired after midnight
    assert state.decision.used_today == 1_500 + 800 + d.amount <= 10_000
    check_books(client, keyspace)


def _host_clock(skew_ms: int) -> types.SimpleNamespace:
    """A stand-in for the `time` module of a host whose clock is `skew_ms` off."""
    return types.SimpleNamespace(time=lambda: time.time() + skew_ms / 1000, monotonic=time.monotonic)


def test_proxies_with_skewed_host_clocks_agree_on_eviction_and_deadlines(
        client: redis.Redis, keyspace: KeySpace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two guards whose hosts disagree by hours both see a pool evicted until the store's Beijing
    midnight (even the one whose clock is already past it), and their reservations get deadlines
    on the store's clock, so neither expires the other's early."""
    store = Gate(client, keyspace)  # no injected clock: the store's TIME, as in production
    now = store.now_ms()
    midnight = next_beijing_midnight_ms(now)
    ahead = midnight - now + 10 * MIN  # this host thinks midnight has passed
    behind = -3 * 3_600_000
    store.install_snapshot(POOL, Snapshot(10**9, 0, 0, 0, 5_000, now + 60 * MIN, 1_000))
    other = "acct-a/doubao-seed-2-1-pro-260628"
    store.install_snapshot(other, Snapshot(10**9, 0, 0, 0, 2_000_000, now + 60 * MIN, 1_000))
    ttl_s = 600

    async def on_host(skew_ms: int, rid: str) -> tuple[bool, int]:
        monkeypatch.setattr(hook_mod, "time", _host_clock(skew_ms))
        monkeypatch.setattr(gate_mod, "time", _host_clock(skew_ms))
        guard = QuotaGuard(load_settings(reservation_ttl_seconds=ttl_s),
                           AsyncGate(connect_async(TEST_REDIS_URL), keyspace))
        try:
            await guard.async_filter_deployments("g", DEPLOYMENTS, None, {})
            routed = True
        except QuotaRefused as exc:
            routed = False
            wait = int(exc.headers["retry-after"]) if exc.headers else 0
            assert abs(wait - (midnight - now) / 1000) < 30, wait  # the same wait on every host
        kw = call(call_id=rid, max_tokens=100)
        kw["metadata"]["model_info"] = {**kw["metadata"]["model_info"], "id": f"dep-{rid}"}
        kw["model"] = "volcengine/doubao-seed-2-1-pro-260628"
        await guard.async_pre_call_deployment_hook(kw, "acompletion")
        deadline = max(int(s) for _, s in client.zrange(keyspace.pool(other).deadlines, 0, -1,
                                                       withscores=True))
        await guard.async_log_success_event(
            {**success_kwargs(kw), "model": "doubao-seed-2-1-pro-260628"}, response(10, 20), None, None)
        return routed, deadline

    store.reserve(POOL, "fill", 4_500)  # 500 left today: evicted until the store's midnight
    routed_ahead, deadline_ahead = asyncio.run(on_host(ahead, "a"))
    routed_behind, deadline_behind = asyncio.run(on_host(behind, "b"))
    assert (routed_ahead, routed_behind) == (False, False)
    server_deadline = store.now_ms() + ttl_s * 1000
    assert abs(deadline_ahead - server_deadline) < 10_000 and abs(deadline_behind - server_deadline) < 10_000
    assert store.status(other).get("ucum") == 60 and store.status(other).get("inflight") == 0


def _give_up(failure: str) -> Exception:
    if failure == "timeout":
        return litellm.Timeout(message="Request timed out", model=MODEL, llm_provider="volcengine")
    return litellm.InternalServerError(
        message="upstream 502", model=MODEL, llm_provider="volcengine",
        response=httpx.Response(502, request=httpx.Request("POST", "http://ark.invalid")))


@pytest.mark.parametrize("failure", ["timeout", "5xx", "stream-cut", "client-disconnect"])
def test_a_call_given_up_on_before_midnight_counts_on_the_next_day_too(
        client: redis.Redis, keyspace: KeySpace, failure: str) -> None:
    """LiteLLM gives up on a long call at 23:59 (a timeout, a gateway 5xx, a cut stream, the
    client leaving); Ark, never told to stop, finishes it at 00:02 and collects it on the new
    day. The guard keeps such a call whole, and now also counts it on the next day, as it does
    an expired reservation: before, the new day's wall never saw it and the day burned what the
    call made (32,016 in a red-team pass with a larger cap, stop 35). The ledger is the fake's,
    on the same clock."""
    cap = 200_000
    clock = ManualClock(beijing_ms("2026-08-14 23:50:00"))
    gate = Gate(client, keyspace, clock)
    ledger = Ledger(daily_cap=cap, lag_minutes=14, return_at=None)
    ledger.add_package(POOL, 10**9, clock.now_ms() - 86_400_000)
    gate.install_snapshot(POOL, Snapshot(10**9, 0, 0, 0, cap, clock.now_ms() + 10 * 3600_000, 1_000))

    async def run() -> None:
        guard = QuotaGuard(load_settings(), AsyncGate(connect_async(TEST_REDIS_URL), keyspace, clock))
        long_call = call("write a long story", call_id="long", max_tokens=32_000,
                         thinking={"type": "disabled"})
        await guard.async_pre_call_deployment_hook(long_call, "acompletion")
        guard.log_pre_api_call(MODEL, long_call["messages"], long_call)
        clock.set(beijing_ms("2026-08-14 23:59:00"))
        if failure in ("timeout", "5xx"):
            await guard.async_post_call_failure_deployment_hook(long_call, _give_up(failure),
                                                                "acompletion")
        elif failure == "stream-cut":  # a stream that broke mid-way: LiteLLM's failure event
            kw = success_kwargs(long_call) | {"stream": True, "exception": _give_up("5xx")}
            await guard.async_log_failure_event(kw, None, None, None)
        else:  # the client went away mid-stream: LiteLLM logs success with its local estimate
            kw = success_kwargs(long_call) | {"stream": True}
            kw["litellm_params"]["metadata"]["client_disconnected"] = True
            await guard.async_log_success_event(kw, response(20, 300), None, None)
        clock.set(beijing_ms("2026-08-15 00:02:00"))  # Ark ends the call at the cap pinned
        ledger.consume(POOL, long_call["extra_body"]["max_completion_tokens"] + 10, clock.now_ms())
        for i in range(100):  # the new day: measured traffic until the collection wall refuses
            clock.advance(MIN)
            kw = call("hello", call_id=f"day2-{i}", max_tokens=4_000, thinking={"type": "disabled"})
            try:
                await guard.async_pre_call_deployment_hook(kw, "acompletion")
            except QuotaRefused:
                break
            guard.log_pre_api_call(MODEL, kw["messages"], kw)
            out = min(4_000, kw["extra_body"]["max_completion_tokens"])
            ledger.consume(POOL, out + 10, clock.now_ms())
            await guard.async_log_success_event(success_kwargs(kw), response(10, out), None, None)
        else:
            pytest.fail("the collection wall never refused")

    asyncio.run(run())
    totals = ledger.totals(POOL, clock.now_ms())
    assert totals.burned == 0 and totals.billed == 0, totals
    assert totals.collected_today > cap - 40_000  # the day was used, not held back
    check_books(client, keyspace)
