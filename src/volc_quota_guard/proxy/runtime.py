"""The proxy process: the one place that builds the callback and starts the background work.

LiteLLM loads `volc_quota_guard.proxy_handler_instance` (`litellm_settings.callbacks`); the
package hands that name on to `proxy_handler()` here, which builds it once: settings are
validated then (a bad env var stops the proxy's startup). Inside a LiteLLM proxy process,
and again in each forked worker (the callback asks on every new event loop), this module
starts, once per process:

- `/metrics` on VQG_METRICS_HOST:VQG_METRICS_PORT (`metrics.registry`);
- the billing sync thread (`sync.SyncService`), reading the router's guarded pools each tick;
- the consume task on that thread's tick when VQG_CONSUME_ENABLED (`consume.ConsumeTask`).

Everything below this module is constructed, never self-starting. What this process started is
held in one lock-guarded object, `PROCESS`; tests reset it with `PROCESS.reset()`.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from functools import cache
from wsgiref.simple_server import WSGIServer

from prometheus_client import start_http_server

from .. import counting, metrics
from ..config import Settings, settings
from ..consume import TAG, ConsumeTask
from ..errors import ConfigError, QuotaGuardError, StoreUnavailable
from ..gate import Gate, KeySpace
from ..gate.store import connect
from ..sync import SyncService
from ..volcengine.ark import ArkTarget
from ..volcengine.packages import PoolSpec
from .calls import llm_router
from .deployments import conflicts, guard_for_deployment, pools_from_model_list, targets_from_model_list
from .hook import QuotaGuard

log = logging.getLogger("volc_quota_guard")
sync_log = logging.getLogger("volc_quota_guard.sync")  # the lines the sync thread's start writes
consume_log = logging.getLogger("volc_quota_guard.consume")
metrics_log = logging.getLogger("volc_quota_guard.metrics")


@dataclass
class Process:
    """What this process started (a forked worker starts its own: the pid tells them apart)."""

    lock: threading.Lock = field(default_factory=threading.Lock)  # the event loop and a retry timer
    service: SyncService | None = None
    service_pid: int = 0
    metrics_pid: int = 0
    warned: set[str] = field(default_factory=set)

    def reset(self) -> None:
        """Forget what was started (for tests: the next start starts afresh)."""
        self.service, self.service_pid, self.metrics_pid = None, 0, 0
        self.warned.clear()


PROCESS = Process()


def in_proxy() -> bool:
    """Whether this is a LiteLLM proxy process (importing the callback elsewhere starts nothing)."""
    return "litellm.proxy.proxy_server" in sys.modules


# -- the router, read afresh on every tick (config reloads, models added in the DB) -------------
def router_pools() -> list[PoolSpec]:
    """The guarded pools of the proxy's router; a deployment that names no pool is skipped."""
    router = llm_router()
    if router is None:
        return []
    usable = []
    clashes = conflicts(router.model_list)
    for deployment in router.model_list:
        try:
            pools_from_model_list([deployment])
            guard = guard_for_deployment(deployment)
            name = guard and (guard.model_id or guard.pool)
            if name in clashes:
                raise ConfigError(f"deployment {name!r}: {clashes[name]}")
        except QuotaGuardError as exc:  # e.g. a `volcengine/*` wildcard names no pool
            _warn_once(f"❌ [Sync] deployment skipped, its pool cannot be synced (requests to it are "
                       f"refused): {exc}")
            continue
        usable.append(deployment)
    return pools_from_model_list(usable)


def router_targets() -> dict[str, ArkTarget]:
    """The guarded pools of the proxy's router with a deployment the consume task can call."""
    router = llm_router()
    return {} if router is None else targets_from_model_list(router.model_list)


def _warn_once(message: str) -> None:
    if message not in PROCESS.warned:
        PROCESS.warned.add(message)
        sync_log.error(message)


# -- background work ---------------------------------------------------------------------------
def serve_metrics(cfg: Settings) -> WSGIServer | None:
    """Serve /metrics on VQG_METRICS_HOST:VQG_METRICS_PORT once per process (None: off or taken)."""
    if not cfg.metrics_port or PROCESS.metrics_pid == os.getpid():
        return None
    PROCESS.metrics_pid = pid = os.getpid()
    try:
        server, _ = start_http_server(cfg.metrics_port, cfg.metrics_host, registry=metrics.registry(cfg))
    except OSError as exc:  # another worker of this proxy has the port: its scrape has the gauges
        metrics_log.warning("📈 [Metrics] %s:%s not served by pid %s (%s)", cfg.metrics_host,
                            cfg.metrics_port, pid, exc)
        return None
    metrics_log.info("📈 [Metrics] serving http://%s:%s/metrics (pid %s)", cfg.metrics_host,
                     cfg.metrics_port, pid)
    return server


def start(cfg: Settings) -> SyncService | None:
    """Start this process's /metrics and sync thread once (again in a forked child; a stamp-only
    one when the billing sync is off); the sync service, or None when the store is not
    reachable yet."""
    serve_metrics(cfg)
    with PROCESS.lock:
        if PROCESS.service is not None and PROCESS.service_pid == os.getpid():
            return PROCESS.service
        try:
            client = connect(cfg.redis_url, cfg.redis_cluster)
        except StoreUnavailable as exc:
            # A cluster client needs the cluster to be built; the proxy starts anyway (the
            # gate fails closed meanwhile) and the sync thread starts once the store answers.
            sync_log.error("❌ [Sync] store unreachable, sync thread not started yet (retrying): %s", exc)
            retry = threading.Timer(max(cfg.sync_poll_seconds, 1.0), start, (cfg,))
            retry.daemon = True
            retry.start()
            return None
        return _start_service(cfg, Gate(client, KeySpace(cfg.key_prefix)))


def _start_service(cfg: Settings, gate: Gate) -> SyncService:
    # With the billing sync off the thread only stamps that this process admits (docs/limit.md,
    # "Lost state"): a wipe then holds the pool for Δ_assumed, since it never reports.
    service = SyncService(cfg, gate, router_pools, billing=cfg.sync_enabled)
    PROCESS.service, PROCESS.service_pid = service, os.getpid()
    if cfg.consume_enabled and cfg.sync_enabled:
        consume_log.info("%s scheduled daily at %s Beijing time", TAG, cfg.consume_at)
        # A run takes many calls: it goes to its own thread, the sync thread stays free.
        service.after_tick.append(ConsumeTask(cfg, gate, router_targets, background=True).tick)
    service.start(cfg.sync_poll_seconds)
    atexit.register(service.stop, 2.0)
    sync_log.info("🔄 [Sync] thread started (pid %s, every %ss, interval %s min%s)", PROCESS.service_pid,
                  cfg.sync_poll_seconds, cfg.sync_interval_minutes,
                  "" if cfg.sync_enabled else "; VQG_SYNC_ENABLED=false: it only stamps this process's polls")
    return service


def start_in_proxy(cfg: Settings) -> None:
    """`start`, only inside a LiteLLM proxy process (the callback calls it on each new loop)."""
    if in_proxy():
        start(cfg)


# -- the callback ------------------------------------------------------------------------------
def _ensure_log_handler() -> None:
    # The proxy does not route library loggers to its output by default: give ours a handler.
    if not log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(
            "%(asctime)s %(levelname)s volc_quota_guard[%(process)d]: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        log.propagate = False


def build() -> QuotaGuard:
    """The instance the proxy loads: settings are validated now (a bad env var stops startup)."""
    _ensure_log_handler()
    counting.warm_up()
    config = settings()
    start_in_proxy(config)
    return QuotaGuard(config, on_new_loop=start_in_proxy)


@cache
def proxy_handler() -> QuotaGuard:
    """The callback instance of this process, built on first use."""
    return build()
