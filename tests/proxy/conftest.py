"""Fixtures for the proxy tests: a fake Volcengine and a key prefix per module."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from proxy_support import ACCOUNTS

from volc_quota_guard.fake import ChatDefaults, FakeVolcengine


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeVolcengine]:
    """The fake Volcengine (Ark chat endpoint) for this module's proxy."""
    with FakeVolcengine(ACCOUNTS, chat_defaults=ChatDefaults(completion_tokens=64)) as f:
        yield f


@pytest.fixture(scope="module")
def prefix(store_url: str) -> Iterator[str]:
    """A key prefix for this module's proxy, deleted afterwards."""
    name = f"vqgtest-proxy-{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(store_url)
    for key in client.scan_iter(f"{name}:*", count=1000):
        client.delete(key)
