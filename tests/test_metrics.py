"""Prometheus metrics: the pools' gauges come from the shared store (CLI and HTTP endpoint alike),
the counters from what this process did."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families
from secure_redis import free_port

from volc_quota_guard import cli, metrics
from volc_quota_guard.clock import ManualClock
from volc_quota_guard.config import load_settings
from volc_quota_guard.gate import Decision, Gate, Snapshot
from volc_quota_guard.gate.keys import KeySpace

BUSY = "acct-m/busy-model"
STALE = "acct-m/stale-model"


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def at(found: dict, name: str, **labels: str) -> float | None:
    hits = [v for (n, lab), v in found.items() if n == name and set(labels.items()) <= lab]
    return hits[0] if len(hits) == 1 else None


@pytest.fixture
def seeded(store_url: str, keyspace: KeySpace, monkeypatch: pytest.MonkeyPatch) -> Iterator[Gate]:
    """Two pools on the test store: one busy (usage, a reservation in flight, a failed sync), one
    whose snapshot went stale; the environment points the CLI at them."""
    gate = Gate(redis.Redis.from_url(store_url), keyspace)
    now = gate.now_ms()
    gate.install_snapshot(BUSY, Snapshot(100_000, 0, 0, 5_000, 2_000_000, now + 600_000, 1_000))
    gate.reserve(BUSY, "done", 4_000)
    gate.settle(BUSY, "done", 3_000)
    gate.reserve(BUSY, "running", 7_000)
    gate.client.hset(keyspace.sync_meta("acct-m"), mapping={"last_error": "BillingThrottled: slow down"})
    earlier = Gate(gate.client, keyspace, ManualClock(now - 3 * 3_600_000))  # a sync 3 h ago
    earlier.install_snapshot(STALE, Snapshot(50_000, 0, 0, 0, 2_000_000, now - 3_600_000, 0))
    monkeypatch.setenv("VQG_REDIS_URL", store_url)
    monkeypatch.setenv("VQG_KEY_PREFIX", keyspace.prefix)
    yield gate


def test_cli_prints_every_pool_from_the_store(seeded: Gate, capsys: pytest.CaptureFixture[str]) -> None:
    """`volc-quota-guard metrics` shows usage, in-flight, walls, headroom, staleness and sync
    errors as the store holds them, and exits 0."""
    assert cli.main(["metrics"]) == 0
    found = samples(capsys.readouterr().out)
    busy = {"pool": BUSY, "account": "acct-m", "model": "busy-model"}
    assert at(found, "vqg_store_up") == 1
    assert at(found, "vqg_usage_today_tokens", **busy) == 3_000
    assert at(found, "vqg_lifetime_usage_tokens", **busy) == 3_000
    assert at(found, "vqg_inflight_tokens", **busy) == 7_000
    assert at(found, "vqg_wall_limit_tokens", wall="balance", **busy) == 95_000  # 100k - buffer
    assert at(found, "vqg_wall_used_tokens", wall="balance", **busy) == 10_000
    assert at(found, "vqg_wall_limit_tokens", wall="collection", **busy) == 2_000_000
    assert at(found, "vqg_headroom_tokens", **busy) == 85_000
    assert at(found, "vqg_balance_at_sync_tokens", **busy) == 100_000
    assert at(found, "vqg_small_buffer_tokens", **busy) == 5_000
    assert at(found, "vqg_sync_error", **busy) == 1
    assert at(found, "vqg_snapshot_stale", **busy) == 0
    assert at(found, "vqg_snapshot_stale", pool=STALE) == 1
    assert at(found, "vqg_evicted", pool=STALE) == 0
    assert at(found, "vqg_snapshot", pool=STALE) == 1
    assert 3 * 3600 <= at(found, "vqg_sync_age_seconds", pool=STALE) < 4 * 3600
    assert at(found, "vqg_lag_assumed_seconds", **busy) == 20 * 60
    assert at(found, "vqg_overruns_total", **busy) == 0
    assert at(found, "vqg_billing", **busy) == 0
    assert at(found, "vqg_estimate_correction", **busy) >= 1
    assert at(found, "vqg_exact_correction", **busy) >= 1.1  # kx: at least the exact floor


def test_endpoint_serves_gauges_and_this_process_counters(seeded: Gate,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy's endpoint (VQG_METRICS_PORT) serves the store's gauges and the counters the
    hook increments; a second start in the same process serves nothing more."""
    from volc_quota_guard.proxy import runtime

    monkeypatch.setattr(runtime, "PROCESS", runtime.Process())
    port = free_port()
    monkeypatch.setenv("VQG_METRICS_PORT", str(port))
    cfg = load_settings()
    server = runtime.serve_metrics(cfg)
    assert server is not None
    try:
        assert runtime.serve_metrics(cfg) is None
        clamp = Decision("ok", "admitted", 500, 0, 1, 1, 1, 1, 500, 1, False)
        metrics.reserved(BUSY, clamp, 800)  # clamped to 500 and left the pool under evict_below
        metrics.reserved(BUSY, Decision("refused", "collection_wall", 0, 9, 1, 1, 1, 1, 0, 0, False), 80)
        metrics.blocked([BUSY, BUSY])
        found = samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)
        assert at(found, "vqg_inflight_tokens", pool=BUSY) == 7_000
        assert at(found, "vqg_clamps_total", pool=BUSY) == 1
        assert at(found, "vqg_evictions_total", pool=BUSY) == 1
        assert at(found, "vqg_blocks_total", pool=BUSY, reason="collection_wall") == 1
        assert at(found, "vqg_blocks_total", pool=BUSY, reason="evicted") == 2
    finally:
        server.shutdown()
        server.server_close()


def test_unreachable_store_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """With the store down a scrape still answers, with `vqg_store_up 0` and no pool rows; the
    CLI exits 1."""
    monkeypatch.setenv("VQG_REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    assert cli.main(["metrics"]) == 1
    found = samples(capsys.readouterr().out)
    assert at(found, "vqg_store_up") == 0
    assert not [k for k in found if k[0] == "vqg_headroom_tokens"]
