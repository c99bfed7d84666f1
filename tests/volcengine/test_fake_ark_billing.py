"""The fake Ark chat endpoint bills as ref/ARK.md says (the expensive reading): caps, thinking,
n, images and other media — over HTTP."""

from __future__ import annotations

import base64
import io
from typing import Any

import httpx
import pytest
from PIL import Image
from vc_support import AUTH, HTTP, MODEL, POOL_A, chat, sse_events

from volc_quota_guard.fake import FakeVolcengine


def usage_of(r: httpx.Response) -> dict[str, Any]:
    assert r.status_code == 200, r.text
    return dict(r.json()["usage"])


def post(fake: FakeVolcengine, messages: list[Any], **body: Any) -> httpx.Response:
    return HTTP.post(f"{fake.ark_base_url}/chat/completions", headers=AUTH, timeout=30,
                     json={"model": MODEL, "messages": messages, **body})


def data_url(fmt: str, size: tuple[int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", size, (200, 30, 30)).save(buf, format=fmt)
    mime = {"JPEG": "jpeg", "PNG": "png", "GIF": "gif", "WEBP": "webp"}[fmt]
    return f"data:image/{mime};base64," + base64.b64encode(buf.getvalue()).decode()


def image_message(url: str, detail: str | None = None, **extra: Any) -> list[Any]:
    image: dict[str, Any] = {"url": url, **extra}
    if detail is not None:
        image["detail"] = detail
    return [{"role": "user", "content": [
        {"type": "text", "text": "what is this? [[fake prompt=10 completion=1]]"},
        {"type": "image_url", "image_url": image}]}]


def test_max_tokens_and_max_completion_tokens_together_are_a_400(fake: FakeVolcengine) -> None:
    """Ark refuses a request carrying both caps, with its error shape, and consumes nothing."""
    r = chat(fake, "[[fake prompt=10 completion=5]]", max_tokens=100, max_completion_tokens=100)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "InvalidParameter"
    assert "max_completion_tokens" in r.json()["error"]["message"]
    assert fake.pool_totals(POOL_A).consumed == 0
    assert chat(fake, "x", max_completion_tokens=65_537).status_code == 400


def test_reasoning_is_on_by_default_and_max_tokens_does_not_bound_it(
        fake: FakeVolcengine) -> None:
    """With no thinking switch, reasoning is produced on top of a max_tokens-capped answer."""
    fake.add_package(POOL_A, 5_000)
    r = chat(fake, "[[fake prompt=100 completion=2000 reasoning=6000]]", max_tokens=1000)
    usage = usage_of(r)
    assert usage["completion_tokens"] == 1000 + 6000
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 6000
    assert r.json()["choices"][0]["finish_reason"] == "length"
    assert r.json()["choices"][0]["message"]["reasoning_content"]
    (rec,) = fake.chat_requests()
    assert (rec.thinking, rec.reasoning_tokens, rec.consumed) == (True, 6000, 7100)
    assert (fake.pool_totals(POOL_A).billed, rec.billed) == (2100, 2100)


def test_max_completion_tokens_bounds_reasoning_and_answer_together(
        fake: FakeVolcengine) -> None:
    """max_completion_tokens caps the sum: reasoning first, the answer gets the rest."""
    usage = usage_of(chat(fake, "[[fake prompt=1 completion=500 reasoning=800]]",
                          max_completion_tokens=1000))
    assert (usage["completion_tokens"], usage["completion_tokens_details"]["reasoning_tokens"]) \
        == (1000, 800)
    usage = usage_of(chat(fake, "[[fake prompt=1 completion=500 reasoning=3000]]",
                          max_completion_tokens=1000))
    assert (usage["completion_tokens"], usage["completion_tokens_details"]["reasoning_tokens"]) \
        == (1000, 1000)


def test_without_a_cap_the_answer_stops_at_4096_and_reasoning_does_not(
        fake: FakeVolcengine) -> None:
    """No cap sent: Ark's max_tokens default (4096) bounds the answer only; with
    max_completion_tokens set that default no longer applies."""
    usage = usage_of(chat(fake, "[[fake prompt=1 completion=9000 reasoning=5000]]"))
    assert usage["completion_tokens"] == 4096 + 5000
    usage = usage_of(chat(fake, "[[fake prompt=1 completion=9000 reasoning=0]]",
                          max_completion_tokens=8000))
    assert usage["completion_tokens"] == 8000


@pytest.mark.parametrize(("switches", "thinking"), [
    ({"thinking": {"type": "disabled"}}, False),
    ({"reasoning_effort": "minimal"}, False),
    ({"thinking": {"type": "auto"}}, True),
    ({"thinking": {"type": "enabled"}}, True),
    ({"reasoning_effort": "low"}, True),
    ({"thinking": {"type": "disabled"}, "reasoning_effort": "high"}, True),
    ({"thinking": {"type": "enabled"}, "reasoning_effort": "minimal"}, True),
])
def test_thinking_switches(fake: FakeVolcengine, switches: dict[str, Any],
                           thinking: bool) -> None:
    """Only an off switch with nothing asking for thinking turns reasoning off."""
    usage = usage_of(chat(fake, "[[fake prompt=1 completion=10 reasoning=300]]", **switches))
    assert usage["completion_tokens_details"]["reasoning_tokens"] == (300 if thinking else 0)
    assert fake.chat_requests()[0].thinking is thinking


def test_reasoning_default_comes_from_the_server_defaults(fake: FakeVolcengine) -> None:
    """The reasoning_tokens default (admin API) applies when the directive is silent."""
    HTTP.post(f"{fake.url}/_fake/defaults", json={"reasoning_tokens": 700,
                                                  "completion_tokens": 20})
    usage = usage_of(chat(fake, "[[fake prompt=1]]", max_tokens=5))
    assert usage["completion_tokens"] == 705
    assert chat(fake, "x", thinking={"type": "sometimes"}).status_code == 400


def test_n_multiplies_the_output(fake: FakeVolcengine) -> None:
    """n choices each produce the whole answer and reasoning, and each reads the prompt (Ark does
    not document `n`: the dearer reading); usage sums them."""
    r = chat(fake, "[[fake prompt=26 completion=2000 reasoning=100]]", n=40, max_tokens=2000)
    usage = usage_of(r)
    assert len(r.json()["choices"]) == 40
    assert usage["completion_tokens"] == 40 * 2100
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 4000
    assert usage["prompt_tokens"] == 40 * 26
    assert fake.pool_totals(POOL_A).consumed == 40 * 26 + 84_000
    for bad in (0, 129, "3", True):
        assert chat(fake, "x", n=bad).status_code == 400


def test_a_streamed_n_sends_every_choice_and_the_summed_usage(fake: FakeVolcengine) -> None:
    """A stream with n=3 has content and a finish for each index and one summed usage chunk."""
    r = chat(fake, "[[fake prompt=5 completion=7 reasoning=2]]", n=3, stream=True,
             stream_options={"include_usage": True})
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    assert events[-2]["usage"]["completion_tokens"] == 27
    finishes = [c["index"] for e in events[:-2] for c in e["choices"] if c["finish_reason"]]
    assert finishes == [0, 1, 2]
    assert fake.pool_totals(POOL_A).consumed == 3 * 5 + 27  # each choice reads the prompt


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "GIF", "WEBP"])
def test_a_data_url_image_is_billed_by_its_pixels(fake: FakeVolcengine, fmt: str) -> None:
    """A small image costs ceil(w*h/784) tokens, read from the data URL's header."""
    usage = usage_of(post(fake, image_message(data_url(fmt, (300, 200)))))
    assert usage["prompt_tokens"] == 10 + 77  # ceil(60000 / 784)
    assert fake.chat_requests()[0].media_tokens == 77


@pytest.mark.parametrize(("size", "detail", "tokens"), [
    ((2000, 1500), None, 1312),     # low by default: scaled to 1,048,576 px, capped at 1,312
    ((2000, 1500), "low", 1312),
    ((2000, 1500), "high", 3827),   # ceil(3,000,000 / 784)
    ((4000, 3000), "high", 5120),   # scaled to 4,014,080 px
    ((2000, 1500), "auto", 3827),   # auto: the expensive reading (high)
])
def test_large_images_are_scaled_and_capped_per_detail(
        fake: FakeVolcengine, size: tuple[int, int], detail: str | None, tokens: int) -> None:
    """Big images are bounded by the detail's pixel limit and token cap."""
    usage = usage_of(post(fake, image_message(data_url("PNG", size), detail)))
    assert usage["prompt_tokens"] == 10 + tokens


def test_a_remote_image_is_billed_at_the_cap_and_pixel_limits_apply(
        fake: FakeVolcengine) -> None:
    """An http(s) image costs the detail's maximum; image_pixel_limit scales an image up to
    min_pixels or down to max_pixels."""
    assert usage_of(post(fake, image_message("https://example.com/a.png")))[
        "prompt_tokens"] == 10 + 1312
    assert usage_of(post(fake, image_message("https://example.com/a.png", "high")))[
        "prompt_tokens"] == 10 + 5120
    small = data_url("PNG", (100, 100))
    assert usage_of(post(fake, image_message(small, image_pixel_limit={"min_pixels": 78_400})))[
        "prompt_tokens"] == 10 + 100
    big = data_url("PNG", (2000, 1500))
    assert usage_of(post(fake, image_message(big, image_pixel_limit={"max_pixels": 100_000})))[
        "prompt_tokens"] == 10 + 128  # scaled down to 100,000 px
    assert usage_of(post(fake, image_message(big, "high",
                                             image_pixel_limit={"max_pixels": 8_000_000})))[
        "prompt_tokens"] == 10 + 3827  # a higher bound raises the cap, not the image
    assert post(fake, image_message("data:image/png;base64,bm90IGFuIGltYWdl")).status_code == 400
    assert post(fake, image_message("ftp://example.com/a.png")).status_code == 400


def test_video_audio_and_file_parts_cost_the_media_amount(fake: FakeVolcengine) -> None:
    """Each unseen media part costs 200,000 tokens by default, or media= from the directive;
    an unknown part type is a 400."""
    parts = [{"type": "text", "text": "describe [[fake prompt=8 completion=1]]"},
             {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}}]
    fake.add_package(POOL_A, 60_000)
    usage = usage_of(post(fake, [{"role": "user", "content": parts}]))
    assert usage["prompt_tokens"] == 8 + 200_000
    assert fake.pool_totals(POOL_A).billed == 200_009 - 60_000
    parts[0]["text"] = "describe [[fake prompt=8 completion=1 media=5000]]"
    parts += [{"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
              {"type": "file", "file": {"file_id": "f-1"}}]
    assert usage_of(post(fake, [{"role": "user", "content": parts}]))["prompt_tokens"] == \
        8 + 3 * 5000
    parts.append({"type": "hologram"})
    assert post(fake, [{"role": "user", "content": parts}]).status_code == 400


def test_the_counted_prompt_includes_every_message_tools_and_response_format(
        fake: FakeVolcengine) -> None:
    """Without prompt=, the text count covers all messages, the tools and the response format
    (MODEL is a DeepSeek model: its tokenizer and template, + 3% and 2 per message)."""
    from volc_quota_guard import counting

    def ark(messages: list[Any], tools: list[Any] | None = None) -> int:
        return -(-counting.count_chat("deepseek", messages, tools) * 103 // 100) + 2 * len(messages)

    messages = [{"role": "system", "content": "be brief " * 50},
                {"role": "user", "content": "hi [[fake completion=1]]"}]
    tools = [{"type": "function", "function": {
        "name": "lookup", "description": "look a word up " * 20,
        "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}}]
    plain = usage_of(post(fake, messages))["prompt_tokens"]
    assert plain == ark(messages)
    with_tools = usage_of(post(fake, messages, tools=tools))["prompt_tokens"]
    assert with_tools == ark(messages, tools) > plain + 60
    schema = {"type": "json_schema", "json_schema": {"name": "x", "schema": {
        "type": "object", "description": "a long description " * 30}}}
    assert usage_of(post(fake, messages, response_format=schema))["prompt_tokens"] > plain + 60


def test_legacy_functions_tool_choice_and_message_names_are_billed(fake: FakeVolcengine) -> None:
    """What Ark renders besides messages and tools is billed as its text, the dearer reading (a
    red-team pass found 20 legacy functions billed 18 tokens): `functions`, a named
    `function_call`/`tool_choice`; on DeepSeek models a user message's `name` and
    `reasoning_content`, which the DeepSeek template count does not read."""
    messages = [{"role": "user", "content": "hi [[fake completion=1]]"}]
    plain = usage_of(post(fake, messages))["prompt_tokens"]
    functions = [{"name": f"f{i}", "description": "look a word up in the big dictionary " * 20,
                  "parameters": {"type": "object"}} for i in range(5)]
    billed = usage_of(post(fake, messages, functions=functions, function_call={"name": "f1"}))
    assert billed["prompt_tokens"] > plain + 5 * 20 * 7
    named = {"type": "function", "function": {"name": "lookup_" + "x" * 400}}
    assert usage_of(post(fake, messages, tool_choice=named))["prompt_tokens"] > plain + 50
    assert usage_of(post(fake, messages, tool_choice="auto"))["prompt_tokens"] == plain
    long = "a long name that the template renders " * 40
    named_user = [{"role": "user", "name": long, "reasoning_content": long,
                   "content": "hi [[fake completion=1]]"}]
    assert usage_of(post(fake, named_user))["prompt_tokens"] > plain + 2 * 40 * 7
    # An assistant turn's fields the template does not render (a refusal, audio) are billed as
    # their JSON too (red-team, stop 37: the fake billed 0 for them on DeepSeek models).
    turn = [{"role": "user", "content": "a"},
            {"role": "assistant", "content": "b", "refusal": long, "audio": {"id": long}},
            {"role": "user", "content": "hi [[fake completion=1]]"}]
    bare = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
            {"role": "user", "content": "hi [[fake completion=1]]"}]
    without = usage_of(post(fake, bare))["prompt_tokens"]
    assert usage_of(post(fake, turn))["prompt_tokens"] > without + 2 * 40 * 7
    # A text part's keys beside its text are billed as text too (the dearer reading; red-team,
    # stop 44: the guard reserved only the text).
    part = {"type": "text", "text": "hi [[fake completion=1]]"}
    alone = usage_of(post(fake, [{"role": "user", "content": [part]}]))["prompt_tokens"]
    for extra in ({"refusal": long}, {"note": long}, {"annotations": [long]}):
        billed = usage_of(post(fake, [{"role": "user", "content": [{**part, **extra}]}]))["prompt_tokens"]
        assert billed > alone + 40 * 7, extra


def test_unknown_fields_such_as_merged_extra_body_keys_are_accepted(
        fake: FakeVolcengine) -> None:
    """Fields LiteLLM merges from extra_body (thinking, caching, anything) do not break a call."""
    r = chat(fake, "[[fake prompt=3 completion=4 reasoning=5]]", thinking={"type": "enabled"},
             caching={"type": "enabled"}, some_future_field=[1, 2])
    assert usage_of(r)["completion_tokens"] == 9
