"""A first start on a busy account and a wiped store, simulated (issue 14): when the pool serves
again, and what a mid-day wipe costs in availability and in collection."""

from __future__ import annotations

from collections import Counter

from backend import TEST_REDIS_URL
from volc_quota_guard.simulator import load_scenario, parse_scenario, simulate
from volc_quota_guard.simulator.scenario import Scenario, arrivals

MIN = 60_000
POLL_MS = 5_000


def first_served_after(s: Scenario, event_ms: int) -> int:
    """When the first request after `event_ms` was admitted (from the run's refusals)."""
    blocked = Counter(simulate(s, "guard", series=True, store_url=TEST_REDIS_URL).series.blocked_at)
    for a in arrivals(s):
        if a.at_ms > event_ms and blocked[a.at_ms] < a.count:
            return a.at_ms
    raise AssertionError("nothing was served after the event")


def test_a_busy_first_start_serves_from_its_first_sync() -> None:
    """cold-start-busy-account: not held (the unseen bound is kept off the wall instead): the
    first request after the first sync is served."""
    s = load_scenario("cold-start-busy-account")
    served = first_served_after(s, s.start_ms - 1)
    assert served - s.start_ms <= POLL_MS


def test_a_wiped_store_serves_again_within_the_report_window() -> None:
    """redis-wiped-midday on an account declared idle before the first start
    (VQG_UNSEEN_DAY_TOKENS=0): the simulated proxy is one process, and its checkpoint holds all
    it admitted, so the lost state is held only for the report window (three 5-s polls and 2 s:
    any process polling reports by then; stop 42, it was held for Δ_assumed before): served
    again within that and the sync poll after the wipe. (With the default bound the first
    start's 200,000 stay unproven on this 300,000 pool, and the lost generation keeps them off
    too: fuzz seed 1602 billed 45,357 when it forgot them, stop 46.)"""
    s = load_scenario("redis-wiped-midday").model_copy(update={"unseen_day_tokens": 0})
    assert s.wipe_ms is not None
    served = first_served_after(s, s.wipe_ms)
    assert served - s.wipe_ms <= 17_000 + 2 * POLL_MS + 1_000


COLLECTION_DAY = """
version: 1
name: wipe-on-a-collection-day
start: 2026-08-20T00:00:00+08:00
days: 1
daily_cap: 2000000
settlement_lag_minutes: 14
sync_interval_minutes: 10
small_buffer: 50000
packages:
  - {amount: 20000000, acquired: 2026-08-19T10:30:00+08:00}
traffic:
  - {from: "08:00", to: "22:00", every_seconds: 60, prompt: 3000, completion: 900, max_tokens: 1024}
"""


def test_what_a_midday_wipe_costs_on_a_day_that_collects_the_cap() -> None:
    """A day whose demand (~3.3M) would reach the 2M cap at ~16:30, with and without a wipe at
    14:05: the wipe costs the unseen-day margin (200,000) of collection, and nothing is billed
    or burned."""
    base = parse_scenario(COLLECTION_DAY)
    wiped = parse_scenario(COLLECTION_DAY + 'wipe_at: "14:05"\n')
    kept, lost = (simulate(s, "guard", store_url=TEST_REDIS_URL) for s in (base, wiped))
    cost = kept.served_tokens - lost.served_tokens
    print(f"collection day: served {kept.served_tokens:,} without a wipe, {lost.served_tokens:,} "
          f"with one at 14:05: {cost:,} tokens of collection not used")
    assert (lost.billed_tokens, lost.burned_tokens) == (0, 0)
    assert kept.served_tokens >= 2_000_000 - 60_000
    # The margin, and the request in flight at the wipe counted at the miscount ceiling (its
    # settle is lost with the state).
    assert 150_000 <= cost <= 200_000 + 3 * 3_000 + 1_024 + 1_000


BALANCE_DAY = COLLECTION_DAY.replace("amount: 20000000", "amount: 1500000")


def test_what_a_midday_wipe_costs_on_a_day_bound_by_the_balance() -> None:
    """The same traffic on a 1.5M pool (the balance wall binds), wiped at 12:05: the new
    generation keeps its unseen bound off the wall, the day still serves what it would have,
    and nothing is billed."""
    base = parse_scenario(BALANCE_DAY)
    wiped = parse_scenario(BALANCE_DAY + 'wipe_at: "12:05"\n')
    kept, lost = (simulate(s, "guard", store_url=TEST_REDIS_URL) for s in (base, wiped))
    cost = kept.served_tokens - lost.served_tokens
    print(f"balance day: served {kept.served_tokens:,} without a wipe, {lost.served_tokens:,} "
          f"with one at 12:05: {cost:,} tokens refused while free")
    assert (lost.billed_tokens, lost.burned_tokens) == (0, 0)
    assert cost <= 200_000
