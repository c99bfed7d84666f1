"""Shared fixtures: the store backend (real Redis via VQG_TEST_REDIS_URL, else the embedded
store), a per-test key prefix that is cleaned up, and a clean environment."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import redis
from secure_redis import REDIS_PASSWORD, RedisServer, start_redis

from backend import TEST_REDIS_URL
from volc_quota_guard.gate.keys import KeySpace
from volc_quota_guard.gate.store import EmbeddedTcpServer, connect, serve_embedded


def pytest_report_header(config: pytest.Config) -> str:
    where = TEST_REDIS_URL or "embedded store (fakeredis + Lua)"
    return f"volc_quota_guard store backend: {where}"


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No test sees the developer's VQG_* / Volcengine settings."""
    for name in list(os.environ):
        if name.startswith(("VQG_", "VOLC_")) or name in ("REDIS_URL", "SMALL_BUFFER"):
            monkeypatch.delenv(name, raising=False)
    from volc_quota_guard import config

    config.settings.cache_clear()


@pytest.fixture(autouse=True)
def _guard_logs_reach_caplog(monkeypatch: pytest.MonkeyPatch) -> None:
    """Building the callback (proxy/runtime.py) gives our logger its own handler and stops
    propagation (the proxy's root logger would print every line twice); tests read lines
    through caplog, on the root."""
    import logging

    monkeypatch.setattr(logging.getLogger("volc_quota_guard"), "propagate", True)


@pytest.fixture(scope="session")
def store_url() -> Iterator[str]:
    """A Redis URL every process can reach: the real server, or the embedded one over TCP."""
    if TEST_REDIS_URL:
        yield TEST_REDIS_URL
        return
    server: EmbeddedTcpServer = serve_embedded()
    yield server.url
    server.stop()


@pytest.fixture
def keyspace() -> Iterator[KeySpace]:
    """A key prefix of this test's own, deleted afterwards."""
    ks = KeySpace(f"vqgtest-{uuid.uuid4().hex[:10]}")
    yield ks
    client = connect(TEST_REDIS_URL)
    for key in client.scan_iter(f"{ks.prefix}:*", count=1000):
        client.delete(key)


@pytest.fixture
def client() -> redis.Redis:
    """A sync client on the test backend (in-process embedded store when no Redis is given)."""
    return connect(TEST_REDIS_URL)


@pytest.fixture(scope="session")
def acl_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server whose only user is an ACL user with a password (`url` has both)."""
    try:
        server = start_redis(tmp_path_factory.mktemp("acl-redis"), REDIS_PASSWORD)
    except FileNotFoundError:
        pytest.skip("platform limit: no redis-server binary on PATH")
    yield server
    server.stop()
