"""Private `redis-server` processes for tests that break or reshape the store: one server on a
free loopback port (killed, restarted with or without its data), or a 3-master Redis Cluster.

They run from the OS package's `redis-server` / `redis-cli` in a temp dir, whatever
VQG_TEST_REDIS_URL says, and are always stopped (the fixtures use them as context managers).
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

REDIS_SERVER = shutil.which("redis-server") or "redis-server"
REDIS_CLI = shutil.which("redis-cli") or "redis-cli"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def cluster_port() -> int:
    """A free port whose cluster bus port (port + 10000) is free and valid too."""
    while True:
        port = free_port()
        if port + 10_000 <= 65_535 and _port_is_free(port + 10_000):
            return port


def _wait_until(check: object, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():  # type: ignore[operator]
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)


@dataclass
class RedisServer:
    """One redis-server on 127.0.0.1:`port`, its data in `dir`; `persist` = AOF fsynced per write."""

    dir: Path
    port: int = field(default_factory=free_port)
    persist: bool = False
    extra: tuple[str, ...] = ()
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def start(self) -> RedisServer:
        persistence = (["--appendonly", "yes", "--appendfsync", "always"] if self.persist
                       else ["--appendonly", "no"])
        self.dir.mkdir(parents=True, exist_ok=True)
        log = (self.dir / "redis.log").open("ab")
        self.process = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", *persistence, "--protected-mode", "no", *self.extra],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()

        def up() -> bool:
            if self.process is not None and self.process.poll() is not None:
                tail = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server on port {self.port} exited:\n{tail}")
            return bool(self.client().ping())

        _wait_until(up, f"redis-server on port {self.port}")
        return self

    def kill(self) -> None:
        """SIGKILL: no shutdown save, connections drop mid-flight (a crash, not a stop)."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(timeout=10)
        self.process = None

    def restart(self, *, empty: bool = False) -> RedisServer:
        """Kill and start again on the same port; `empty` throws the data away first."""
        self.kill()
        if empty:
            for item in self.dir.iterdir():
                if item.name != "redis.log":
                    shutil.rmtree(item) if item.is_dir() else item.unlink()
        return self.start()


@contextmanager
def redis_server(persist: bool = False) -> Iterator[RedisServer]:
    """A private redis-server in a temp dir; killed and removed on exit."""
    with tempfile.TemporaryDirectory(prefix="vqg-redis-") as tmp:
        server = RedisServer(Path(tmp), persist=persist)
        try:
            yield server.start()
        finally:
            server.kill()


@dataclass
class RedisCluster:
    """A 3-master, 0-replica Redis Cluster on loopback ports."""

    nodes: list[RedisServer]

    @property
    def ports(self) -> list[int]:
        return [n.port for n in self.nodes]

    @property
    def url(self) -> str:
        return self.nodes[0].url  # any node: the cluster client discovers the others

    def client(self) -> redis.RedisCluster:
        return redis.RedisCluster(host="127.0.0.1", port=self.nodes[0].port)

    def node_of(self, key: str) -> int:
        """The port of the master that serves `key`."""
        return int(self.client().get_node_from_key(key).port)

    def flush_scripts(self) -> None:
        """SCRIPT FLUSH on every master (what a failover or a restart does to the script cache)."""
        for n in self.nodes:
            n.client().script_flush()


@contextmanager
def redis_cluster(ports: list[int] | None = None) -> Iterator[RedisCluster]:
    """Three cluster-enabled redis-servers joined by `redis-cli --cluster create`; all stopped on exit."""
    ports = ports or [cluster_port() for _ in range(3)]
    with tempfile.TemporaryDirectory(prefix="vqg-cluster-") as tmp:
        nodes = [RedisServer(Path(tmp) / f"n{i}", port=ports[i], extra=(
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-node-timeout", "5000")) for i in range(3)]
        try:
            for n in nodes:
                n.start()
            subprocess.run([REDIS_CLI, "--cluster", "create",
                            *(f"127.0.0.1:{n.port}" for n in nodes),
                            "--cluster-replicas", "0", "--cluster-yes"],
                           check=True, capture_output=True, timeout=60)
            for n in nodes:
                _wait_until(lambda n=n: b"cluster_state:ok" in n.client().execute_command(
                    "CLUSTER", "INFO"), f"cluster_state:ok on port {n.port}", timeout=30)
            yield RedisCluster(nodes)
        finally:
            for n in nodes:
                n.kill()

