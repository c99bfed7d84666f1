"""A call may not run past VQG_MAX_CALL_SECONDS: the sync plans package expiries around it."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator

import httpx
import pytest
from proxy_support import MASTER_KEY, POOL_SOLO, Proxy, call_id, start_proxy, stop_proxy

from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy

CAP_S = 3
SLOWEST = 0.25  # tokens/s: 4,000 output tokens may take Ark 4.4 h
HOUR_MS = 3_600_000


@pytest.fixture(scope="module")
def proxy(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
          prefix: str) -> Iterator[Proxy]:
    p = start_proxy(tmp_path_factory.mktemp("deadline"), fake, store_url, prefix,
                    env={"VQG_MAX_CALL_SECONDS": str(CAP_S),
                         "VQG_SLOWEST_DECODE_TOKENS_PER_SECOND": str(SLOWEST)})
    yield p
    stop_proxy(p)


def read_stream(proxy: Proxy, path: str, cid: str, body: dict[str, object]) -> tuple[bytes, float]:
    """POST a stream and read it to its end; what arrived and how long it took."""
    started = time.monotonic()
    got = b""
    with httpx.stream("POST", f"{proxy.url}{path}", timeout=60, json=body,
                      headers={"authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": cid}) as r:
        assert r.status_code == 200
        try:
            for part in r.iter_bytes():
                got += part
        except httpx.HTTPError:  # the proxy may drop the connection instead of an error event
            return got, time.monotonic() - started
    return got, time.monotonic() - started


def test_a_stream_whose_chunks_keep_coming_is_cut_at_the_cap(proxy: Proxy) -> None:
    """LiteLLM's timeout is a per-read one: a slow stream whose chunks keep coming ran 105 s
    against a 70 s cap, and one that outlived a package expiry billed 35,636 (red-team, stop 37).
    The proxy cuts it at the cap; Ark may run it on, so its reservation counts whole."""
    proxy.seed(POOL_SOLO, 1_000_000)
    proxy.fake.clear_chat_requests()
    cid = call_id()
    before = proxy.state(POOL_SOLO).get("ucum")
    text = "hi [[fake completion=400 pace=0.6]]"  # ~12 chunks, 0.6 s apart: ~7 s of stream
    body, took = read_stream(proxy, "/v1/chat/completions", cid, {
        "model": "solo", "stream": True, "max_tokens": 600,
        "messages": [{"role": "user", "content": text}]})
    assert took < CAP_S + 2.5, took  # cut at the cap, not at the stream's ~7 s end
    assert b"VQG_MAX_CALL_SECONDS" in body, body[-500:]  # an error event names the cap
    cut = proxy.wait_for_log(rf"\[DEADLINE\].*call={cid}")
    assert "VQG_MAX_CALL_SECONDS (3 s)" in cut[-1], cut
    line = proxy.wait_for_log(rf"\[Usage\].*call={cid}")[-1]
    reserved = int(re.search(r"reserved=(\d+)", line).group(1))
    counted = int(re.search(r"counted=(\d+)", line).group(1))
    assert "source=unavailable" in line and counted >= reserved > 600, line
    assert proxy.state(POOL_SOLO).get("ucum") - before == counted
    # Ark ran it on (the fake's reading): its bill lands later, within what was counted.
    deadline = time.monotonic() + 15
    while not (ran := [c for c in proxy.fake.chat_requests() if c.stream]):
        assert time.monotonic() < deadline, "the fake never charged the cut stream"
        time.sleep(0.2)
    assert 0 < ran[0].consumed <= counted


def test_a_fast_stream_under_the_cap_is_untouched(proxy: Proxy) -> None:
    proxy.seed(POOL_SOLO, 1_000_000)
    cid = call_id()
    body, _ = read_stream(proxy, "/v1/chat/completions", cid, {
        "model": "solo", "stream": True, "max_tokens": 600,
        "messages": [{"role": "user", "content": "hi [[fake pace=0.1]]"}]})
    assert b"[DONE]" in body
    line = proxy.wait_for_log(rf"\[Usage\].*call={cid}")[-1]
    assert "source=measured" in line, line
    assert not re.search(rf"\[DEADLINE\].*call={cid}", proxy.log())


def test_a_slow_responses_stream_is_cut_at_the_cap_too(proxy: Proxy) -> None:
    """The same cut on /v1/responses (LiteLLM's Responses stream goes through the same hook)."""
    proxy.seed(POOL_SOLO, 1_000_000)
    cid = call_id()
    body, took = read_stream(proxy, "/v1/responses", cid, {
        "model": "solo", "stream": True, "max_output_tokens": 600,
        "input": "hi [[fake completion=400 pace=0.6]]"})
    assert took < CAP_S + 2.5, took
    assert b"response.completed" not in body
    line = proxy.wait_for_log(rf"\[Usage\].*call={cid}")[-1]
    reserved = int(re.search(r"reserved=(\d+)", line).group(1))
    assert int(re.search(r"counted=(\d+)", line).group(1)) >= reserved > 600, line
    assert proxy.wait_for_log(rf"\[DEADLINE\].*call={cid}")


def test_a_call_ark_could_run_past_an_expiry_is_held_without_that_package(proxy: Proxy) -> None:
    """Ark runs a call on after the proxy gives up on it: sixteen 60,000-token calls it ran
    190 minutes, past the longest call the sync's expiry lookahead covers, billed 676,000
    (red-team, stop 44). A call whose output cap Ark could still be writing at the slowest
    decode rate when a package expires is admitted without that package; a short one with it."""
    now = int(time.time() * 1000)
    proxy.seed(POOL_SOLO, 500_100, ladder=((now + 3 * HOUR_MS, 500_000),))

    def ask(max_tokens: int) -> httpx.Response:
        return httpx.post(f"{proxy.url}/v1/chat/completions", timeout=30, json={
            "model": "solo", "max_tokens": max_tokens, "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": call_id()})

    short = ask(1_000)  # Ark's longest run: the proxy's keep + 4,000 s, before the expiry
    assert short.status_code == 200, short.text
    cid = call_id()
    long = httpx.post(f"{proxy.url}/v1/chat/completions", timeout=30, json={
        "model": "solo", "max_tokens": 4_000, "messages": [{"role": "user", "content": "hi"}]},
        headers={"authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": cid})
    assert long.status_code == 429, long.text  # 16,000 s at 0.25 tokens/s: past it
    assert "max_tokens" in long.text and "expiry_wall" in long.text, long.text
    line = proxy.wait_for_log(rf"\[PRE-BLOCK\].*call={cid}")[-1]
    assert "reason=expiry_wall" in line, line
    # The same call with the package expiring a day on fits.
    proxy.seed(POOL_SOLO, 500_100, ladder=((now + 24 * HOUR_MS, 500_000),))
    assert ask(4_000).status_code == 200
