"""The daily cap's count, reconciled from the billing API (limit.py `day_step`, snapshot.lua):
usage the guard kept whole because nobody reported it leaves the count once the API shows the day
used less. Fake Volcengine over HTTP → SyncService → gate, on one manual clock."""

from __future__ import annotations

from sync.conftest import MIN, POOL, beijing_ms

CAP = 300_000
RESERVED, TRUE = 100_000, 20_000  # what each unreported request held, what it consumed


def _unreported(w, n: int) -> None:
    """`n` requests whose upstream sent no usage: the guard keeps each reservation as consumed."""
    for _ in range(n):
        w.seq += 1
        rid = f"req-{w.seq}"
        assert w.gate.reserve(POOL, rid, RESERVED).admitted
        w.clock.advance(20_000)
        w.fake.consume(POOL, TRUE)
        w.gate.settle(POOL, rid, None)


def _world(make_world, lag_minutes: float = 10):
    w = make_world("2026-08-20 09:00", lag_minutes=lag_minutes, daily_cap=CAP,
                   sync_interval_minutes=5)
    w.fake.add_package(POOL, 5_000_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    return w, w.service()


def test_unreported_usage_leaves_the_daily_cap_once_the_api_shows_less(make_world):
    """Three unreported requests fill the 300,000 cap by the guard's count (60,000 really ran).
    An hour and a half of syncs later the API has shown the day, the cap counts ~60,000, and new
    requests run — up to the true cap and not past it."""
    w, svc = _world(make_world)
    svc.tick()
    _unreported(w, 3)
    assert w.gate.status(POOL).decision.used_today == 3 * RESERVED
    assert not w.gate.reserve(POOL, "too-soon", 10_000).admitted  # nothing shown yet: fail closed
    w.idle("2026-08-20 10:30", svc)
    counted = w.gate.status(POOL).decision.used_today
    assert 3 * TRUE <= counted < 3 * TRUE + 10_000, counted
    w.run("2026-08-20 12:00", every_ms=30_000, tokens=10_000, svc=svc)
    assert w.served >= CAP - 3 * TRUE - 20_000  # the cap's real room was used ...
    t = w.totals()
    assert (t.billed, t.burned) == (0, 0), t  # ... and never passed
    assert t.collected_today <= CAP


def test_the_count_never_drops_below_what_the_api_may_not_show_yet(make_world):
    """With a 45-min lag (past the 20-min floor) the count keeps the unreported reservations
    until the API can have shown them: Δ_assumed + 40 min, an hour at the floor."""
    w, svc = _world(make_world, lag_minutes=45)
    svc.tick()
    _unreported(w, 3)
    w.idle("2026-08-20 09:50", svc)
    assert w.gate.status(POOL).decision.used_today == 3 * RESERVED
    w.idle("2026-08-20 12:00", svc)
    counted = w.gate.status(POOL).decision.used_today
    assert 3 * TRUE <= counted < 3 * RESERVED, counted


def test_a_new_day_counts_from_the_last_sync_before_midnight(make_world):
    """Yesterday's usage is not today's: the chain that starts before midnight counts only what
    the API settled since, and today's first unreported request is kept until shown."""
    w = make_world("2026-08-20 23:00", lag_minutes=10, daily_cap=CAP, sync_interval_minutes=5)
    w.fake.add_package(POOL, 5_000_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    svc = w.service()
    w.run("2026-08-20 23:50", every_ms=60_000, tokens=5_000, svc=svc)  # 250,000 yesterday
    w.idle("2026-08-21 00:10", svc)
    _unreported(w, 2)
    w.idle("2026-08-21 01:30", svc)
    d = w.gate.status(POOL).decision
    # The chain may still hold some of yesterday's last minutes (the API's lag) but not the day.
    assert 2 * TRUE <= d.used_today < 2 * TRUE + 60_000, d.used_today
    assert w.totals().burned == 0


def test_a_step_is_the_lower_of_the_packages_loss_and_our_own_count():
    """Per package: what it lost (a new one: its size less what is left); a package of unknown
    size bounds nothing, so the step is what the guard counted in the window (plus in flight),
    never nothing. No previous sync, or a history shorter than the window: no step."""
    from volc_quota_guard.limit import PackageView, UsageView, day_step

    now = 200 * MIN
    view = UsageView(((100, 1_000), (160, 50_000)), 0, lifetime_usage=50_000, inflight=700)
    before = {"a": 900_000}
    args = dict(lag_ms=20 * MIN, history_start_ms=1)
    unknown = [PackageView("a", 880_000, None, 1_000_000), PackageView("b", 10, None, 0)]
    step, counted_from = day_step(now, unknown, view, before, (), now - 5 * MIN, **args)
    assert counted_from == 1_000  # ours at minute 139: a reconcile lag (20 + 40 min) ago
    assert step == 50_000 - 1_000 + 700  # ours since the last sync's window began, plus in flight
    known = [PackageView("a", 880_000, None, 1_000_000), PackageView("b", 9_000, None, 10_000)]
    step, _ = day_step(now, known, view, before, (), now - 5 * MIN, **args)
    assert step == 20_000 + 1_000  # the packages' own loss, the lower bound here
    gone = [PackageView("b", 9_000, None, 10_000)]  # "a" left the list: all it showed counts
    assert day_step(now, gone, view, before, (), now - 5 * MIN, **args)[0] == 49_700
    assert day_step(now, known, view, before, (), 0, **args) == (None, 1_000)  # no previous sync
    # A history shorter than the window: the packages still bound the step, our count does not.
    short = dict(lag_ms=20 * MIN, history_start_ms=now - 30 * MIN)
    assert day_step(now, known, view, before, (), now - 5 * MIN, **short) == (21_000, None)
    assert day_step(now, unknown, view, before, (), now - 5 * MIN, **short) == (None, None)
    late = UsageView(view.minutes, 0, 50_000, 700, since_ms=now - 30 * MIN)  # a read too short
    assert day_step(now, unknown, late, before, (), now - 5 * MIN, **args) == (None, None)
