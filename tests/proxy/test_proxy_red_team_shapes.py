"""Shapes a red-team pass (stop 32) got billed or through a real proxy (usage LiteLLM invents for a Responses
stream, a client key in `headers`, a named `tool_choice`)."""

from __future__ import annotations

import base64
import io
import re
import struct
import zlib
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from PIL import Image
from proxy_support import MASTER_KEY, Proxy, ark_deployment, call_id, start_syncing_proxy, stop_proxy

from volc_quota_guard.fake import FakeVolcengine

pytestmark = pytest.mark.proxy
POOL = ("acct-c/rt1-resp-260101", 60_000)
OTHER = ("acct-c/rt1-other-260101", 60_000)
IMAGES = ("acct-c/rt1-img-260101", 300_000)
PNGS = ("acct-c/rt1-png-260101", 400_000)  # its own pool: the image tests above end near a wall
PARTS = ("acct-c/rt1-parts-260101", 60_000)
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def px(tmp_path_factory: pytest.TempPathFactory, fake: FakeVolcengine, store_url: str,
       prefix: str) -> Iterator[Proxy]:
    p = start_syncing_proxy(tmp_path_factory.mktemp("rt1"), fake, store_url, prefix,
                            dict([POOL, OTHER, IMAGES, PNGS, PARTS]),
                            [ark_deployment("rt1-resp", POOL[0]), ark_deployment("rt1-other", OTHER[0]),
                             ark_deployment("rt1-img", IMAGES[0]), ark_deployment("rt1-png", PNGS[0]),
                             ark_deployment("rt1-parts", PARTS[0])],
                            VQG_SMALL_BUFFER="10000", VQG_EVICT_BELOW="500")
    yield p
    stop_proxy(p)


def post(px: Proxy, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{px.url}{path}", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {MASTER_KEY}", "x-litellm-call-id": call_id()})


def test_a_responses_stream_without_upstream_usage_bills_0(px: Proxy) -> None:
    """LiteLLM fills a missing usage on response.completed with a cl100k estimate of the input
    and the streamed text (40 tokens for a call Ark billed 6,223): it must settle as estimated."""
    codes = []
    for i in range(14):
        r = post(px, "/v1/responses", {"model": "rt1-resp", "stream": True, "max_output_tokens": 7000,
                                       "input": f"turn {i} [[fake completion=200 reasoning=6000 "
                                                f"usage=missing]]"})
        codes.append(r.status_code)
    assert set(codes) <= {200, 429}, codes
    lines = px.wait_for_log(r"\[Usage\] rt1-resp-260101", count=codes.count(200))
    counted = [int(m) for ln in lines for m in re.findall(r"counted=(\d+)", ln)]
    assert min(counted) > 6_000, lines
    assert px.fake.pool_totals(POOL[0]).billed == 0


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "headers": {"Authorization": "Bearer ark-acct-a"}}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "headers": [["Authorization", "Bearer ark-acct-a"]]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "extra_headers": [["authorization", "Bearer ark-acct-a"]]}),
    ("/v1/responses", {"input": "hi", "headers": {"authorization": "Bearer ark-acct-a"}}),
    ("/v1/messages", {"max_tokens": 50, "messages": [{"role": "user", "content": "hi"}],
                      "headers": {"Authorization": "Bearer ark-acct-a"}}),
], ids=["chat", "chat-pairs", "chat-extra-pairs", "responses", "messages"])
def test_a_client_key_in_headers_is_refused(px: Proxy, path: str, body: dict[str, Any]) -> None:
    """`headers` (and a list-of-pairs `extra_headers`) reached Ark: acct-a billed 342 tokens
    while the guard reserved in acct-c."""
    before = len(px.fake.upstream_requests())
    r = post(px, path, {"model": "rt1-other", **body})
    assert r.status_code == 400 and "headers" in r.text, (r.status_code, r.text[:300])
    assert px.fake.upstream_requests()[before:] == []


def test_a_named_tool_choice_is_reserved(px: Proxy) -> None:
    """A tool_choice object is prompt text to Ark (the dearer reading): 8,531 reserved, 41,502
    consumed, 23,004 billed on a 60,000 pool before."""
    for i in range(3):
        r = post(px, "/v1/chat/completions", {
            "model": "rt1-other", "max_tokens": 50, "tools": TOOLS,
            "tool_choice": {"type": "function",
                            "function": {"name": "f", "description": f"{i} " + "\r\n" * 20_000}},
            "messages": [{"role": "user", "content": f"hi {i} [[fake completion=10]]"}]})
        assert r.status_code in (200, 429), r.text[:300]
    assert px.fake.pool_totals(OTHER[0]).billed == 0


@pytest.mark.parametrize("field", [{"api_key": "ark-acct-a"},
                                   {"headers": {"Authorization": "Bearer ark-acct-a"}},
                                   {"extra_headers": {"Authorization": "Bearer ark-acct-a"}}],
                         ids=["api_key", "headers", "extra_headers"])
def test_a_client_fallback_cannot_carry_a_key_to_a_guarded_deployment(px: Proxy,
                                                                      field: dict[str, Any]) -> None:
    """The proxy's pre-call check reads the group the client named; a client-side fallback from an
    unguarded group (here its upstream answers 429) reached the guarded one with the client's key:
    acct-a billed 4,115 while the guard reserved in acct-c."""
    before = len(px.fake.chat_requests())
    post(px, "/v1/chat/completions", {
        "model": "other-provider", "messages": [{"role": "user", "content": "x [[fake status=429]]"}],
        "fallbacks": [{"model": "rt1-other",
                       "messages": [{"role": "user", "content": "hi [[fake completion=50]]"}]}],
        **field})
    served = [r for r in px.fake.chat_requests()[before:] if r.status == 200]
    assert served == [], served
    assert px.fake.pool_totals("acct-a/rt1-other-260101").consumed == 0


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                              "custom_llm_provider": "openai"}, "custom_llm_provider"),
    ("/v1/messages", {"max_tokens": 50, "stream": 1,
                      "messages": [{"role": "user", "content": "hi"}]}, "stream"),
    ("/v1/responses", {"input": "hi", "stream": "true"}, "stream"),
], ids=["provider", "messages-stream-1", "responses-stream-str"])
def test_a_field_litellm_reads_its_own_way_is_refused(px: Proxy, path: str, body: dict[str, Any],
                                                       field: str) -> None:
    """A client-chosen provider, or a non-boolean `stream` (a /v1/messages call made 3 upstream
    calls for one), is a 400 naming the field before anything reaches Ark."""
    before = len(px.fake.upstream_requests())
    r = post(px, path, {"model": "rt1-other", **body})
    assert r.status_code == 400 and field in r.text, (r.status_code, r.text[:300])
    assert px.fake.upstream_requests()[before:] == []


def _nest(images: list[dict[str, Any]], depth: int) -> list[Any]:
    for _ in range(depth):
        images = [{"type": "output_group", "content": images}]
    return images


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_images_in_a_tool_output_are_reserved_as_images(px: Proxy, depth: int) -> None:
    """A Responses `function_call_output` whose output is content parts: Ark reads its images as
    images (the dearer reading; the fake billed their JSON text only, 1,389 for 50 `detail: high`
    images worth up to 256,000), so the guard reserves them at Ark's formula, at any depth (a
    part nested in a part: byte-bounded at ~80 tokens an image before)."""
    images = _nest([{"type": "input_image", "image_url": f"https://img.invalid/{i}.png", "detail": "high"}
                    for i in range(2)], depth)
    pool = px.fake.pool_totals(IMAGES[0])
    before = pool.consumed
    codes = []
    for i in range(4):
        r = post(px, "/v1/responses", {"model": "rt1-img", "max_output_tokens": 50, "input": [
            {"type": "function_call", "call_id": f"c{i}", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": f"c{i}", "output": images},
            {"role": "user", "content": f"hi {i} [[fake completion=10]]"}]})
        codes.append(r.status_code)
    assert set(codes) <= {200, 429} and 200 in codes, codes
    after = px.fake.pool_totals(IMAGES[0])
    assert after.consumed - before >= codes.count(200) * 2 * 1_000  # billed as images on the fake
    assert after.billed == 0
    lines = px.wait_for_log(r"\[Usage\].*pool=acct-c/rt1-img", count=codes.count(200))
    reserved = [int(m) for ln in lines for m in re.findall(r"reserved=(\d+)", ln)]
    assert min(reserved) >= 2 * 1_000 and not any("overrun=yes" in ln for ln in lines), lines


def gif_with_a_frame_past_its_screen(frame: int) -> bytes:
    """A valid GIF whose header says 1x1 and whose one frame is frame x frame."""
    buf = io.BytesIO()
    Image.new("P", (frame, frame)).save(buf, "GIF")
    raw = buf.getvalue()
    at = raw.index(b"\x2c")  # the frame's image descriptor
    head = b"GIF89a" + struct.pack("<HHBBB", 1, 1, 0x80, 0, 0) + b"\x00\x00\x00\xff\xff\xff"
    return head + b"\x2c" + struct.pack("<HHHHB", 0, 0, frame, frame, 0) + raw[at + 10:]


def test_a_gif_frame_larger_than_its_screen_is_reserved_at_the_frame_size(px: Proxy) -> None:
    """The GIF header's screen said 1x1, so ten 2000x2000 frames were reserved (and billed by the
    fake) at 1 token each; Pillow decodes the frame whole: Ark's formula says 5,103 each."""
    data = gif_with_a_frame_past_its_screen(2000)
    assert Image.open(io.BytesIO(data)).size == (2000, 2000)
    ten_images_reserved_and_billed_at_least(px, IMAGES[0], "rt1-img", "gif", data, 5_103)


def ten_images_reserved_and_billed_at_least(px: Proxy, pool: str, model: str, kind: str,
                                            data: bytes, each: int) -> None:
    """Ten copies of the image in one chat call: the fake bills and the guard reserves at least
    `each` tokens per image."""
    url = f"data:image/{kind};base64," + base64.b64encode(data).decode()
    images = [{"type": "image_url", "image_url": {"url": url, "detail": "high"}} for _ in range(10)]
    before = px.fake.pool_totals(pool).consumed
    r = post(px, "/v1/chat/completions", {"model": model, "max_tokens": 20, "messages": [
        {"role": "user", "content": [*images, {"type": "text", "text": "hi [[fake completion=5]]"}]}]})
    assert r.status_code == 200, r.text[:300]
    assert px.fake.pool_totals(pool).consumed - before >= 10 * each
    line = px.wait_for_log(rf"\[Usage\].*call={r.headers.get('x-litellm-call-id', '')}")[-1]
    assert int(re.search(r"reserved=(\d+)", line).group(1)) >= 10 * each, line  # type: ignore[union-attr]


def png_with_a_chunk_before_ihdr(side: int) -> bytes:
    """A PNG Pillow decodes at side x side whose first chunk is an unknown one holding 1 and 1
    where IHDR's width and height belong."""
    buf = io.BytesIO()
    Image.new("RGB", (side, side)).save(buf, "PNG")
    raw, decoy = buf.getvalue(), struct.pack(">II", 1, 1)
    chunk = struct.pack(">I", len(decoy)) + b"vqGa" + decoy + struct.pack(">I", zlib.crc32(b"vqGa" + decoy))
    return raw[:8] + chunk + raw[8:]


def test_a_png_with_a_chunk_before_ihdr_is_reserved_at_the_most(px: Proxy) -> None:
    """The guard read the size where IHDR belongs (1x1: 1 token an image) and the fake refused
    the image, hiding the bill (red-team, stop 37); Pillow finds IHDR past the chunk, so the fake
    bills that size (Ark's formula: 5,120 each, high) and the guard reserves the most."""
    data = png_with_a_chunk_before_ihdr(3000)
    assert Image.open(io.BytesIO(data)).size == (3000, 3000)
    ten_images_reserved_and_billed_at_least(px, PNGS[0], "rt1-png", "png", data, 5_120)


def test_a_stored_response_can_be_read_and_deleted_through_the_proxy(px: Proxy) -> None:
    """GET and DELETE of a stored response bill nothing: they pass, and hold nothing in flight."""
    r = post(px, "/v1/responses", {"model": "rt1-other", "max_output_tokens": 50, "store": True,
                                   "input": "hi [[fake completion=10]]"})
    assert r.status_code == 200, r.text[:300]
    rid = r.json()["id"]
    before = px.fake.pool_totals(OTHER[0]).consumed
    auth = {"Authorization": f"Bearer {MASTER_KEY}"}
    got = httpx.get(f"{px.url}/v1/responses/{rid}", headers=auth, timeout=60)
    assert got.status_code == 200 and got.json().get("object") == "response", got.text[:300]
    gone = httpx.delete(f"{px.url}/v1/responses/{rid}", headers=auth, timeout=60)
    assert gone.status_code == 200, gone.text[:300]
    assert px.fake.pool_totals(OTHER[0]).consumed == before
    assert not px.state(OTHER[0]).get("inflight")


def test_n_choices_reserve_the_prompt_n_times(px: Proxy) -> None:
    """Ark does not document `n`: the dearer reading (n inferences, each reading the prompt) is
    what the fake bills, and the reservation covers it (it held the prompt once: 13,907 where
    this reading bills 133,392 for `n: 16`)."""
    text = " ".join(f"word{i}" for i in range(600)) + " [[fake completion=5]]"
    before = px.fake.pool_totals(OTHER[0]).consumed
    r = post(px, "/v1/chat/completions", {"model": "rt1-other", "n": 16, "max_tokens": 10,
                                          "thinking": {"type": "disabled"},
                                          "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text[:300]
    used = px.fake.pool_totals(OTHER[0]).consumed - before
    assert used >= 16 * 600
    line = px.wait_for_log(rf"\[Usage\].*call={r.headers.get('x-litellm-call-id', '')}")[-1]
    assert int(re.search(r"reserved=(\d+)", line).group(1)) >= used, line  # type: ignore[union-attr]


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/chat/completions", lambda extra: {"max_tokens": 20, "thinking": {"type": "disabled"},
                                            "messages": [{"role": "user", "content": [
                                                {"type": "text", "text": "hi [[fake completion=5]]",
                                                 **extra}]}]}),
    ("/v1/responses", lambda extra: {"max_output_tokens": 20, "input": [
        {"role": "user", "content": "hi [[fake completion=5]]"},
        {"role": "assistant", "content": [{"type": "output_text", "text": "ok", **extra}]}]}),
], ids=["chat-text", "responses-output-text"])
def test_the_other_keys_of_a_text_part_are_reserved(px: Proxy, path: str, body: Any) -> None:
    """A text part's keys beside its text reach Ark (the fake bills them as text: a 30,000-word
    `refusal` beside "hi" was 46 reserved, 92,579 consumed, 52,579 billed; red-team, stop 44)."""
    words = " ".join(f"q{i}" for i in range(30_000))  # more than the pool holds
    for key in ("refusal", "annotations", "note"):
        r = post(px, path, {"model": "rt1-parts", **body({key: words})})
        assert r.status_code in (200, 429), r.text[:300]
    assert px.fake.pool_totals(PARTS[0]).billed == 0


@pytest.mark.parametrize(("body", "field"), [
    ('{"model":"rt1-other","max_tokens":5,"messages":[{"role":"user","content":"hi"}],'
     '"temperature":NaN}', "temperature"),
    ('{"model":"rt1-other","max_tokens":5,"messages":[{"role":"user","content":"hi",'
     '"x":[1,-Infinity]}]}', "messages[0].x[1]"),
    ('{"model":"rt1-other","max_tokens":5,"messages":[{"role":"user","content":"hi"}],'
     '"extra_body":{"top_p":Infinity}}', "top_p"),
], ids=["top-level", "in-a-message", "extra-body"])
def test_a_number_json_cannot_carry_is_a_400_naming_it(px: Proxy, body: str, field: str) -> None:
    """NaN / Infinity parse, but LiteLLM cannot send them: the call failed after the reserve as a
    500 the guard kept as maybe-sent (8,221 held per attempt, the router retrying it)."""
    before = len(px.fake.upstream_requests())
    r = httpx.post(f"{px.url}/v1/chat/completions", content=body, timeout=60,
                   headers={"Authorization": f"Bearer {MASTER_KEY}", "Content-Type": "application/json",
                            "x-litellm-call-id": call_id()})
    assert r.status_code == 400 and field in r.text, (r.status_code, r.text[:300])
    assert px.fake.upstream_requests()[before:] == []
    assert not px.state(OTHER[0]).get("inflight")
