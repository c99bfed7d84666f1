"""The request estimate: input tokens, output cap, and the client's numbers validated (pure, no I/O)."""

from __future__ import annotations

import asyncio

import pytest

from volc_quota_guard import estimate
from volc_quota_guard.estimate import InvalidRequest, OutputCap


def chat(content: object, **params: object) -> dict[str, object]:
    return {"messages": [{"role": "user", "content": content}], **params}


@pytest.mark.parametrize("value", ["100", 1.5, 100.0, True, False, -1, 0, 10**12, [5], {"n": 5}])
def test_bad_output_caps_are_the_clients_400(value: object) -> None:
    """Non-integer, bool, negative, zero and huge caps raise InvalidRequest naming the field."""
    with pytest.raises(InvalidRequest) as err:
        estimate.requested_output({"max_tokens": value})
    assert err.value.param == "max_tokens" and "max_tokens" in str(err.value)


def test_the_largest_of_all_cap_fields_is_what_the_upstream_may_produce() -> None:
    """LiteLLM maps max_completion_tokens onto max_tokens; extra_body is merged in: take the max."""
    assert estimate.requested_output({"max_tokens": 10, "max_completion_tokens": 300}) == 300
    assert estimate.requested_output({"max_tokens": 10, "extra_body": {"max_tokens": 900}}) == 900
    assert estimate.requested_output({"max_tokens": None}) is None
    with pytest.raises(InvalidRequest) as err:
        estimate.requested_output({"extra_body": {"max_completion_tokens": "x"}})
    assert err.value.param == "extra_body.max_completion_tokens"


def test_output_cap_prefers_request_then_model_then_default() -> None:
    """The client's cap (never above the model's), else the model's max output, else the default."""
    assert estimate.output_cap({"max_tokens": 500}, 4096, 8192) == OutputCap(500, "request")
    assert estimate.output_cap({"max_tokens": 9000}, 4096, 8192) == OutputCap(4096, "request")
    assert estimate.output_cap({}, 4096, 8192) == OutputCap(4096, "model")
    assert estimate.output_cap({}, None, 8192) == OutputCap(8192, "default")


def test_model_max_output_reads_config_then_litellm_map_and_survives_unmapped_models() -> None:
    """`model_info.max_output_tokens` wins; LiteLLM's map is next; an unmapped model gives None."""
    assert estimate.model_max_output({"max_output_tokens": 777}, "anything") == 777
    assert estimate.model_max_output({}, "deepseek-v3-2-251201") == 32768
    assert estimate.model_max_output({}, "doubao-not-in-the-map-250101") is None
    assert estimate.model_max_output({"max_output_tokens": True}, "doubao-x") is None


def test_chinese_is_counted_at_least_one_token_per_character() -> None:
    """cl100k over-counts Chinese (safe for a reservation): never fewer tokens than characters."""
    text = "火山方舟免费额度保护" * 50
    assert estimate.count_input_sync(chat(text)) >= len(text)


def test_media_parts_cost_a_generous_constant_and_never_fetch_the_url() -> None:
    """An image part adds IMAGE_PART_TOKENS without a network fetch; unknown parts add more."""
    text_only = estimate.count_input_sync(chat([{"type": "text", "text": "what"}]))
    with_image = estimate.count_input_sync(chat([
        {"type": "text", "text": "what"},
        {"type": "image_url", "image_url": {"url": "http://127.0.0.1:9/never-fetched.png"}}]))
    with_video = estimate.count_input_sync(chat([
        {"type": "text", "text": "what"}, {"type": "video_url", "video_url": {"url": "x"}}]))
    assert with_image - text_only == estimate.IMAGE_PART_TOKENS
    assert with_video - text_only >= estimate.MEDIA_PART_TOKENS


def test_tools_and_tool_calls_add_tokens() -> None:
    """Tool definitions and assistant tool calls are part of the input."""
    base = [{"role": "user", "content": "call f"}]
    tools = [{"type": "function", "function": {"name": "lookup_weather", "description": "x " * 50,
                                               "parameters": {"type": "object"}}}]
    assert estimate.count_input_sync({"messages": base, "tools": tools}) > \
        estimate.count_input_sync({"messages": base}) + 40


@pytest.mark.parametrize("messages", ["hello", [5], [{"role": "user", "content": {"odd": 1}}]])
def test_unreadable_messages_fall_back_to_a_byte_count_not_a_crash(messages: object) -> None:
    """What the tokenizer cannot read is counted as its UTF-8 bytes, an upper bound."""
    assert estimate.count_input_sync({"messages": messages}) >= 1


def test_other_request_shapes_are_counted() -> None:
    """Responses `input`/`instructions`, completion `prompt` and embedding `input` all count."""
    assert estimate.count_input_sync({"input": "hello world " * 20}) > 20
    assert estimate.count_input_sync({"prompt": ["a b c", "d e f"]}) >= 2
    assert estimate.count_input_sync({"input": [{"role": "user", "content": "hi"}],
                                      "instructions": "be brief"}) > 3
    assert estimate.count_input_sync({}) == 1


def test_big_prompts_are_counted_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Above THREAD_ABOVE_CHARS the count runs in a worker thread, and matches the inline count."""
    threaded: list[bool] = []
    real = asyncio.to_thread

    async def spy(fn, *a, **kw):  # type: ignore[no-untyped-def]
        threaded.append(True)
        return await real(fn, *a, **kw)

    monkeypatch.setattr(estimate.asyncio, "to_thread", spy)
    small, big = chat("short"), chat("长" * (estimate.THREAD_ABOVE_CHARS + 1))
    assert asyncio.run(estimate.count_input(small)) == estimate.count_input_sync(small)
    assert threaded == []
    assert asyncio.run(estimate.count_input(big)) == estimate.count_input_sync(big)
    assert threaded == [True]


@pytest.mark.parametrize("messages", [None, [], "hi", [5], [{"content": "no role"}],
                                      [{"role": "user", "content": 5}],
                                      [{"role": "user", "content": [5]}]])
def test_malformed_chat_messages_are_rejected(messages: object) -> None:
    """Chat messages must be a non-empty list of role/content objects (checked before reserving)."""
    with pytest.raises(InvalidRequest):
        estimate.validate_messages({"messages": messages})


def test_wellformed_chat_messages_pass_validation() -> None:
    """Strings, null content with tool calls, and content-part lists are all valid."""
    estimate.validate_messages({"messages": [
        {"role": "system", "content": "s"},
        {"role": "user", "content": [{"type": "text", "text": "t"}]},
        {"role": "assistant", "content": None, "tool_calls": []}]})
