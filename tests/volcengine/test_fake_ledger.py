"""The fake ledger's free-quota rules (DESIGN.md §1), checked without any I/O."""

from __future__ import annotations

import time
from datetime import datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from volc_quota_guard.clock import BEIJING, MS_PER_DAY, beijing_day
from volc_quota_guard.fake import Ledger

POOL = "acct/deepseek-v4-flash-ga-260731"
MIN = 60_000
HOUR = 60 * MIN


def bj(*args: int) -> int:
    return int(datetime(*args, tzinfo=BEIJING).timestamp() * 1000)  # type: ignore[misc]


T0 = bj(2026, 8, 13, 9, 0)


def test_consumption_draws_the_oldest_package_first() -> None:
    """FIFO: the package acquired first is drained before a newer one is touched."""
    led = Ledger(lag_minutes=0)
    newer = led.add_package(POOL, 1000, T0 - 1 * MS_PER_DAY)
    older = led.add_package(POOL, 1000, T0 - 5 * MS_PER_DAY)
    led.consume(POOL, 1500, T0)
    left = {v.instance_no: v.available for v in led.true_packages(POOL, T0)}
    assert left == {older: 0, newer: 500}


def test_consumption_beyond_the_true_balance_is_billed() -> None:
    """Whatever exceeds the free balance is billed, and only that part."""
    led = Ledger(lag_minutes=0)
    led.add_package(POOL, 1000, T0 - HOUR)
    c = led.consume(POOL, 1300, T0)
    assert (c.free, c.billed) == (1000, 300)
    assert led.totals(POOL, T0).billed == 300
    assert led.consume(POOL, 50, T0 + 1).billed == 50


def test_a_package_expires_at_its_expiry_and_its_rest_counts_as_expired() -> None:
    """At expires_ms the remainder is lost (expired), and later use is billed."""
    led = Ledger(lag_minutes=0)
    led.add_package(POOL, 1000, T0 - 29 * MS_PER_DAY, expires_ms=T0 + HOUR)
    led.consume(POOL, 400, T0)
    assert led.true_balance(POOL, T0 + HOUR - 1) == 600
    assert led.true_balance(POOL, T0 + HOUR) == 0
    totals = led.totals(POOL, T0 + HOUR)
    assert totals.expired == 600
    assert led.consume(POOL, 10, T0 + HOUR).billed == 10


def test_default_expiry_is_thirty_days_after_acquisition() -> None:
    """A package without an explicit expiry lives exactly 30 days."""
    led = Ledger(lag_minutes=0)
    led.add_package(POOL, 1000, T0)
    assert led.true_packages(POOL, T0)[0].expires_ms == T0 + 30 * MS_PER_DAY
    assert led.true_balance(POOL, T0 + 30 * MS_PER_DAY - 1) == 1000
    assert led.true_balance(POOL, T0 + 30 * MS_PER_DAY) == 0


def test_collection_is_capped_per_beijing_day_and_the_excess_burns() -> None:
    """Past the daily cap consumption is burned, and the Beijing day (not UTC) resets it."""
    led = Ledger(lag_minutes=0, daily_cap=2_000_000)
    led.add_package(POOL, 10_000_000, T0 - HOUR)
    led.consume(POOL, 1_900_000, bj(2026, 8, 13, 20, 0))
    c = led.consume(POOL, 176_571, bj(2026, 8, 13, 20, 53))
    assert c.burned == 76_571
    # 23:59 Beijing is still the 13th; 00:01 is the 14th (UTC 16:01 of the 13th).
    assert led.consume(POOL, 10, bj(2026, 8, 13, 23, 59)).burned == 10
    assert led.consume(POOL, 10, bj(2026, 8, 14, 0, 1)).burned == 0
    totals = led.totals(POOL, bj(2026, 8, 14, 0, 2))
    day13 = beijing_day(bj(2026, 8, 13, 12, 0))
    assert totals.collected[day13] == 2_000_000
    assert totals.collected_today == 10
    assert totals.burned == 76_581


def test_yesterdays_collection_returns_at_the_configured_time_and_lives_thirty_days() -> None:
    """Day N's collection (≤ cap) arrives at return_at on day N+1 and expires 30 days later."""
    led = Ledger(lag_minutes=0, return_at="10:30")
    led.add_package(POOL, 3_000_000, T0 - HOUR)
    led.consume(POOL, 2_500_000, bj(2026, 8, 13, 15, 0))
    assert led.true_balance(POOL, bj(2026, 8, 14, 10, 29)) == 500_000
    after = bj(2026, 8, 14, 10, 30)
    assert led.true_balance(POOL, after) == 2_500_000
    returned = led.true_packages(POOL, after)[-1]
    assert (returned.total, returned.acquired_ms) == (2_000_000, after)
    assert returned.expires_ms == after + 30 * MS_PER_DAY


def test_the_return_package_is_drawn_after_older_packages() -> None:
    """A returned package is the newest, so FIFO drains older ones first."""
    led = Ledger(lag_minutes=0)
    old = led.add_package(POOL, 1_000_000, T0 - 10 * MS_PER_DAY)
    led.set_collection(POOL, beijing_day(T0) - 1, 700_000)
    now = bj(2026, 8, 13, 11, 0)
    led.consume(POOL, 100_000, now)
    by_no = {v.instance_no: v.available for v in led.true_packages(POOL, now)}
    assert by_no[old] == 900_000
    assert sorted(by_no.values()) == [700_000, 900_000]


def test_the_api_view_lags_consumption_but_not_arrivals_or_expiries() -> None:
    """api_view shows consumption only after the lag, while package arrivals and expiries
    show at once."""
    led = Ledger(lag_minutes=14, return_at="10:30")
    led.add_package(POOL, 1_000_000, T0 - 29 * MS_PER_DAY, expires_ms=bj(2026, 8, 14, 10, 35))
    led.add_package(POOL, 500_000, T0 - 1 * MS_PER_DAY)
    led.set_collection(POOL, beijing_day(T0), 300_000)  # the 13th's, back on the 14th 10:30
    led.consume(POOL, 300_000, bj(2026, 8, 14, 10, 25))
    now = bj(2026, 8, 14, 10, 31)  # 6 min later: the return package (300k) has arrived
    assert led.true_balance(POOL, now) == 700_000 + 500_000 + 300_000
    assert led.api_balance(POOL, now) == 1_000_000 + 500_000 + 300_000
    now = bj(2026, 8, 14, 10, 36)  # the oldest expired; its unsettled draw does not resurface
    assert led.api_balance(POOL, now) == 500_000 + 300_000
    assert led.true_balance(POOL, now) == 500_000 + 300_000
    assert led.totals(POOL, now).expired == 700_000


def test_api_view_settles_exactly_after_the_lag() -> None:
    """A draw at t is unsettled while t > now - lag and settled from now = t + lag on."""
    led = Ledger(lag_minutes=14)
    led.add_package(POOL, 1000, T0 - HOUR)
    led.consume(POOL, 100, T0)
    assert led.api_balance(POOL, T0 + 14 * MIN - 1) == 1000
    assert led.api_balance(POOL, T0 + 14 * MIN) == 900
    view = led.api_view(POOL, T0 + 14 * MIN)[0]
    assert (view.status, view.available, view.total) == ("Effective", 900, 1000)


def test_a_lag_change_holds_back_new_draws_but_never_takes_back_a_shown_one() -> None:
    """An incident: the lag grows from 14 minutes to 4 hours at T0 + 20 min. A draw the API
    already showed stays shown; a draw after it waits the new lag (as a draw still unsettled)."""
    led = Ledger(lag_minutes=14)
    led.add_package(POOL, 1000, T0 - HOUR)
    led.consume(POOL, 100, T0)
    led.consume(POOL, 50, T0 + 10 * MIN)
    led.set_lag(240, T0 + 20 * MIN)
    assert led.api_balance(POOL, T0 + 20 * MIN) == 900
    assert led.api_balance(POOL, T0 + 4 * HOUR) == 900
    assert led.api_balance(POOL, T0 + 10 * MIN + 4 * HOUR) == 850


def test_a_drained_package_stays_effective_in_the_api_until_settled() -> None:
    """A package emptied a minute ago still shows its unsettled amount; then UsedUp."""
    led = Ledger(lag_minutes=14)
    led.add_package(POOL, 1000, T0 - HOUR)
    led.consume(POOL, 1000, T0)
    assert led.api_view(POOL, T0 + MIN)[0].status == "Effective"
    assert led.true_packages(POOL, T0 + MIN)[0].status == "UsedUp"
    assert led.api_view(POOL, T0 + 15 * MIN)[0].status == "UsedUp"


def test_time_never_goes_back() -> None:
    """A call with an earlier now_ms than a previous one is a ValueError, not silent rewind."""
    led = Ledger()
    led.consume(POOL, 1, T0)
    with pytest.raises(ValueError, match="went back"):
        led.true_balance(POOL, T0 - 1)


def test_future_packages_are_invisible_until_acquired() -> None:
    """A package with acquired_ms in the future is neither usable nor listed before then."""
    led = Ledger(lag_minutes=0)
    led.add_package(POOL, 1000, T0 + HOUR)
    assert led.api_view(POOL, T0) == []
    assert led.consume(POOL, 10, T0).billed == 10
    assert led.true_balance(POOL, T0 + HOUR) == 1000


def test_a_thirty_day_run_is_fast() -> None:
    """50k consumptions and 3k API views over 30 simulated days take well under two seconds."""
    led = Ledger(lag_minutes=14)
    led.add_package(POOL, 100_000, T0 - HOUR)  # a day and a half of this traffic
    started = time.perf_counter()
    now = T0
    step = 30 * MS_PER_DAY // 50_000
    for i in range(50_000):
        now += step
        led.consume(POOL, 40, now)
        if i % 16 == 0:
            led.api_view(POOL, now)
    elapsed = time.perf_counter() - started
    totals = led.totals(POOL, now)
    assert totals.consumed == 2_000_000
    assert totals.billed == 0  # each day's collection came back the next morning
    assert elapsed < 2.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6 * HOUR), st.integers(0, 400_000)),
                min_size=1, max_size=40),
       st.integers(0, 30))
def test_every_token_is_accounted_for(steps: list[tuple[int, int]], lag: int) -> None:
    """For any traffic: granted = balance + drawn + expired, consumed = drawn + billed,
    collected + burned = consumed, and the API view never shows less than the truth."""
    led = Ledger(lag_minutes=lag, return_at="03:00")
    led.add_package(POOL, 1_500_000, T0 - 20 * MS_PER_DAY)
    led.add_package(POOL, 800_000, T0 - 2 * MS_PER_DAY)
    now, drawn = T0, 0
    for gap, tokens in steps:
        now += gap
        drawn += led.consume(POOL, tokens, now).free
        assert led.api_balance(POOL, now) >= led.true_balance(POOL, now)
    t = led.totals(POOL, now)
    granted = sum(v.total for v in led.true_packages(POOL, now))
    assert granted == t.true_balance + drawn + t.expired
    assert t.consumed == drawn + t.billed
    assert sum(t.collected.values()) + t.burned == t.consumed
