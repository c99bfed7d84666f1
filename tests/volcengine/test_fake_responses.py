"""The fake Ark Responses API and embeddings over HTTP: usage, stored chains, streaming."""

from __future__ import annotations

import base64
import json
import struct
from typing import Any

import httpx
import openai
from vc_support import AUTH, HTTP, MODEL, POOL_A

from volc_quota_guard.fake import FakeVolcengine


def respond(fake: FakeVolcengine, input: Any, key: str = "ark-key-a",
            **body: Any) -> httpx.Response:
    return HTTP.post(f"{fake.ark_base_url}/responses", timeout=30,
                     headers={"Authorization": f"Bearer {key}"},
                     json={"model": MODEL, "input": input, **body})


def embed(fake: FakeVolcengine, input: Any, **body: Any) -> httpx.Response:
    return HTTP.post(f"{fake.ark_base_url}/embeddings", headers=AUTH, timeout=30,
                     json={"model": MODEL, "input": input, **body})


def sse(response: httpx.Response) -> list[tuple[str, dict[str, Any]]]:
    """(event name, data) of each SSE frame."""
    out = []
    for frame in response.text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in frame.splitlines() if ": " in line)
        if "data" in lines:
            out.append((lines.get("event", ""), json.loads(lines["data"])))
    return out


def test_a_response_reports_openai_usage_and_charges_the_ledger(fake: FakeVolcengine) -> None:
    """input/output usage (with cached and reasoning details) and the ledger charge agree."""
    fake.add_package(POOL_A, 1_000)
    r = respond(fake, "hi [[fake prompt=700 completion=300 reasoning=200 cached=50]]")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "response" and body["status"] == "completed"
    assert body["id"].startswith("resp_")
    assert body["usage"] == {"input_tokens": 700, "input_tokens_details": {"cached_tokens": 50},
                             "output_tokens": 500,
                             "output_tokens_details": {"reasoning_tokens": 200},
                             "total_tokens": 1200}
    assert [item["type"] for item in body["output"]] == ["reasoning", "message"]
    assert fake.pool_totals(POOL_A).billed == 200
    (rec,) = fake.chat_requests()
    assert (rec.endpoint, rec.consumed, rec.billed, rec.response_id) == (
        "responses", 1200, 200, body["id"])


def test_max_output_tokens_bounds_reasoning_and_answer(fake: FakeVolcengine) -> None:
    """max_output_tokens caps the sum (reasoning first); a capped answer is incomplete."""
    r = respond(fake, "[[fake prompt=1 completion=500 reasoning=800]]", max_output_tokens=1000)
    usage = r.json()["usage"]
    assert (usage["output_tokens"], usage["output_tokens_details"]["reasoning_tokens"]) == (
        1000, 800)
    assert r.json()["status"] == "incomplete"
    assert r.json()["incomplete_details"] == {"reason": "max_output_tokens"}
    uncapped = respond(fake, "[[fake prompt=1 completion=9000 reasoning=9000]]").json()
    assert uncapped["usage"]["output_tokens"] == 18_000  # no default cap on Responses


def test_a_text_format_schema_and_a_named_tool_choice_are_billed(fake: FakeVolcengine) -> None:
    """`text.format` (a JSON schema), a named `tool_choice` and `context_management` reach Ark:
    their JSON is billed as prompt text (a red-team pass found a 13,780-token schema billed 18)."""
    plain = respond(fake, "hi [[fake completion=1]]").json()["usage"]["input_tokens"]
    schema = {"format": {"type": "json_schema", "name": "x", "schema": {
        "type": "object", "description": "a long description of the answer " * 40}}}
    with_schema = respond(fake, "hi [[fake completion=1]]", text=schema).json()["usage"]
    assert with_schema["input_tokens"] > plain + 40 * 6
    choice = {"type": "function", "name": "lookup_" + "x" * 400}
    assert respond(fake, "hi [[fake completion=1]]", tool_choice=choice).json()["usage"][
        "input_tokens"] > plain + 50


def test_reasoning_switches_on_the_responses_api(fake: FakeVolcengine) -> None:
    """reasoning.effort minimal or thinking disabled turn reasoning off; it is on otherwise."""
    text = "[[fake prompt=1 completion=10 reasoning=300]]"
    assert respond(fake, text).json()["usage"]["output_tokens"] == 310
    assert respond(fake, text, reasoning={"effort": "minimal"}).json()["usage"][
        "output_tokens"] == 10
    assert respond(fake, text, thinking={"type": "disabled"}).json()["usage"][
        "output_tokens"] == 10
    assert respond(fake, text, thinking={"type": "disabled"}, reasoning={"effort": "high"}) \
        .json()["usage"]["output_tokens"] == 310


def test_previous_response_id_re_reads_the_whole_stored_chain_as_input(
        fake: FakeVolcengine) -> None:
    """Each follow-up is billed the previous turns' inputs and outputs again, recursively."""
    fake.add_package(POOL_A, 60_000)
    first = respond(fake, "[[fake prompt=22000 completion=100 reasoning=400]]").json()
    second = respond(fake, "more [[fake prompt=50 completion=60]]",
                     previous_response_id=first["id"]).json()
    assert second["usage"]["input_tokens"] == 22_500 + 50
    assert second["previous_response_id"] == first["id"]
    third = respond(fake, "and more [[fake prompt=10 completion=20 reasoning=0]]",
                    previous_response_id=second["id"]).json()
    assert third["usage"]["input_tokens"] == 22_550 + 60 + 10
    consumed = 22_500 + (22_550 + 60) + (22_620 + 20)
    assert fake.pool_totals(POOL_A).consumed == consumed
    assert fake.pool_totals(POOL_A).billed == consumed - 60_000
    assert [r.chain_tokens for r in fake.chat_requests()] == [0, 22_500, 22_610]


def test_unknown_unstored_and_foreign_previous_responses_are_refused(
        fake: FakeVolcengine) -> None:
    """An unknown id, a store=false response, or another account's response is a 400."""
    r = respond(fake, "x", previous_response_id="resp_nope")
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "previous_response_id"
    unstored = respond(fake, "[[fake prompt=5]]", store=False).json()
    assert respond(fake, "x", previous_response_id=unstored["id"]).status_code == 400
    stored = respond(fake, "[[fake prompt=5]]").json()
    assert respond(fake, "x", key="ark-key-b", previous_response_id=stored["id"]) \
        .status_code == 400
    assert respond(fake, "x [[fake prompt=1]]", previous_response_id=stored["id"]) \
        .status_code == 200
    assert fake.pool_totals(POOL_A).consumed == (5 + 64) * 2 + (69 + 1 + 64)


def test_a_stored_response_can_be_read_and_deleted(fake: FakeVolcengine) -> None:
    """GET returns the stored response; after DELETE a follow-up can no longer use it."""
    stored = respond(fake, "[[fake prompt=5]]").json()
    url = f"{fake.ark_base_url}/responses/{stored['id']}"
    assert HTTP.get(url, headers=AUTH).json()["usage"] == stored["usage"]
    assert HTTP.delete(url, headers=AUTH).json()["deleted"] is True
    assert HTTP.get(url, headers=AUTH).status_code == 404
    assert respond(fake, "x", previous_response_id=stored["id"]).status_code == 400


def test_input_items_instructions_tools_and_images_are_all_billed(
        fake: FakeVolcengine) -> None:
    """A list input counts every item's text, the instructions, the tools and image parts."""
    items = [{"role": "user", "content": [
        {"type": "input_text", "text": "look [[fake completion=1 reasoning=0]]"},
        {"type": "input_image", "image_url": "https://example.com/cat.png"}]}]
    bare = respond(fake, items).json()["usage"]["input_tokens"]
    assert bare > 1312
    longer = respond(fake, items, instructions="you are careful " * 40).json()
    assert longer["usage"]["input_tokens"] > bare + 100
    tools = [{"type": "function", "name": "lookup", "description": "look up a word " * 30,
              "parameters": {"type": "object", "properties": {}}}]
    with_tools = respond(fake, items, tools=tools).json()
    assert with_tools["usage"]["input_tokens"] > bare + 100
    video = [{"role": "user", "content": [
        {"type": "input_text", "text": "[[fake prompt=3 completion=1]]"},
        {"type": "input_video", "video_url": "https://example.com/v.mp4"}]}]
    assert respond(fake, video).json()["usage"]["input_tokens"] == 200_003


def test_the_openai_sdk_streams_a_response_with_usage(fake: FakeVolcengine) -> None:
    """The OpenAI client reads the fake's Responses event stream, usage in response.completed."""
    client = openai.OpenAI(base_url=fake.ark_base_url, api_key="ark-key-a", max_retries=0)
    events = list(client.responses.create(
        model=MODEL, input="[[fake prompt=40 completion=7 reasoning=3]]", stream=True))
    kinds = [e.type for e in events]
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" in kinds
    usage = events[-1].response.usage  # type: ignore[union-attr]
    assert usage is not None and (usage.input_tokens, usage.output_tokens) == (40, 10)
    assert fake.pool_totals(POOL_A).consumed == 50


def test_a_capped_stream_ends_incomplete_and_a_cut_stream_still_charges(
        fake: FakeVolcengine) -> None:
    """A capped stream ends with response.incomplete; cut=1 breaks after one delta, charged."""
    r = respond(fake, "[[fake prompt=5 completion=50]]", stream=True, max_output_tokens=10)
    events = sse(r)
    assert events[-1][0] == "response.incomplete"
    assert events[-1][1]["response"]["usage"]["output_tokens"] == 10
    assert [n for n, _ in events] == [d["type"] for _, d in events]
    try:
        respond(fake, "[[fake prompt=5 completion=50 cut=1]]", stream=True)
    except httpx.RemoteProtocolError:
        pass
    assert fake.pool_totals(POOL_A).consumed == 15 + 55


def test_embeddings_bill_every_input_and_report_usage(fake: FakeVolcengine) -> None:
    """Strings are counted by the model's tokenizer (MODEL is DeepSeek: 2 and 1 tokens, each
    + 3% rounded up), token arrays by length; usage and ledger agree."""
    one = embed(fake, "hello world").json()
    assert one["usage"] == {"prompt_tokens": 3, "total_tokens": 3}
    many = embed(fake, ["hello world", "hi", [1, 2, 3, 4, 5]]).json()
    assert [d["index"] for d in many["data"]] == [0, 1, 2]
    assert many["usage"]["prompt_tokens"] == 3 + 2 + 5
    assert embed(fake, [[7] * 9, [8] * 3]).json()["usage"]["prompt_tokens"] == 12
    assert fake.pool_totals(POOL_A).consumed == 3 + 10 + 12
    assert [r.endpoint for r in fake.chat_requests()] == ["embeddings"] * 3
    assert embed(fake, []).status_code == 400
    assert embed(fake, {"text": "x"}).status_code == 400


def test_embeddings_beyond_the_balance_are_billed_and_the_sdk_reads_them(
        fake: FakeVolcengine) -> None:
    """prompt= sets the count; past the free balance it is billed; base64 vectors decode."""
    fake.add_package(POOL_A, 60_000)
    client = openai.OpenAI(base_url=fake.ark_base_url, api_key="ark-key-a", max_retries=0)
    got = client.embeddings.create(model=MODEL, input=["[[fake prompt=90000]] big"])
    assert got.usage.prompt_tokens == 90_000
    assert len(got.data[0].embedding) == 8
    assert fake.pool_totals(POOL_A).billed == 30_000
    raw = embed(fake, "x [[fake prompt=1]]", encoding_format="base64").json()
    assert len(struct.unpack("<8f", base64.b64decode(raw["data"][0]["embedding"]))) == 8
