"""Private `redis-server` processes for tests that need what the shared server lacks: an ACL
user with a password, TLS. Each binds a free loopback port and is stopped by the caller."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import redis

ACL_USER = "vqg-guard"
# The least the guard needs (docs/operating.md), on keys of the test prefixes (vqgtest-…).
ACL_RULES = ("~vqg*", "+@read", "+@write", "+@scripting", "+time", "+ping", "+select")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def make_tls_files(folder: Path) -> dict[str, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1, made with the openssl CLI."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise FileNotFoundError("openssl")
    ca, ca_key = folder / "ca.pem", folder / "ca.key"
    cert, key, csr = folder / "server.pem", folder / "server.key", folder / "server.csr"
    ext = folder / "ext.cnf"
    ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    for cmd in (
        [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca,
         "-days", "1", "-subj", "/CN=vqg-test-ca"],
        [openssl, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr,
         "-subj", "/CN=127.0.0.1"],
        [openssl, "x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial",
         "-out", cert, "-days", "1", "-extfile", ext],
    ):
        subprocess.run([str(c) for c in cmd], check=True, capture_output=True)
    return {"ca": ca, "cert": cert, "key": key}


@dataclass
class RedisServer:
    """A running private redis-server; `url` carries the ACL user and password."""

    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)


def start_redis(folder: Path, password: str, tls: dict[str, Path] | None = None) -> RedisServer:
    """redis-server with the default user off and `ACL_USER` / `password` limited to `ACL_RULES`;
    TLS-only when `tls`."""
    exe = shutil.which("redis-server")
    if exe is None:
        raise FileNotFoundError("redis-server")
    port = free_port()
    args = [exe, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(folder),
            "--user", "default", "off", "--user", ACL_USER, "on", f">{password}", *ACL_RULES]
    auth = f"{quote(ACL_USER)}:{quote(password, safe='')}@127.0.0.1:{port}/0"
    if tls is None:
        args += ["--port", str(port)]
        url = f"redis://{auth}"
    else:
        args += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(tls["cert"]),
                 "--tls-key-file", str(tls["key"]), "--tls-ca-cert-file", str(tls["ca"]),
                 "--tls-auth-clients", "no"]
        url = f"rediss://{auth}?ssl_ca_certs={tls['ca']}"
    log = folder / f"redis-{port}.log"
    with log.open("wb") as out:
        process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
    server = RedisServer(url, process, log)
    deadline = time.monotonic() + 10
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"redis-server exited ({process.returncode}): {log.read_text()[-2000:]}")
        try:
            redis.Redis.from_url(url, socket_timeout=1).ping()
            return server
        except redis.RedisError:
            if time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"redis-server did not answer: {log.read_text()[-2000:]}") from None
            time.sleep(0.05)


# Known fake secrets: tests set them and then check that no output contains them.
REDIS_PASSWORD = "vqgRedisPw-5e1b9c7d"
