"""Prometheus metrics: every pool's state read from the shared store at scrape time, plus this
process's counters of the things it did (blocks, clamps, evictions, sync errors).

The gauges come from Redis through `pool_status` (what `volc-quota-guard status` shows), so every
proxy instance and the CLI report the same truth. Counters Redis already keeps (overruns,
expired reservations) are read from there too; the others count what *this* process did, so a
dashboard sums them over instances. Names and alert rules: docs/metrics.md.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .config import Settings
from .errors import QuotaGuardError, redact
from .gate import Decision, Gate, KeySpace
from .gate.store import connect
from .status import pool_status

if TYPE_CHECKING:
    import redis

log = logging.getLogger("volc_quota_guard.metrics")

POOL_LABELS = ("pool", "account", "model")

# -- this process's counters (one call each from the hook and the sync) ------------------------
COUNTERS = CollectorRegistry(auto_describe=True)
BLOCKS = Counter("vqg_blocks", "Requests or routing attempts refused by this process "
                 "(one per PRE-BLOCK log line)", ["pool", "reason"], registry=COUNTERS)
CLAMPS = Counter("vqg_clamps", "Requests whose output cap this process lowered to fit the headroom",
                 ["pool"], registry=COUNTERS)
EVICTIONS = Counter("vqg_evictions", "Reservations by this process that left the pool under "
                    "VQG_EVICT_BELOW headroom, taking it out of routing", ["pool"], registry=COUNTERS)
SYNC_ERRORS = Counter("vqg_sync_errors", "Billing syncs this process ran that failed",
                      ["account", "kind"], registry=COUNTERS)
EXACT_COUNTS = Counter("vqg_exact_counts", "Prompts of ark-api (Doubao) deployments this process "
                       "sent to Ark's tokenization API because the cheap count did not fit: "
                       "outcome=exact (reserved at the exact count) or fallback (the API failed: "
                       "reserved at the cheap count x k)", ["pool", "outcome"], registry=COUNTERS)

STREAM_CUTS = Counter("vqg_stream_cuts", "Guarded streams this process cut at VQG_MAX_CALL_SECONDS "
                      "(one per DEADLINE log line; each counted whole)", ["pool"], registry=COUNTERS)


def reserved(pool: str, d: Decision, output_cap: int) -> None:
    """Count what a reserve decided: a block, a clamp (less output granted than asked), an eviction."""
    if not d.admitted:
        BLOCKS.labels(pool, d.reason).inc()
    elif d.reason == "admitted":
        if d.amount - d.input_reserved < output_cap:
            CLAMPS.labels(pool).inc()
        if d.evicted_until > 0:
            EVICTIONS.labels(pool).inc()


def blocked(pools: Iterable[str], reason: str = "evicted") -> None:
    """Count a refusal of each pool made before any reserve (the pool was already evicted)."""
    for pool in pools:
        BLOCKS.labels(pool, reason).inc()


def exact_count(pool: str, outcome: str) -> None:
    """Count one ask of Ark's tokenization API: 'exact' or 'fallback'."""
    EXACT_COUNTS.labels(pool, outcome).inc()


def stream_cut(pool: str) -> None:
    STREAM_CUTS.labels(pool).inc()


def sync_failed(account: str, exc: BaseException) -> None:
    SYNC_ERRORS.labels(account, type(exc).__name__).inc()


# -- the shared state, read at scrape time -----------------------------------------------------
# (metric, help, pool_status field, factor); a field that is None is left out for that pool.
_GAUGES: tuple[tuple[str, str, str, float], ...] = (
    ("vqg_usage_today_tokens", "Tokens consumed today (Beijing day), settled requests", "usage_today", 1),
    ("vqg_usage_yesterday_tokens", "Tokens consumed on the previous Beijing day", "usage_yesterday", 1),
    ("vqg_lifetime_usage_tokens", "Tokens consumed since the pool was first seen", "lifetime_usage", 1),
    ("vqg_inflight_tokens", "Tokens reserved by requests still running", "inflight", 1),
    ("vqg_headroom_tokens", "Tokens a new request may still reserve under the nearer wall "
     "(negative: past a wall)", "headroom", 1),
    ("vqg_balance_at_sync_tokens", "Free balance the billing API reported at the last sync",
     "balance_at_sync", 1),
    ("vqg_usage_at_sync_tokens", "Lifetime usage the balance at sync already reflected (estimate)",
     "usage_at_sync", 1),
    ("vqg_b0_estimate_tokens", "Free balance at the start of today, as estimated", "b0_estimate", 1),
    ("vqg_expiring_tokens", "Free tokens kept off the balance wall: they expire before the next sync, "
     "or may have been used unseen before the pool's history began",
     "expiring", 1),
    ("vqg_small_buffer_tokens", "Tokens kept back below the free balance (VQG_SMALL_BUFFER)",
     "small_buffer", 1),
    ("vqg_lag_observed_seconds", "Settlement lag the last sync observed (absent: none observed "
     "in 7 days)", "lag_observed_minutes", 60),
    ("vqg_lag_worst_seconds", "Worst settlement lag observed in the last 7 days", "lag_worst_minutes", 60),
    ("vqg_lag_assumed_seconds", "Settlement lag the limit assumes", "lag_assumed_minutes", 60),
    ("vqg_packages", "Free resource packages assigned to the pool at the last sync", "packages", 1),
    ("vqg_estimate_correction", "Factor the gate applies to the tokenizer's prompt count",
     "estimate_correction", 1),
    ("vqg_exact_correction", "Factor the gate applies to an exact prompt count (DeepSeek, Ark's "
     "tokenization API)", "exact_correction", 1),
)


def _labels(pool: str) -> list[str]:
    account, _, model = pool.partition("/")
    return [pool, account, model]


class PoolCollector(Collector):
    """Reads every guarded pool's status from the store each time it is collected."""

    def __init__(self, cfg: Settings, client: redis.Redis | None = None) -> None:
        self.cfg = cfg
        self.keyspace = KeySpace(cfg.key_prefix)
        self._client = client
        self._gate: Gate | None = None

    def _rows(self) -> list[dict[str, Any]]:
        if self._gate is None:
            client = self._client
            if client is None:
                client = connect(self.cfg.redis_url, self.cfg.redis_cluster)
            self._gate = Gate(client, self.keyspace)
        gate = self._gate
        return [pool_status(gate, pool, self.cfg) for pool in gate.pools()]

    def collect(self) -> Iterator[Metric]:
        try:
            rows = self._rows()
            up = 1
        except (QuotaGuardError, OSError) as exc:
            log.warning("📈 [Metrics] quota store unreachable, pool metrics left out: %s",
                        redact(str(exc)))
            rows, up = [], 0
        yield GaugeMetricFamily("vqg_store_up", "1 when the quota store answered this scrape", value=up)
        yield from pool_metrics(rows)


def pool_metrics(rows: list[dict[str, Any]]) -> Iterator[Metric]:
    """Metric families for `pool_status` rows."""
    snapshot = GaugeMetricFamily("vqg_snapshot", "1 when the pool has a snapshot (without one it "
                                 "refuses every request)", labels=POOL_LABELS)
    for r in rows:
        snapshot.add_metric(_labels(r["pool"]), 1 if r["has_snapshot"] else 0)
    yield snapshot
    synced = [r for r in rows if r["has_snapshot"]]
    for name, help_text, field, factor in _GAUGES:
        family = GaugeMetricFamily(name, help_text, labels=POOL_LABELS)
        for r in synced:
            if r[field] is not None:
                family.add_metric(_labels(r["pool"]), r[field] * factor)
        yield family
    limit = GaugeMetricFamily("vqg_wall_limit_tokens", "Each wall's limit: lifetime usage (balance) or "
                              "today's usage (collection) may reach it", labels=[*POOL_LABELS, "wall"])
    used = GaugeMetricFamily("vqg_wall_used_tokens", "Usage measured against each wall, in-flight "
                             "reservations included", labels=[*POOL_LABELS, "wall"])
    for r in synced:
        for wall in ("balance", "collection"):
            limit.add_metric([*_labels(r["pool"]), wall], r[f"{wall}_wall"])
            used.add_metric([*_labels(r["pool"]), wall], r[f"{wall}_used"])
    yield limit
    yield used
    flags = {
        "vqg_sync_age_seconds": ("Seconds since the pool's snapshot was taken",
                                 lambda r: (r["now_ms"] - r["synced_at_ms"]) / 1000),
        "vqg_snapshot_stale": ("1 when the snapshot is past VQG_SNAPSHOT_MAX_AGE_MINUTES (no headroom)",
                               lambda r: int(r["stale"])),
        "vqg_evicted": ("1 while the pool is out of routing (soft-evicted)", lambda r: int(r["evicted"])),
        "vqg_sync_error": ("1 when the account's last billing sync failed",
                           lambda r: int(bool(r["last_sync_error"]))),
        "vqg_billing": ("1 when a sync found the free quota spent: usage since then is billed",
                        lambda r: int(bool(r.get("billing_since_ms")))),
        "vqg_held": ("1 while the pool is held: its history is shorter than the settlement lag "
                     "(a first start or lost state)", lambda r: int(bool(r.get("held")))),
        "vqg_held_until_seconds": ("When the pool's hold ends (Unix seconds; 0 = not held)",
                                   lambda r: (r.get("held_until_ms") or 0) / 1000),
        "vqg_state_lost": ("1 when the pool's current state was recreated after its data was lost",
                           lambda r: int(bool(r.get("state_lost")))),
        "vqg_unseen_balance_tokens": ("What may have run unseen before the pool's history began, kept "
                                      "off the balance wall until the API shows it settled",
                                      lambda r: r.get("unseen_balance", 0)),
        "vqg_unseen_today_tokens": ("Today's usage the guard assumes it did not see (taken off the "
                                    "daily cap until Beijing midnight)", lambda r: r.get("unseen_today", 0)),
    }
    for name, (help_text, value) in flags.items():
        family = GaugeMetricFamily(name, help_text, labels=POOL_LABELS)
        for r in synced:
            family.add_metric(_labels(r["pool"]), value(r))
        yield family
    overruns = CounterMetricFamily("vqg_overruns", "Settles whose real usage took the pool past a "
                                   "wall (possible billing), all instances", labels=POOL_LABELS)
    expired = CounterMetricFamily("vqg_expired_reservations", "Reservations that were never settled "
                                  "and counted as consumed at their deadline, all instances",
                                  labels=POOL_LABELS)
    for r in synced:
        overruns.add_metric(_labels(r["pool"]), r["overruns"])
        expired.add_metric(_labels(r["pool"]), r["expired_reservations"])
    yield overruns
    yield expired


class _ProcessCounters(Collector):
    def collect(self) -> Iterator[Metric]:
        yield from COUNTERS.collect()


def registry(cfg: Settings, process_counters: bool = True,
             client: redis.Redis | None = None) -> CollectorRegistry:
    """A registry with the pools' metrics, and this process's counters unless told otherwise."""
    reg = CollectorRegistry(auto_describe=False)
    reg.register(PoolCollector(cfg, client))
    if process_counters:
        reg.register(_ProcessCounters())
    return reg


def exposition(cfg: Settings, process_counters: bool = False) -> str:
    """The metrics once, in the Prometheus text format."""
    return generate_latest(registry(cfg, process_counters)).decode()
