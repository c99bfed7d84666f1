"""`volc-quota-guard status` against a seeded store (real Redis or the embedded one over TCP)."""

from __future__ import annotations

import json

import pytest

from volc_quota_guard.cli import main
from volc_quota_guard.clock import ManualClock
from volc_quota_guard.gate import Gate, Snapshot
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.gate.store import connect
from volc_quota_guard.limit import LimitState

BUSY = "acct-a/deepseek-v4-flash-ga-260731"
EMPTY = "acct-a/doubao-seed-1-6-250615"
MIN = 60_000


@pytest.fixture
def seeded(store_url: str, keyspace: KeySpace, monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """Two pools on the test backend: one mid-day with traffic, one whose balance is below the buffer."""
    monkeypatch.setenv("VQG_REDIS_URL", store_url)
    monkeypatch.setenv("VQG_KEY_PREFIX", keyspace.prefix)
    client = connect(store_url)
    sec, usec = client.time()
    now = int(sec) * 1000 + int(usec) // 1000
    gate = Gate(client, keyspace, ManualClock(now - 5 * MIN))
    gate.install_snapshot(BUSY, Snapshot(
        balance=1_500_000, settled_usage=0, expiring=0, small_buffer=50_000, daily_cap=2_000_000,
        valid_until_ms=now + 85 * MIN,
        packages=[{"instance_no": "P1", "available": 1_500_000, "expires_ms": now + 600 * MIN}]))
    gate = Gate(client, keyspace, ManualClock(now))  # traffic now: on the Beijing day status reads
    gate.reserve(BUSY, "r1", 10_000)
    gate.settle(BUSY, "r1", 8_000)
    gate.reserve(BUSY, "r2", 5_000)
    state = LimitState(lags=((now - 20 * MIN, 12 * MIN), (now - 10 * MIN, 14 * MIN)))
    client.set(keyspace.pool(BUSY).limit_state, json.dumps(state.to_json()))
    client.hset(keyspace.sync_meta("acct-a"), mapping={"last_error": "BillingThrottled: HTTP 429"})
    gate.install_snapshot(EMPTY, Snapshot(
        balance=20_000, settled_usage=0, expiring=0, small_buffer=50_000, daily_cap=2_000_000,
        valid_until_ms=now + 85 * MIN))
    return {"now": now}


def test_status_json_reports_walls_usage_lag_and_eviction(seeded: dict[str, int],
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """--json gives each pool's balance, B0, usage, in-flight, walls, headroom, sync age, lag, eviction."""
    assert main(["status", "--json"]) == 0
    pools = {p["pool"]: p for p in json.loads(capsys.readouterr().out)["pools"]}
    assert set(pools) == {BUSY, EMPTY}
    busy = pools[BUSY]
    assert (busy["balance_at_sync"], busy["b0_estimate"]) == (1_500_000, 1_500_000)
    assert (busy["usage_today"], busy["lifetime_usage"], busy["inflight"]) == (8_000, 8_000, 5_000)
    assert (busy["balance_used"], busy["balance_wall"]) == (13_000, 1_450_000)
    assert (busy["collection_used"], busy["collection_wall"]) == (13_000, 2_000_000)
    assert busy["headroom"] == 1_437_000 and busy["binding_wall"] == "balance"
    assert 4.9 <= busy["sync_age_minutes"] <= 6
    assert (busy["lag_observed_minutes"], busy["lag_worst_minutes"]) == (14.0, 14.0)
    assert busy["lag_assumed_minutes"] == 20.0  # max(floor 20, 14 × 1.25 + 2)
    assert busy["evicted"] is False and busy["stale"] is False
    assert busy["last_sync_error"] == "BillingThrottled: HTTP 429"
    assert busy["next_expiry_ms"] == seeded["now"] + 600 * MIN
    empty = pools[EMPTY]
    assert empty["headroom"] == -30_000
    assert (empty["evicted"], empty["evicted_wall"]) == (True, "balance")
    assert empty["lag_observed_minutes"] is None


def test_status_table_is_readable_at_a_glance(seeded: dict[str, int],
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """The human table shows each pool on one line with its walls and an EVICTED marker."""
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert BUSY in out and EMPTY in out
    assert "13,000 / 1,450,000" in out
    assert "EVICTED" in out and "next snapshot" in out
    assert "14 / 20 min" in out


def test_status_can_show_one_pool(seeded: dict[str, int], capsys: pytest.CaptureFixture[str]) -> None:
    """--pool limits the output to the named pools."""
    assert main(["status", "--json", "--pool", EMPTY]) == 0
    pools = json.loads(capsys.readouterr().out)["pools"]
    assert [p["pool"] for p in pools] == [EMPTY]


def test_status_with_no_pools_says_where_it_looked(keyspace: KeySpace, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch, store_url: str) -> None:
    """An empty prefix is not an error: the command says it found no pools under it."""
    monkeypatch.setenv("VQG_REDIS_URL", store_url)
    monkeypatch.setenv("VQG_KEY_PREFIX", keyspace.prefix)
    assert main(["status"]) == 0
    assert f"no guarded pools under prefix {keyspace.prefix!r}" in capsys.readouterr().out


def _cli_gate(store_url: str, keyspace: KeySpace, monkeypatch: pytest.MonkeyPatch) -> tuple[Gate, int]:
    """A gate on the store the CLI reads (its env set), and the server's time now (ms)."""
    monkeypatch.setenv("VQG_REDIS_URL", store_url)
    monkeypatch.setenv("VQG_KEY_PREFIX", keyspace.prefix)
    client = connect(store_url)
    sec, usec = client.time()
    now = int(sec) * 1000 + int(usec) // 1000
    gate = Gate(client, keyspace)
    return gate, now


def test_status_and_metrics_show_a_held_pool(store_url: str, keyspace: KeySpace,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A pool whose first snapshot holds it (history shorter than the lag) shows `🕒 HELD (cold
    start) until HH:MM` in `status`, its hold and unseen-day fields in `--json`, and `vqg_held 1`."""
    gate, now = _cli_gate(store_url, keyspace, monkeypatch)
    gate.install_snapshot(BUSY, Snapshot(
        balance=300_000, settled_usage=0, expiring=0, small_buffer=10_000, daily_cap=2_000_000,
        valid_until_ms=now + 85 * MIN, hold_until_ms=now + 20 * MIN, hold_cap=0,
        unseen_day_tokens=200_000))
    assert main(["status", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["pools"][0]
    assert row["held"] and row["hold_cause"] == "cold start" and not row["state_lost"]
    assert now + 19 * MIN < row["held_until_ms"] <= now + 21 * MIN
    assert row["history_start_ms"] >= now - MIN and row["unseen_today"] == 200_000
    assert row["balance_wall"] == 0 and row["collection_wall"] == 1_800_000
    assert main(["status"]) == 0
    assert "🕒 HELD (cold start) until" in capsys.readouterr().out
    assert main(["metrics"]) == 0
    text = capsys.readouterr().out
    assert f'vqg_held{{account="acct-a",model="deepseek-v4-flash-ga-260731",pool="{BUSY}"}} 1.0' in text
    assert "vqg_unseen_today_tokens{" in text and "vqg_state_lost{" in text


def _unseen_pool(store_url: str, keyspace: KeySpace, monkeypatch: pytest.MonkeyPatch, off: int,
                 **state: int) -> tuple[Gate, int]:
    """A 300,000 pool whose snapshot keeps `off` off the wall as unseen, and its limit state."""
    gate, now = _cli_gate(store_url, keyspace, monkeypatch)
    gate.install_snapshot(BUSY, Snapshot(
        balance=300_000, settled_usage=0, expiring=off, small_buffer=10_000, daily_cap=2_000_000,
        valid_until_ms=now + 85 * MIN, unseen_day_tokens=200_000))
    hist = gate.status(BUSY).get("hist_at")
    gate.records.write_limit_state(BUSY, LimitState(generation=hist, **state).to_json())
    return gate, hist


def test_status_and_metrics_show_a_young_pool(store_url: str, keyspace: KeySpace,
                                              monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """A first start under the unseen bound is not held: `status` shows `🕒 YOUNG (cold start):
    200,000 kept off the balance` with when that ends at the latest, `--json` the same fields,
    and /metrics `vqg_unseen_balance_tokens`; the wall is the balance less the bound."""
    gate, hist = _unseen_pool(store_url, keyspace, monkeypatch, 200_000,
                              unseen_ref=300_000, unseen_bound=200_000)
    assert main(["status", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["pools"][0]
    assert not row["held"] and row["unseen_balance"] == 200_000
    assert row["young_until_ms"] == hist + 8 * 60 * MIN and row["balance_wall"] == 90_000
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "🕒 YOUNG (cold start): 200,000 off" in out, out
    assert main(["metrics"]) == 0
    text = capsys.readouterr().out
    assert (f'vqg_unseen_balance_tokens{{account="acct-a",model="deepseek-v4-flash-ga-260731",'
            f'pool="{BUSY}"}} 200000.0') in text


def test_status_shows_an_unseen_bound_kept_after_a_young_history_ended(
        store_url: str, keyspace: KeySpace, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A young history that ended by age without the API showing its bound settled keeps it off
    the wall (the lowest estimate): `status` says so with no end time, `--json` has it in
    `unseen_balance` (no `young_until_ms`), /metrics in `vqg_unseen_balance_tokens`. A state of
    another generation does not count."""
    gate, hist = _unseen_pool(store_url, keyspace, monkeypatch, 150_000,
                              unseen_bound=200_000, unseen_kept=150_000)
    assert main(["status", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)["pools"][0]
    assert row["unseen_balance"] == 150_000 and row["young_until_ms"] is None
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "unseen not proven settled: 150,000 off" in out, out
    assert "YOUNG" not in out
    assert main(["metrics"]) == 0
    assert (f'vqg_unseen_balance_tokens{{account="acct-a",model="deepseek-v4-flash-ga-260731",'
            f'pool="{BUSY}"}} 150000.0') in capsys.readouterr().out
    gate.records.write_limit_state(BUSY, LimitState(generation=hist + 1, unseen_kept=150_000).to_json())
    assert main(["status", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["pools"][0]["unseen_balance"] == 0
