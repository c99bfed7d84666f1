"""One local HTTP server that plays Volcengine: billing OpenAPI, the Ark data plane (chat,
Responses, embeddings), admin endpoints.

    with FakeVolcengine({"acct-a": ("AK-a", "SK-a")}, clock=ManualClock(t0)) as fake:
        fake.add_package("acct-a/doubao-seed-2-1-pro-260628", 2_000_000)
        VQG_BILLING_ENDPOINT = fake.url          # billing SDK endpoint
        api_base = fake.ark_base_url             # LiteLLM volcengine api_base (…/api/v3)

Plain stdlib ``ThreadingHTTPServer`` on a daemon thread: a thread per connection, so a
delayed chat request does not hold up the billing API.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from .admin_api import handle_admin
from .ark_api import StreamReply, handle_chat, handle_embeddings
from .billing_api import Reply, handle_billing, json_reply
from .clock import ScaledClock
from .ledger import Ledger
from .responses_api import RESPONSES_PATH, handle_responses
from .state import AccountSpec, ChatDefaults, FakeClock, FakeState, UpstreamRequest
from .tokenize_api import TOKENIZE_PATHS, handle_tokenize

log = logging.getLogger(__name__)

CHAT_PATHS = ("/api/v3/chat/completions", "/v1/chat/completions", "/chat/completions")
EMBEDDING_PATHS = ("/api/v3/embeddings", "/v1/embeddings")
DEFAULT_ACCOUNTS: dict[str, AccountSpec] = {
    "default": ("AKLTfakeDefaultAccessKey0001", "fakeDefaultSecretKey0001", "ark-default"),
}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: the SDK's connection pool reuses sockets
    timeout = 30  # an idle keep-alive connection frees its thread
    disable_nagle_algorithm = True  # headers and body go in two writes: no 40 ms ACK stalls
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (stdlib signature)
        log.debug("fake volcengine: " + format, *args)

    def do_GET(self) -> None:  # noqa: N802 (stdlib naming)
        self._dispatch()

    def do_POST(self) -> None:  # noqa: N802
        self._dispatch()

    def do_DELETE(self) -> None:  # noqa: N802
        self._dispatch()

    def _header(self, name: str) -> str | None:
        return self.headers.get(name)

    def _dispatch(self) -> None:
        state = self.server.state
        parts = urlsplit(self.path)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if parts.path in CHAT_PATHS or parts.path in EMBEDDING_PATHS \
                or parts.path.startswith(RESPONSES_PATH):
            state.record_upstream(UpstreamRequest(self.command, parts.path, _parsed(body)))
        try:
            if parts.path.startswith("/_fake/"):
                reply: Reply | StreamReply = handle_admin(
                    state, self.command, parts.path, parts.query, body)
            elif parts.path in CHAT_PATHS and self.command == "POST":
                reply = handle_chat(state, self._header, body)
            elif parts.path in EMBEDDING_PATHS and self.command == "POST":
                reply = handle_embeddings(state, self._header, body)
            elif parts.path == RESPONSES_PATH or parts.path.startswith(RESPONSES_PATH + "/"):
                reply = handle_responses(state, self.command, parts.path, self._header, body)
            elif parts.path in TOKENIZE_PATHS and self.command == "POST":
                reply = handle_tokenize(state, self._header, body)
            elif parts.path in ("", "/") and parts.query:
                reply = handle_billing(state, self.command, parts.path or "/", parts.query,
                                       self._header, body)
            else:
                reply = json_reply(404, {"error": f"no route {self.command} {parts.path}"})
        except Exception:  # a fake bug must show in the test, not hang the client
            log.exception("fake volcengine: handler failed")
            reply = json_reply(500, {"error": "fake server bug; see the log"})
        if isinstance(reply, StreamReply):
            self._stream(reply)
        else:
            self._send(reply)

    def _send(self, reply: Reply) -> None:
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(reply.body)))
        self.end_headers()
        try:
            self.wfile.write(reply.body)
        except OSError:  # the client gave up (a timeout test): the request was still charged
            self.close_connection = True

    def _stream(self, reply: StreamReply) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        alive = True
        for frame in reply.frames:  # run to the end even if the client left: it charges
            if not alive:
                continue
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(frame), frame))
                self.wfile.flush()
            except OSError:
                alive = False
        self.close_connection = reply.cut or not alive
        if alive and not reply.cut:
            self.wfile.write(b"0\r\n\r\n")
        elif alive:
            self.connection.shutdown(socket.SHUT_RDWR)  # the stream breaks mid-body


def _parsed(body: bytes) -> Any:
    try:
        return json.loads(body) if body else None
    except ValueError:
        return body.decode(errors="replace")


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # bursts of concurrent requests in the tests and the demo

    def __init__(self, address: tuple[str, int], state: FakeState) -> None:
        super().__init__(address, _Handler)
        self.state = state


class FakeVolcengine(FakeState):
    """The fake Volcengine: a FakeState (ledger, faults, counters) with an HTTP face."""

    def __init__(
        self,
        accounts: Mapping[str, AccountSpec] | None = None,
        *,
        ledger: Ledger | None = None,
        clock: FakeClock | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        noise: bool = True,
        chat_defaults: ChatDefaults | None = None,
    ) -> None:
        super().__init__(
            DEFAULT_ACCOUNTS if accounts is None else accounts,
            ledger or Ledger(),
            clock or ScaledClock(),
            noise=noise,
            chat_defaults=chat_defaults,
        )
        self._address = (host, port)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> FakeVolcengine:
        if self._server is not None:
            return self
        self._server = _Server(self._address, self)
        self._thread = threading.Thread(target=self._server.serve_forever, args=(0.05,),
                                        name="fake-volcengine", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None

    def serve_forever(self) -> None:
        """Run in the foreground (the CLI); Ctrl-C stops it."""
        self._server = _Server(self._address, self)
        try:
            self._server.serve_forever()
        finally:
            self._server.server_close()
            self._server = None

    def __enter__(self) -> FakeVolcengine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the fake is not running")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """Base URL; also the billing endpoint (``VQG_BILLING_ENDPOINT``)."""
        host = self._address[0]
        host = "127.0.0.1" if host in ("", "0.0.0.0") else host
        return f"http://{host}:{self.port}"

    @property
    def ark_base_url(self) -> str:
        """The ``api_base`` for LiteLLM's ``volcengine/`` provider."""
        return f"{self.url}/api/v3"
