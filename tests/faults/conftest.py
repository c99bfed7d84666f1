"""Fixtures for the fault and cluster tests: private redis-servers (never the shared one), a
fake Volcengine, and the proxy helpers of tests/proxy."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "proxy"))  # proxy_support, shared

from proxy_support import ACCOUNTS  # noqa: E402
from redis_servers import RedisCluster, RedisServer, redis_cluster, redis_server  # noqa: E402

from volc_quota_guard.fake import ChatDefaults, FakeVolcengine  # noqa: E402


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisCluster]:
    """A 3-master Redis Cluster of this module's own, stopped afterwards."""
    with redis_cluster() as c:
        yield c


@pytest.fixture(scope="module")
def durable_redis() -> Iterator[RedisServer]:
    """A private redis-server with an fsync-per-write AOF: a kill and restart keeps its data."""
    with redis_server(persist=True) as server:
        yield server


@pytest.fixture
def scratch_redis() -> Iterator[RedisServer]:
    """A private redis-server without persistence: a restart comes back empty."""
    with redis_server() as server:
        yield server


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVolcengine]:
    """The fake Volcengine (Ark chat endpoint) for this module's proxies."""
    with FakeVolcengine(ACCOUNTS, chat_defaults=ChatDefaults(completion_tokens=64)) as f:
        yield f
