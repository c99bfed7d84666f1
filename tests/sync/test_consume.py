"""The nightly consume task against the fake Volcengine (billing + Ark over HTTP) on a ManualClock."""

from __future__ import annotations

import json
import logging
import threading
from datetime import date, timedelta

import pytest

from sync.conftest import ACCOUNT, POOL, World, beijing_ms
from volc_quota_guard.clock import SkewAlarm
from volc_quota_guard.consume import ConsumeTask
from volc_quota_guard.gate import Gate
from volc_quota_guard.proxy.deployments import targets_from_model_list

HOUR = 3_600_000
DAY = 24 * HOUR
MODEL = POOL.split("/", 1)[1]
ARK_ENV = {"ARK_KEY_A": f"ark-{ACCOUNT}"}  # the fake's default Ark key of the account
# Syncs every 4 h (the ticks are 2-4 h apart): 60 days stay a few hundred billing calls.
SETTINGS = {"sync_interval_minutes": 240, "snapshot_max_age_minutes": 300, "consume_at": "23:00"}


def model_list(world: World, key: str = "os.environ/ARK_KEY_A") -> list[dict[str, object]]:
    return [{"model_name": "deepseek", "litellm_params": {
        "model": f"volcengine/{MODEL}", "api_base": world.fake.ark_base_url, "api_key": key},
        "model_info": {"id": "deepseek@acct-a", "vqg_account": ACCOUNT}}]


def consume_task(world: World, key: str = "os.environ/ARK_KEY_A") -> ConsumeTask:
    """The task as a proxy instance runs it: its own gate object on the shared store."""
    targets = targets_from_model_list(model_list(world, key), env=ARK_ENV)
    return ConsumeTask(world.cfg, Gate(world.client, world.keyspace, world.clock), lambda: targets)


def live_world(make_world, start: str, **settings: object) -> World:
    w = make_world(start, **{**SETTINGS, **settings})
    w.fake.set_chat_defaults(completion_tokens=10**9)  # the model writes until max_tokens
    return w


def simulate(w: World, days: int, natural_per_day: int, consume: bool) -> list:
    """`days` days: natural traffic at 08:00, 14:00, 20:00; the sync thread ticking every 2-4 h
    and at 23:00, with the consume task on its tick when `consume`."""
    svc = w.service()
    outcomes: list = []
    if consume:
        task = consume_task(w)
        svc.after_tick.append(lambda: outcomes.extend(task.tick()))
    per_request = natural_per_day // 3
    day0 = beijing_ms("2026-08-01 00:00")
    for d in range(days):
        for hour in (0, 4, 8, 12, 14, 16, 20, 23):
            at = day0 + d * DAY + hour * HOUR
            if at < w.clock.now_ms():
                continue
            w.clock.set(at)
            svc.tick()
            if hour in (8, 14, 20):
                assert w.request(per_request), f"natural request refused on day {d}"
    return outcomes


def test_sixty_days_of_low_usage_keep_the_gift_with_the_task(make_world, capsys):
    """60 days at 10k/day: with the task no package expires with more than a few k left, nothing is
    billed or burned, and the gift's worth survives both 30-day expiries."""
    w = live_world(make_world, "2026-08-01 00:30", consume_enabled=True)
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-01 00:10"))  # the gift
    outcomes = simulate(w, 61, 10_000, consume=True)
    t = w.totals()
    gone = [p for p in w.fake.true_packages(POOL) if p.status == "Expired"]
    ran = [o for o in outcomes if o.consumed]
    consumed = sum(o.consumed for o in outcomes)
    with capsys.disabled():
        print(f"\n[60 days, task on] expired={t.expired:,} billed={t.billed:,} burned={t.burned:,} "
              f"task consumed={consumed:,} in {len(ran)} runs "
              f"({', '.join(f'{date(1970, 1, 1) + timedelta(o.day)}: {o.consumed:,}' for o in ran)}) "
              f"balance at the end={t.true_balance:,}; {len(gone)} packages expired, the fullest "
              f"with {max(p.available for p in gone):,} left")
    assert (t.billed, t.burned) == (0, 0)
    assert len(gone) >= 30 and max(p.available for p in gone) <= 5_000, "a package expired with tokens left"
    assert t.expired <= 30_000
    assert len(ran) == 2 and all(o.consumed > 1_600_000 for o in ran)  # the gift, then its return
    assert t.true_balance >= 1_900_000  # the seed fund is intact after 60 days
    state = w.gate.status(POOL)
    assert state.get("overruns") == 0


def test_sixty_days_without_the_task_lose_the_gift(make_world, capsys):
    """The same 60 days without the task: the gift expires after 30 days with ~1.7M unused."""
    w = live_world(make_world, "2026-08-01 00:30")
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-01 00:10"))
    simulate(w, 31, 10_000, consume=False)
    t = w.totals()
    with capsys.disabled():
        print(f"\n[31 days, task off] expired={t.expired:,} billed={t.billed:,} burned={t.burned:,} "
              f"balance={t.true_balance:,}")
    assert (t.billed, t.burned) == (0, 0)
    assert t.expired >= 1_650_000
    assert not w.fake.chat_requests()


def test_two_instances_run_the_day_once(make_world, caplog):
    """Two instances ticking at 23:00 at the same moment: one consumes the plan, the other skips."""
    w = live_world(make_world, "2026-08-30 20:00")
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-01 09:00"))  # expires 08-31
    svc = w.service()
    svc.tick()
    w.clock.set(beijing_ms("2026-08-30 23:00"))
    tasks = [consume_task(w), consume_task(w)]
    results: list = [None, None]
    start = threading.Barrier(2)

    def run(i: int) -> None:
        start.wait()
        results[i] = tasks[i].tick()

    with caplog.at_level(logging.INFO, logger="volc_quota_guard.consume"):
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        again = [task.tick() for task in tasks]  # later ticks the same day do nothing
    outcomes = [o for r in results for o in r]
    assert sorted(o.status for o in outcomes) == ["claimed_elsewhere", "done"]
    done = next(o for o in outcomes if o.status == "done")
    assert done.consumed >= 1_850_000 and again == [[], []]
    chats = w.fake.chat_requests()
    assert sum(c.consumed for c in chats) == done.consumed
    assert w.gate.status(POOL).get("day_usage") == done.consumed  # counted through the gate
    t = w.totals()
    assert (t.billed, t.burned) == (0, 0)
    claim = json.loads(w.client.get(w.keyspace.consume_done(POOL, done.day)))
    assert claim["status"] == "done" and claim["consumed"] == done.consumed
    assert "🍽️ [CONSUME]" in caplog.text and "skip: today's run is already claimed" in caplog.text


def test_the_run_stops_short_of_the_balance_wall(make_world):
    """Expiring tokens beyond the free headroom: the task stops SMALL_BUFFER short; nothing bills."""
    w = live_world(make_world, "2026-08-30 20:00")
    # 900k expiring tomorrow; the rest of the pool is used by someone else outside the proxy.
    w.fake.add_package(POOL, 900_000, acquired_ms=beijing_ms("2026-08-01 09:00"))
    svc = w.service()
    svc.tick()
    w.fake.consume(POOL, 500_000)  # outside the proxy: only the balance shows it
    w.clock.set(beijing_ms("2026-08-30 22:00"))
    svc.sync_account(ACCOUNT, svc.pools())
    w.clock.set(beijing_ms("2026-08-30 23:00"))
    (outcome,) = consume_task(w).tick()
    assert outcome.plan is not None and outcome.plan.need > outcome.plan.tokens
    assert "clamped by the balance wall" in outcome.plan.reason
    t = w.totals()
    assert (t.billed, t.burned) == (0, 0)
    assert 250_000 <= outcome.consumed <= 400_000 - 2 * 50_000
    assert t.true_balance >= 50_000


def test_failing_calls_stop_the_run_and_count_nothing(make_world):
    """A wrong API key (401 each call): three failures stop the run; nothing is counted as used."""
    w = live_world(make_world, "2026-08-30 22:00")
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-01 09:00"))
    svc = w.service()
    svc.tick()
    w.clock.set(beijing_ms("2026-08-30 23:10"))
    (outcome,) = consume_task(w, key="ark-wrong").tick()
    assert outcome.status == "done" and outcome.consumed == 0 and outcome.calls == 3
    assert "3 failed calls in a row" in outcome.stop
    state = w.gate.status(POOL)
    assert (state.get("day_usage"), state.get("inflight")) == (0, 0)


def test_the_task_waits_for_its_hour_and_a_fresh_snapshot(make_world):
    """Before 23:00 the tick does nothing; with a stale snapshot it claims nothing and runs later."""
    w = live_world(make_world, "2026-08-30 20:00", snapshot_max_age_minutes=180)
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-01 09:00"))
    svc = w.service()
    svc.tick()
    task = consume_task(w)
    w.clock.set(beijing_ms("2026-08-30 22:59"))
    assert task.tick() == []
    w.clock.set(beijing_ms("2026-08-30 23:30"))  # the 20:00 snapshot is valid until 23:00
    (outcome,) = task.tick()
    assert outcome.status == "skipped" and "stale" in outcome.stop
    assert w.client.get(w.keyspace.consume_done(POOL, outcome.day)) is None
    svc.sync_account(ACCOUNT, svc.pools())  # the sync catches up
    (outcome,) = task.tick()
    assert outcome.status == "done" and outcome.consumed >= 1_850_000


@pytest.mark.parametrize("enabled", [True, False])
def test_proxy_sync_thread_schedules_the_task_only_when_enabled(enabled, monkeypatch):
    """The proxy's runtime adds the consume tick to the sync thread when VQG_CONSUME_ENABLED=true."""
    from volc_quota_guard.config import load_settings
    from volc_quota_guard.proxy import runtime

    started = []
    monkeypatch.setattr(runtime.SyncService, "start", lambda self, poll: started.append(self))
    monkeypatch.setattr(runtime, "PROCESS", runtime.Process())
    monkeypatch.setattr(runtime.atexit, "register", lambda *a: None)
    svc = runtime.start(load_settings(consume_enabled=enabled))
    assert svc is not None and started == [svc]
    assert len(svc.after_tick) == (1 if enabled else 0)


def test_calls_that_may_have_run_count_their_whole_budget(make_world):
    """Ark answers 500 (it may have run): each call's reservation is kept as consumed, 3 stop it."""
    import httpx

    from volc_quota_guard.volcengine.ark import ArkChat

    seen: list[dict] = []

    def upstream(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        assert request.headers["authorization"] == f"Bearer ark-{ACCOUNT}"
        return httpx.Response(500, json={"error": {"message": "boom"}})

    w = live_world(make_world, "2026-08-30 22:00")
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-01 09:00"))
    svc = w.service()
    svc.tick()
    w.clock.set(beijing_ms("2026-08-30 23:00"))
    targets = targets_from_model_list(model_list(w), env=ARK_ENV)
    task = ConsumeTask(w.cfg, Gate(w.client, w.keyspace, w.clock), lambda: targets,
                       chat=ArkChat(5, transport=httpx.MockTransport(upstream)))
    (outcome,) = task.tick()
    budget = w.cfg.consume_call_tokens
    # Each call counts its whole reservation, its DeepSeek prompt at the exact class's miscount
    # ceiling (1.5, nothing measured it) instead of the 1.1 it was held at, plus its output cap.
    assert outcome.calls == 3 and 3 * (budget - 100) < outcome.consumed <= 3 * budget * 15 // 11
    assert [s["max_completion_tokens"] for s in seen] == [w.cfg.consume_output_tokens] * 3
    assert all(s["model"] == MODEL for s in seen)
    state = w.gate.status(POOL)
    assert (state.get("day_usage"), state.get("inflight")) == (outcome.consumed, 0)


def test_a_failing_history_write_still_finishes_the_days_claim(make_world, caplog):
    """Redis failing on the history counter (`hincrby`) mid-run stops the run as failed and marks
    the day's claim done: it is never left "running"."""
    from sync.failing_store import FailingCommands

    w = live_world(make_world, "2026-08-30 22:00")
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-01 09:00"))
    w.service().tick()
    w.clock.set(beijing_ms("2026-08-30 23:00"))
    targets = targets_from_model_list(model_list(w), env=ARK_ENV)
    gate = Gate(FailingCommands(w.client, "hincrby"), w.keyspace, w.clock)  # type: ignore[arg-type]
    with caplog.at_level(logging.ERROR, logger="volc_quota_guard.consume"):
        (outcome,) = ConsumeTask(w.cfg, gate, lambda: targets).tick()
    assert outcome.status == "done" and outcome.calls == 1 and outcome.stop.startswith("failed")
    assert "failed unexpectedly" not in caplog.text
    claim = json.loads(w.client.get(w.keyspace.consume_done(POOL, outcome.day)))
    assert claim["status"] == "done" and claim["stop"] == outcome.stop


def test_the_task_waits_while_the_store_clock_is_distrusted(make_world):
    """It spends on the store's Beijing day, which a wrong clock moves (red-team, stop 37: a run
    at 00:05 on a Redis clock 10 minutes slow spent the previous day's room, 1,949,207, on Ark's
    new day): while the sync thread's clock alarm is set it claims nothing; then it runs."""
    w = live_world(make_world, "2026-08-30 22:00")
    w.fake.add_package(POOL, 2_000_000, acquired_ms=beijing_ms("2026-08-01 09:00"))
    svc = w.service()
    svc.tick()
    w.clock.set(beijing_ms("2026-08-30 23:10"))
    task = consume_task(w)
    task.alarm = SkewAlarm()
    task.alarm.reason = "the Redis server's clock is -600.0 s off this host's"
    (outcome,) = task.tick()
    assert outcome.status == "skipped" and outcome.stop.startswith("clock:")
    assert w.client.get(w.keyspace.consume_done(POOL, outcome.day)) is None
    assert w.gate.status(POOL).get("day_usage") == 0
    task.alarm.reason = None
    (outcome,) = task.tick()
    assert outcome.status == "done" and outcome.consumed >= 1_850_000
