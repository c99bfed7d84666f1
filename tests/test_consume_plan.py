"""The consume planner: FIFO waste under the forecast, the nights that must save it, the clamps."""

from __future__ import annotations

from volc_quota_guard.consume_plan import (
    Forecast,
    forecast_natural,
    package_fates,
    plan_pool,
    tonight_need,
)

H = 3_600_000
D = 24 * H
NOW = 1_788_000_000_000 - (1_788_000_000_000 + 8 * H) % D + 23 * H  # a Beijing 23:00
POOL = "acct-a/deepseek-v4-flash-ga-260731"


def pkg(name: str, available: int, expires_in_ms: int) -> dict[str, object]:
    return {"instance_no": name, "available": available, "expires_ms": NOW + expires_in_ms}


def plan(packages, per_day=0, unsettled=0, collection_room=10**9, balance_room=10**9,
         lead_ms=H):
    return plan_pool(pool=POOL, now_ms=NOW, packages=packages, unsettled=unsettled,
                     forecast=Forecast(per_day, "test"), next_run_ms=NOW + D,
                     daily_cap=2_000_000, small_buffer=50_000,
                     collection_room=collection_room, balance_room=balance_room, lead_ms=lead_ms)


def test_fifo_natural_usage_eats_the_oldest_package_first():
    """Forecast usage drains the soonest-expiring package first; what is left at expiry is waste."""
    fates = package_fates([pkg("new", 500_000, 20 * D), pkg("old", 100_000, 2 * D)],
                          now_ms=NOW, unsettled=0, per_day=30_000, next_run_ms=NOW + D)
    assert [f.instance_no for f in fates] == ["old", "new"]
    assert fates[0].waste == 100_000 - 60_000  # two days of 30k from the old one
    assert fates[1].waste == 0  # 18 more days of 30k use all of its 500k
    assert (fates[0].due_run, fates[1].due_run) == (1, 19)


def test_unsettled_usage_is_taken_from_the_oldest_before_forecasting():
    """Usage the API has not settled yet comes off the oldest package's shown balance."""
    (fate,) = package_fates([pkg("p", 100_000, 10 * H)], now_ms=NOW, unsettled=30_000, per_day=0,
                            next_run_ms=NOW + D)
    assert (fate.available, fate.waste, fate.due_run) == (70_000, 70_000, 0)


def test_tonight_consumes_only_what_expires_before_the_next_run():
    """Waste of a package expiring after tomorrow's run is left for a later night."""
    p = plan([pkg("soon", 300_000, 10 * H), pkg("later", 400_000, 5 * D)])
    assert p.tokens == p.need == 300_000
    assert "soon expires" in p.reason and "later" not in p.reason
    assert p.waste == 700_000


def test_a_crunch_pulls_later_waste_forward():
    """3.5M expiring over the next two nights cannot fit 1.95M a night: the surplus starts tonight."""
    p = plan([pkg("a", 1_000_000, 10 * H), pkg("b", 2_500_000, D + 10 * H)])
    # Tomorrow's night can take 2M − 0 − 50k = 1.95M; b's 2.5M needs 550k of it done tonight.
    assert p.need == 1_000_000 + 550_000
    assert "ahead of later nights" in p.reason


def test_the_plan_is_clamped_by_both_walls():
    """Need above a wall's room: the plan is the smaller room, and the reason names the wall."""
    p = plan([pkg("a", 1_000_000, 10 * H)], collection_room=400_000, balance_room=700_000)
    assert (p.need, p.tokens) == (1_000_000, 400_000)
    assert "clamped by the collection wall" in p.reason
    p = plan([pkg("a", 1_000_000, 10 * H)], collection_room=900_000, balance_room=-5)
    assert p.tokens == 0 and "balance wall" in p.reason


def test_a_package_within_the_lead_is_saved_the_night_before():
    """A package expiring 1.5 h after tomorrow's run (inside the lead) is due tonight."""
    p = plan([pkg("a", 500_000, D + 90 * 60_000)], lead_ms=150 * 60_000)
    assert p.tokens == 500_000 and p.fates[0].due_run == 0
    p = plan([pkg("a", 500_000, D + 90 * 60_000)], lead_ms=60 * 60_000)
    assert p.tokens == 0 and p.fates[0].due_run == 1


def test_enough_natural_usage_needs_no_consumption():
    """At 100k/day a 300k package expiring in 4 days is used up naturally: nothing to do."""
    p = plan([pkg("a", 300_000, 4 * D)], per_day=100_000)
    assert p.tokens == p.need == p.waste == 0
    assert p.reason.startswith("nothing needs saving tonight")


def test_expired_and_empty_packages_are_ignored():
    """Packages past their expiry (the snapshot predates it), empty or without expiry add nothing."""
    p = plan([pkg("gone", 100_000, -H), pkg("empty", 0, H),
              {"instance_no": "forever", "available": 5, "expires_ms": None}])
    assert p.fates == () and p.tokens == 0


def test_forecast_is_the_median_of_recent_days_else_today_so_far():
    """Median of the last 7 days; with none, today so far scaled to a day; early in the day, 0."""
    today = 20_000
    history = {today - d: v for d, v in ((1, 10_000), (2, 500_000), (3, 12_000), (9, 9))}
    assert forecast_natural(history, today, 0, 0.9).per_day == 12_000
    assert forecast_natural({}, today, 30_000, 0.5).per_day == 60_000
    assert forecast_natural({}, today, 30_000, 0.1).per_day == 0


def test_tonight_need_is_zero_without_waste():
    """No fates, no need."""
    assert tonight_need([], 1_000) == 0
