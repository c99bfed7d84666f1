"""Connections to the shared store: a Redis URL, or the embedded store (fakeredis with Lua).

The embedded store is one in-memory server per process. `serve_embedded` exposes it over TCP
so a LiteLLM proxy subprocess (the demo, tests) can share it with the parent.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import fakeredis
import redis
import redis.asyncio as aioredis

_EMBEDDED = fakeredis.FakeServer()


def connect(url: str | None) -> redis.Redis:
    """A sync client: Redis at `url` (ACL/TLS URLs work), or the embedded store when None."""
    if url:
        return redis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    return fakeredis.FakeRedis(server=_EMBEDDED)


def connect_async(url: str | None) -> aioredis.Redis:
    """An asyncio client, same rules as `connect`."""
    if url:
        return aioredis.Redis.from_url(url, socket_timeout=5, socket_connect_timeout=5)
    return fakeredis.FakeAsyncRedis(server=_EMBEDDED)


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
