"""The quota store (a private redis-server) crashing under the guard: killed mid-traffic and
restarted with its data, or restarted empty. Driven through the LiteLLM hook in-process."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from fault_support import (
    ACCOUNT,
    CREDENTIALS,
    DEPLOYMENTS,
    POOL,
    BillingWorld,
    beijing_ms,
    call,
    check_books,
    response,
    success_kwargs,
)
from redis_servers import RedisServer

from backend import TEST_REDIS_URL
from volc_quota_guard.clock import ManualClock
from volc_quota_guard.config import load_settings
from volc_quota_guard.fake import FakeVolcengine, Ledger
from volc_quota_guard.gate import AsyncGate, Gate, Snapshot
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.gate.store import connect, connect_async
from volc_quota_guard.limit import LimitState
from volc_quota_guard.proxy.hook import QuotaGuard
from volc_quota_guard.proxy.refusals import QuotaRefused, QuotaStoreDown

PROMPT, COMPLETION = 12, 150  # what the "upstream" reports for each request


def test_redis_killed_mid_traffic_fails_closed_then_recovers_counting_each_request_once(
        durable_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """Redis is SIGKILLed with requests in flight: new requests get a clear 503 while it is down,
    settles that cannot land are logged (their reservations stay and expire as consumed), and
    after the restart traffic flows again with every request counted exactly once."""
    keyspace = KeySpace(f"vqgtest-{uuid.uuid4().hex[:8]}")
    client = connect(durable_redis.url)
    sync_gate = Gate(client, keyspace)
    sync_gate.install_snapshot(POOL, Snapshot(1_000_000, 0, 0, 0, 2_000_000, sync_gate.now_ms() + 3_600_000))
    upstream_used = 0

    async def scenario() -> None:
        nonlocal upstream_used
        guard = QuotaGuard(load_settings(reservation_ttl_seconds=10),
                           AsyncGate(connect_async(durable_redis.url), keyspace))
        release_upstream = asyncio.Event()

        async def request(i: int, wait_upstream: bool = False) -> int:
            nonlocal upstream_used
            kw = call(f"request {i}", call_id=f"c{i}", max_tokens=200)
            try:
                await guard.async_pre_call_deployment_hook(kw, "acompletion")
            except QuotaStoreDown as exc:
                assert exc.status_code == 503 and "quota store unreachable" in str(exc)
                return 503
            if wait_upstream:
                await release_upstream.wait()
            upstream_used += PROMPT + COMPLETION
            await guard.async_log_success_event(success_kwargs(kw), response(PROMPT, COMPLETION), None, None)
            return 200

        assert await asyncio.gather(*(request(i) for i in range(10))) == [200] * 10
        in_flight = [asyncio.create_task(request(100 + i, wait_upstream=True)) for i in range(8)]
        while int(client.hget(keyspace.pool(POOL).state, "inflight") or 0) == 0 or \
                client.hlen(keyspace.pool(POOL).reservations) < 8:
            await asyncio.sleep(0.01)
        durable_redis.kill()
        assert await asyncio.gather(*(request(200 + i) for i in range(5))) == [503] * 5
        with pytest.raises(QuotaStoreDown):
            await guard.async_filter_deployments("g", DEPLOYMENTS, None, {})
        release_upstream.set()  # the upstream answers; the settles find no store
        assert await asyncio.gather(*in_flight) == [200] * 8
        durable_redis.start()  # same port, same data (fsynced AOF)
        assert await asyncio.gather(*(request(300 + i) for i in range(10))) == [200] * 10
        assert await guard.async_filter_deployments("g", DEPLOYMENTS, None, {}) == DEPLOYMENTS

    with caplog.at_level(logging.ERROR, logger="volc_quota_guard"):
        asyncio.run(scenario())
    assert caplog.text.count("[STORE-DOWN] quota store unreachable") >= 5
    assert caplog.text.count("[STORE-DOWN] usage not recorded") == 8
    books = check_books(client, keyspace)
    assert books["open"] == 8 and books["resolved"] == 20  # the lost settles are held, not dropped
    assert books["ucum"] == 20 * (PROMPT + COMPLETION)
    assert books["ucum"] + books["inflight"] >= upstream_used  # nothing the upstream used is missing
    for rid in client.hkeys(keyspace.pool(POOL).resolved):  # a retried settle adds nothing
        assert sync_gate.settle(POOL, rid.decode(), PROMPT + COMPLETION).reason == "duplicate"
    assert check_books(client, keyspace) == books


def test_redis_restarted_empty_refuses_then_restores_a_safe_limit_at_once(
        scratch_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    """After Redis comes back empty the pool has no snapshot, so the guard refuses (429 naming
    the cause) rather than admit on nothing; the next sync sees a lost generation (⛔ STATE-LOST),
    restores today's count from what this process last saw (its poll's checkpoint, raised by the
    gate's later answers) and keeps what the API may not show yet off the balance wall. It was
    the only process, so nothing was admitted that its checkpoint does not hold: held only for
    the report window (stop 42), traffic is served again a minute on and stops at the wall,
    nothing billed."""
    clock = ManualClock(beijing_ms("2026-08-14 09:00"))
    with FakeVolcengine({ACCOUNT: tuple(CREDENTIALS.values())}, ledger=Ledger(lag_minutes=14),
                        clock=clock) as fake:
        fake.add_package(POOL, 400_000, acquired_ms=beijing_ms("2026-08-13 10:30"))
        # The account was idle before the first start (else the first history stays young and
        # a 400,000 pool cannot serve past the unseen bound after the wipe: docs/limit.md).
        cfg = load_settings(billing_endpoint=fake.url, unseen_day_tokens=0)
        w = BillingWorld(clock, fake, cfg, connect(scratch_redis.url), KeySpace("vqgtest-empty"))
        with caplog.at_level(logging.WARNING, logger="volc_quota_guard.sync"):
            assert set(w.minutes(21, 0)) == {"idle"}  # the first start's hold: 20 min
        assert "🕒 [COLD-START] acct-a/deepseek-v4-flash-ga-260731: " in caplog.text
        assert "; held until 09:20 (Beijing)" in caplog.text  # no unseen bound: held for Δ
        assert set(w.minutes(60, 2_000)) == {"admitted"}
        w.service.tick()  # the poll's checkpoint: today's 120,000
        crossing = w.gate.reserve(POOL, "crossing", 2_000)  # in flight when the store is wiped
        assert crossing.admitted

        scratch_redis.restart(empty=True)
        fake.consume(POOL, 2_000)  # the crossing request ran upstream; its settle finds nothing
        assert w.gate.reserve(POOL, "after-wipe", 100).reason == "no_snapshot"

        async def through_hook() -> None:
            guard = QuotaGuard(cfg, AsyncGate(connect_async(scratch_redis.url), w.keyspace, clock))
            with pytest.raises(QuotaRefused) as refused:
                await guard.async_pre_call_deployment_hook(call(max_tokens=100), "acompletion")
            assert refused.value.status_code == 429 and "no quota snapshot yet" in str(refused.value)

        asyncio.run(through_hook())
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="volc_quota_guard.sync"):
            outcome = w.service.tick()[0]  # the sync meta went with the data: a sync is due at once
        assert outcome.ran and outcome.error is None
        assert "⛔ [STATE-LOST] acct-a/deepseek-v4-flash-ga-260731: the pool's counters" in caplog.text
        assert "the account's sync record" in caplog.text
        assert "held until any other process polling this account has polled it" in caplog.text
        st = w.gate.status(POOL)
        assert st.get("hist_lost") == 1 and st.get("hold_until") > 0  # the report window
        young = LimitState.from_json(w.gate.records.limit_state(POOL))
        # The checkpoint's own unsettled usage (the last 14+ min of 2,000 a minute) is the bound.
        assert young.unseen_ref == st.get("balance") and 20_000 <= young.unseen_bound <= 80_000
        # 60 × 2,000 at the last poll, and the crossing reservation the gate answered after it
        assert st.decision.used_today == 122_000
        assert st.decision.daily_cap == cfg.daily_cap - cfg.unseen_day_tokens
        reasons = w.minutes(200, 2_000)
        assert reasons[1] == "admitted" and reasons[-1] == "balance_wall"  # a minute on: served
        totals = fake.pool_totals(POOL)
        assert totals.billed == 0, totals
        check_books(w.client, w.keyspace)


def test_a_reserve_whose_answer_is_lost_is_released_not_orphaned(client, keyspace) -> None:
    """The store runs the reserve but its answer never comes back (a timeout): the hook refuses
    with a 503 and releases the id in the background, so the tokens are not held for a TTL and
    then counted as used (a red-team pass: 6 such reserves held 3,156 of 6,000 tokens of headroom
    with 2 workers in a timeout storm)."""
    from volc_quota_guard.errors import StoreUnavailable

    clock = ManualClock(beijing_ms("2026-08-14 10:00:00"))
    gate = Gate(client, keyspace, clock)
    gate.install_snapshot(POOL, Snapshot(10**9, 0, 0, 0, 10**9, clock.now_ms() + 3600_000, 1_000))

    class LostAnswers(AsyncGate):
        async def reserve(self, *args, **kwargs):  # type: ignore[no-untyped-def]
            await super().reserve(*args, **kwargs)  # it ran ...
            raise StoreUnavailable("Timeout reading from socket")  # ... and the answer was lost

    async def run() -> None:
        agate = LostAnswers(connect_async(TEST_REDIS_URL), keyspace, clock)
        guard = QuotaGuard(load_settings(), agate)
        with pytest.raises(QuotaStoreDown):
            await guard.async_pre_call_deployment_hook(call("hello", call_id="lost"), "acompletion")
        await asyncio.sleep(0.2)  # the background release

    asyncio.run(run())
    state = gate.status(POOL)
    assert state.decision.inflight == 0, state
    check_books(client, keyspace)
