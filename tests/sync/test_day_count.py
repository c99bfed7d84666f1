"""The daily cap's count, reconciled from the billing API (limit.py `day_step`, snapshot.lua):
usage the guard kept whole because nobody reported it leaves the count only where the API proves
it settled, never by age. Fake Volcengine over HTTP → SyncService → gate, on one manual clock."""

from __future__ import annotations

from dataclasses import replace

from sync.conftest import MIN, POOL, beijing_ms
from volc_quota_guard.limit import (
    LimitState,
    PackageView,
    UsageView,
    day_step,
    settled_floor,
)

CAP = 300_000
RESERVED, TRUE = 100_000, 20_000  # what each unreported request held, what it consumed


def _unreported(w, n: int, used: int = TRUE) -> None:
    """`n` requests whose upstream sent no usage: the guard keeps each reservation as consumed."""
    for _ in range(n):
        w.seq += 1
        rid = f"req-{w.seq}"
        assert w.gate.reserve(POOL, rid, RESERVED).admitted
        w.clock.advance(20_000)
        w.fake.consume(POOL, used)
        w.gate.settle(POOL, rid, None)


def _world(make_world, lag_minutes: float = 10):
    w = make_world("2026-08-20 09:00", lag_minutes=lag_minutes, daily_cap=CAP,
                   sync_interval_minutes=5)
    w.fake.add_package(POOL, 5_000_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    return w, w.service()


def test_unreported_usage_stays_on_the_daily_cap_until_midnight(make_world):
    """Three unreported requests fill the 300,000 cap by the guard's count (60,000 really ran).
    The API soon shows 60,000, but that cannot tell a short lag from an incident hiding the rest,
    and no lag is too long to happen (a 540-min one burned 602,908 past an 8-hour ceiling, stop
    38): the count holds all day, the cap is never passed, and the new day counts afresh."""
    w, svc = _world(make_world)
    svc.tick()
    _unreported(w, 3)
    assert w.gate.status(POOL).decision.used_today == 3 * RESERVED
    w.idle("2026-08-20 18:00", svc)
    assert w.gate.status(POOL).decision.used_today == 3 * RESERVED  # shown less, not proven less
    assert not w.gate.reserve(POOL, "still-full", 10_000).admitted
    w.idle("2026-08-21 00:10", svc)
    assert w.gate.status(POOL).decision.used_today == 0
    w.run("2026-08-21 02:00", every_ms=30_000, tokens=10_000, svc=svc)
    assert w.served >= CAP - 20_000  # the new day's cap is used ...
    t = w.totals()
    assert (t.billed, t.burned) == (0, 0), t  # ... and never passed
    assert t.collected_today <= CAP


def test_a_lag_of_hours_never_shrinks_the_count(make_world):
    """Fuzz seed 563: the API 357 min behind, and nobody reported usage. The count used to trust
    Δ_assumed + 40 min, forgot the unreported requests an hour later while the API still showed
    nothing, and let the cap be spent twice (1,013,338 burned). Unreported requests that really
    used all they reserved stay counted, and the day never passes the cap."""
    w, svc = _world(make_world, lag_minutes=357)
    svc.tick()
    _unreported(w, 3, used=RESERVED)  # each used all it reserved
    w.idle("2026-08-20 11:00", svc)
    assert w.gate.status(POOL).decision.used_today == 3 * RESERVED
    w.run("2026-08-20 18:00", every_ms=60_000, tokens=10_000, svc=svc)
    t = w.totals()
    assert (t.billed, t.burned) == (0, 0), t
    assert t.collected_today <= CAP


def test_a_new_day_counts_from_the_last_sync_before_midnight(make_world):
    """Yesterday's usage is not today's: the chain that starts before midnight counts only what
    the API settled since, and today's unreported requests stay counted whole."""
    w = make_world("2026-08-20 23:00", lag_minutes=10, daily_cap=CAP, sync_interval_minutes=5)
    w.fake.add_package(POOL, 5_000_000, acquired_ms=beijing_ms("2026-08-19 09:00"))
    svc = w.service()
    w.run("2026-08-20 23:50", every_ms=60_000, tokens=5_000, svc=svc)  # 250,000 yesterday
    w.idle("2026-08-21 00:10", svc)
    _unreported(w, 2)
    w.idle("2026-08-21 08:30", svc)
    assert w.gate.status(POOL).decision.used_today == 2 * RESERVED  # not yesterday's 250,000
    assert w.totals().burned == 0


def test_a_step_is_the_lower_of_the_packages_loss_and_our_own_count():
    """Per package: what it lost (a new one: its size less what is left); a package of unknown
    size bounds nothing, so the step is what the guard counted since the previous floor (plus in
    flight), never nothing. No previous sync, or no previous floor: no step from our count."""
    now = 200 * MIN
    view = UsageView(((100, 1_000), (160, 50_000)), 0, lifetime_usage=50_000, inflight=700)
    before = {"a": 900_000}
    args = dict(lag_ms=20 * MIN, floor_before=1_000, floor=30_000)
    unknown = [PackageView("a", 880_000, None, 1_000_000), PackageView("b", 10, None, 0)]
    step, counted_from = day_step(now, unknown, view, before, (), now - 5 * MIN, **args)
    assert counted_from == 30_000  # the proven floor, under ours Δ_assumed ago (50,000)
    assert step == 50_000 - 1_000 + 700  # ours since the previous floor, plus in flight
    known = [PackageView("a", 880_000, None, 1_000_000), PackageView("b", 9_000, None, 10_000)]
    step, _ = day_step(now, known, view, before, (), now - 5 * MIN, **args)
    assert step == 20_000 + 1_000  # the packages' own loss, the lower bound here
    gone = [PackageView("b", 9_000, None, 10_000)]  # "a" left the list: all it showed counts
    assert day_step(now, gone, view, before, (), now - 5 * MIN, **args)[0] == 49_700
    assert day_step(now, known, view, before, (), 0, **args) == (None, 30_000)  # no previous sync
    # The floor is never above our usage Δ_assumed ago; a negative or unknown one says nothing.
    assert day_step(now, known, view, before, (), now - 5 * MIN,
                    **(args | dict(floor=60_000)))[1] == 50_000
    assert day_step(now, known, view, before, (), now - 5 * MIN,
                    **(args | dict(floor=-5_000)))[1] is None
    no_floor = dict(lag_ms=20 * MIN, floor_before=None, floor=None)
    assert day_step(now, known, view, before, (), now - 5 * MIN, **no_floor) == (21_000, None)
    assert day_step(now, unknown, view, before, (), now - 5 * MIN, **no_floor) == (None, None)


def test_the_floor_rises_only_by_what_the_packages_lost():
    """`settled_floor`: a new history starts at −A; each sync adds the least the API can have
    settled (a package that left the list may have expired whole: nothing); never above our
    usage; and no age raises it (our usage of 9 hours ago is not proven settled)."""
    now = 10 * 60 * MIN
    view = UsageView(((60, 40_000), (now // MIN - 30, 90_000)), 0, lifetime_usage=90_000,
                     inflight=0)
    fresh = LimitState(unseen_bound=200_000)
    assert settled_floor(fresh, {}, (), 0, [PackageView("a", 5, None)], view) == -200_000
    state = LimitState(settled_floor=10_000, last_sync_ms=now - 5 * MIN)
    before = {"a": 500_000, "b": 70_000}
    pkgs = [PackageView("a", 480_000, None), PackageView("c", 90_000, None, 100_000)]
    # a lost 20,000; c is new (10,000 of it used); b left the list (expired, maybe whole).
    assert settled_floor(state, before, (), now - 5 * MIN, pkgs, view) == 40_000
    low = replace(state, settled_floor=-50_000)
    assert settled_floor(low, before, (), now - 5 * MIN, pkgs, view) == -20_000  # not 40,000
    # ... and never above what we recorded.
    high = replace(state, settled_floor=85_000)
    assert settled_floor(high, before, (), now - 5 * MIN, pkgs, view) == 90_000
    assert settled_floor(replace(state, settled_floor=None), before, (), now - 5 * MIN, pkgs, view) is None
