"""The guard when its quota store (Redis) is unreachable: fail closed by default, open on request."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from proxy_support import MASTER_KEY, Proxy, call_id, free_port, start_proxy, stop_proxy

from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy


def _start(home: Path, fake: FakeVolcengine, mode: str) -> Proxy:
    dead_store = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    return start_proxy(home, fake, dead_store, "vqgtest-down", env={"VQG_FAIL_MODE": mode})


@pytest.fixture(scope="module")
def proxies(tmp_path_factory: pytest.TempPathFactory,
            fake: FakeVolcengine) -> Iterator[dict[str, Proxy]]:
    """Two proxies whose store is unreachable: fail-closed (the default) and fail-open."""
    # The directories first, in this thread: pytest creates its base temp dir on first use, and
    # two threads doing that at once race (FileExistsError in CI).
    homes = {m: tmp_path_factory.mktemp(f"store-down-{m}") for m in ("closed", "open")}
    with ThreadPoolExecutor(2) as pool:  # start both at once: startup is the slow part
        started = dict(zip(homes, pool.map(lambda m: _start(homes[m], fake, m), homes), strict=True))
    yield started
    for p in started.values():
        stop_proxy(p)


@pytest.fixture
def closed_proxy(proxies: dict[str, Proxy]) -> Proxy:
    return proxies["closed"]


def ask(proxy: Proxy, model: str, **params: object) -> httpx.Response:
    return httpx.post(f"{proxy.url}/v1/chat/completions", timeout=60,
                      headers={"authorization": f"Bearer {MASTER_KEY}",
                               "x-litellm-call-id": call_id()},
                      json={"model": model, "max_tokens": 10,
                            "messages": [{"role": "user", "content": "hi"}], **params})


@pytest.mark.parametrize("stream", [False, True])
def test_store_down_fails_closed_with_a_clear_503(closed_proxy: Proxy, stream: bool) -> None:
    """No store, no admission: guarded models answer 503 naming the cause; nothing goes upstream."""
    closed_proxy.fake.clear_chat_requests()
    for model in ("deepseek-v4-flash", "solo", "deepseek-v4-flash@acct-a"):
        r = ask(closed_proxy, model, stream=stream)
        assert r.status_code == 503, r.text
        assert "quota store unreachable" in r.json()["error"]["message"]
        assert int(r.headers["retry-after"]) > 0
    assert closed_proxy.fake.chat_requests() == []
    assert "[STORE-DOWN]" in closed_proxy.log()


def test_store_down_leaves_unguarded_models_and_the_proxy_alive(closed_proxy: Proxy) -> None:
    """Other providers and opted-out deployments need no store; the proxy keeps serving."""
    closed_proxy.fake.clear_chat_requests()
    assert ask(closed_proxy, "other-provider").status_code == 200
    assert ask(closed_proxy, "optout").status_code == 200
    assert len(closed_proxy.fake.chat_requests()) == 2
    assert httpx.get(f"{closed_proxy.url}/health/liveliness", timeout=5).status_code == 200
    assert closed_proxy.process.poll() is None


def test_fail_open_passes_guarded_requests_and_says_so_loudly(proxies: dict[str, Proxy]) -> None:
    """With VQG_FAIL_MODE=open a dead store lets guarded requests through, logged as FAIL-OPEN."""
    p = proxies["open"]
    p.fake.clear_chat_requests()
    assert ask(p, "solo").status_code == 200
    assert ask(p, "deepseek-v4-flash", stream=True).status_code == 200
    assert len(p.fake.chat_requests()) == 2
    assert "⚠️ [FAIL-OPEN] quota store unreachable" in p.log()
