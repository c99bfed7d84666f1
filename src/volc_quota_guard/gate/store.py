"""Connections to the shared store (a Redis URL, a Redis Cluster, or the embedded store:
fakeredis with Lua), and the one place a Redis error becomes the guard's `StoreUnavailable`.

Every command the guard sends runs under `store_errors()` (the gate's verbs in scripts.py and
the side records in records.py alike), so no caller ever sees a redis-py exception: redis-py's
`ConnectionError` is not Python's, and code above the gate must not have to know that.

With `cluster=True` (``VQG_REDIS_CLUSTER=true``) the URL names any one node of a Redis Cluster
and the client finds the others; every key of a pool shares one hash tag (keys.py), so each
gate call runs on one node. The embedded store is one in-memory server per process.
`serve_embedded` exposes it over TCP so a LiteLLM proxy subprocess (the demo, tests) can share
it with the parent.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import fakeredis
import redis
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import NoBackoff
from redis.exceptions import MovedError, RedisClusterException
from redis.retry import Retry

from ..errors import StoreUnavailable

_EMBEDDED = fakeredis.FakeServer()
T = TypeVar("T")

# Backend errors that mean "the store cannot be reached" (a cluster that lost its slot map too).
_UNREACHABLE = (redis.ConnectionError, redis.TimeoutError, OSError, RedisClusterException)


def _answered(exc: redis.RedisError) -> StoreUnavailable:
    if isinstance(exc, MovedError):  # a plain client on a cluster node: say what to set
        return StoreUnavailable(f"store error: MOVED {exc} (the store is a Redis Cluster: "
                                "set VQG_REDIS_CLUSTER=true)")
    return StoreUnavailable(f"store error: {exc}")


@contextmanager
def store_errors() -> Iterator[None]:
    """Translate any Redis failure inside the block into `StoreUnavailable` (`raise … from exc`).

    One context manager for the sync and the asyncio clients (an `await` inside works alike).
    """
    try:
        yield
    except _UNREACHABLE as exc:
        raise StoreUnavailable(f"store unreachable: {exc}") from exc
    except redis.RedisError as exc:  # a server error (ResponseError, MOVED, OOM, READONLY …)
        raise _answered(exc) from exc


def mapped(fn: Callable[[], T]) -> T:
    """`fn()` under `store_errors()`."""
    with store_errors():
        return fn()


async def amapped(fn: Callable[[], Awaitable[T]]) -> T:
    """`await fn()` under `store_errors()`."""
    with store_errors():
        return await fn()


def twice(script: Any, keys: list[str], args: list[str]) -> Any:
    """The script; once more if the cache was flushed again between redis-py's reload and its
    second call (another client flushing, a failover in two steps)."""
    try:
        return script(keys=keys, args=args)
    except redis.exceptions.NoScriptError:
        return script(keys=keys, args=args)


async def atwice(script: Any, keys: list[str], args: list[str]) -> Any:
    try:
        return await script(keys=keys, args=args)
    except redis.exceptions.NoScriptError:
        return await script(keys=keys, args=args)


_TIMEOUT_S = 5
# One immediate retry on a dropped connection: after a Redis restart every pooled connection is
# dead, and without it each would fail one request (503) or lose one settle. Safe because every
# gate verb is idempotent per request id. Timeouts are not retried (redis-py's Retry would, by
# default: a slow Redis cost two socket timeouts per call, and a reserve ran twice).
_RETRIES = 1
_RETRIED = (redis.ConnectionError,)


def connect(url: str | None, cluster: bool = False, *, single_thread: bool = False) -> redis.Redis:
    """A sync client: Redis at `url` (ACL/TLS URLs work), or the embedded store when None.

    A cluster client learns the slot map when it is built: an unreachable cluster raises
    `StoreUnavailable` here, not on first use. `single_thread` (the simulator) keeps one
    connection instead of a pool: a pool's checkout per command is a fifth of a command's cost.
    """
    if url and cluster:
        try:
            # RedisCluster has the same command methods; the gate treats it as a Redis client.
            return redis.RedisCluster.from_url(  # type: ignore[return-value]
                url, socket_timeout=_TIMEOUT_S, socket_connect_timeout=_TIMEOUT_S)
        except (redis.RedisError, redis.exceptions.RedisClusterException, OSError) as exc:
            raise StoreUnavailable(f"Redis Cluster unreachable at {url}: {exc}") from exc  # redacted
    if url:
        return redis.Redis.from_url(url, socket_timeout=_TIMEOUT_S, socket_connect_timeout=_TIMEOUT_S,
                                    retry=Retry(NoBackoff(), _RETRIES, supported_errors=_RETRIED),
                                    retry_on_error=[redis.ConnectionError],
                                    single_connection_client=single_thread)
    if cluster:
        raise ValueError("VQG_REDIS_CLUSTER needs VQG_REDIS_URL (a node of the cluster)")
    return fakeredis.FakeRedis(server=_EMBEDDED)


def connect_async(url: str | None, cluster: bool = False) -> aioredis.Redis:
    """An asyncio client, same rules as `connect` (a cluster client connects on first use)."""
    if url and cluster:
        return aioredis.RedisCluster.from_url(  # type: ignore[return-value]
            url, socket_timeout=_TIMEOUT_S, socket_connect_timeout=_TIMEOUT_S)
    if url:
        return aioredis.Redis.from_url(url, socket_timeout=_TIMEOUT_S, socket_connect_timeout=_TIMEOUT_S,
                                       retry=AsyncRetry(NoBackoff(), _RETRIES, supported_errors=_RETRIED),
                                       retry_on_error=[redis.ConnectionError])
    if cluster:
        raise ValueError("VQG_REDIS_CLUSTER needs VQG_REDIS_URL (a node of the cluster)")
    return fakeredis.FakeAsyncRedis(server=_EMBEDDED)


def is_cluster(client: object) -> bool:
    """Whether `client` talks to a Redis Cluster (no key-less commands in its pipelines)."""
    return isinstance(client, redis.RedisCluster | aioredis.RedisCluster)


@dataclass
class EmbeddedTcpServer:
    """The embedded store served on 127.0.0.1 for other processes."""

    url: str
    _server: fakeredis.TcpFakeServer
    _thread: threading.Thread

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve_embedded(port: int = 0) -> EmbeddedTcpServer:
    """Start a fresh fakeredis server on a TCP port (0 = any free one) in a daemon thread."""
    server = fakeredis.TcpFakeServer(("127.0.0.1", port), server_type="redis")
    thread = threading.Thread(target=server.serve_forever, name="vqg-embedded-redis", daemon=True)
    thread.start()
    bound = server.server_address[1]
    return EmbeddedTcpServer(url=f"redis://127.0.0.1:{bound}/0", _server=server, _thread=thread)
