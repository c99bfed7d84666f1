"""The one admission rule (`admission.size`): what a request may bill, from the request Ark receives."""

from __future__ import annotations

import base64
import io
import os
import struct
import zlib
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm: no network

import pytest  # noqa: E402

from volc_quota_guard import admission, counting, estimate, media  # noqa: E402
from volc_quota_guard.admission import ROUTES, Limits, size  # noqa: E402
from volc_quota_guard.estimate import InvalidRequest  # noqa: E402

CHAT, RESPONSES, EMBEDDING, MESSAGES = (ROUTES[c] for c in
                                        ("acompletion", "aresponses", "aembedding", "anthropic_messages"))
LIMITS = Limits(model_max_output=None, default_output=8_192, reasoning_tokens=8_192, min_output=256,
                context_window=131_072)


def chat(content: object = "hello", **extra: Any) -> dict[str, Any]:
    return {"model": "volcengine/m", "messages": [{"role": "user", "content": content}], **extra}


def png(width: int, height: int) -> str:
    """A data URL of a (header-only) PNG of the given size."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    body = b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(
        ">I", zlib.crc32(b"IHDR" + ihdr))
    return "data:image/png;base64," + base64.b64encode(body).decode()


def test_extra_body_fields_are_what_ark_receives() -> None:
    """`extra_body.messages` replaces the tiny top-level prompt, and its size is what is reserved."""
    big = "长" * 20_000
    plain = size(chat("hi"), CHAT, LIMITS)
    merged = size(chat("hi", extra_body={"messages": [{"role": "user", "content": big}]}), CHAT, LIMITS)
    assert plain.input_tokens < 50 and merged.input_tokens >= 20_000


def test_embedding_input_in_extra_body_is_counted() -> None:
    """An embedding's `extra_body.input` overrides `input`; the reservation follows it, no output."""
    s = size({"input": "hi", "extra_body": {"input": "token " * 9_000}}, EMBEDDING, LIMITS)
    assert s.input_tokens >= 9_000 and s.output == 0


def test_unknown_fields_ark_receives_are_bounded_by_their_bytes() -> None:
    """A field the guard does not tokenize (top level or extra_body) still counts, at its UTF-8 size."""
    blob = "x" * 5_000
    assert size(chat("hi", extra_body={"mystery": blob}), CHAT, LIMITS).input_tokens > 5_000
    assert size(chat("hi", response_format={"schema": blob}), CHAT, LIMITS).input_tokens > 5_000


def test_max_tokens_with_thinking_possible_reserves_an_allowance_and_pins_the_total() -> None:
    """max_tokens caps only the answer on Ark: per choice = N + the reasoning allowance."""
    s = size(chat(max_tokens=1_000), CHAT, LIMITS)
    assert (s.per_choice, s.reasoning, s.choices) == (9_192, 8_192, 1)


@pytest.mark.parametrize("switch", [{"thinking": {"type": "disabled"}}, {"reasoning_effort": "minimal"},
                                    {"extra_body": {"thinking": {"type": "disabled"}}}])
def test_thinking_switched_off_needs_no_allowance(switch: dict[str, Any]) -> None:
    """`thinking.type: disabled` or `reasoning_effort: minimal` reserve the answer cap alone."""
    assert size(chat(max_tokens=1_000, **switch), CHAT, LIMITS).per_choice == 1_000


def test_max_completion_tokens_already_bounds_reasoning() -> None:
    """A client's max_completion_tokens is the per-choice total; no allowance is added."""
    s = size(chat(max_completion_tokens=3_000), CHAT, LIMITS)
    assert (s.per_choice, s.reasoning) == (3_000, 0)


def test_the_total_never_exceeds_arks_max_completion_tokens_range() -> None:
    """Ark accepts max_completion_tokens up to 65,536: the pin is clamped there."""
    assert size(chat(max_tokens=64_000), CHAT, LIMITS).per_choice == admission.ARK_MAX_COMPLETION_TOKENS


def test_n_multiplies_the_output_and_has_a_bound() -> None:
    """n choices each bill their own output; above MAX_CHOICES (or not an int) it is a 400 on `n`."""
    s = size(chat(max_tokens=2_000, n=4, thinking={"type": "disabled"}), CHAT, LIMITS)
    assert (s.output, s.least_output) == (8_000, 4 * 256)
    assert s.per_choice_for(5_000) == 1_250
    for bad in (admission.MAX_CHOICES + 1, 0, "2", True):
        with pytest.raises(InvalidRequest) as err:
            size(chat(n=bad), CHAT, LIMITS)
        assert err.value.param == "n"
    with pytest.raises(InvalidRequest):
        size(chat(extra_body={"n": 40}), CHAT, LIMITS)


@pytest.mark.parametrize("value", [0, -1, 1.5, "100", True, 10**9])
def test_bad_output_caps_are_the_clients_400(value: object) -> None:
    """A cap that is not a positive integer in range names its field."""
    with pytest.raises(InvalidRequest) as err:
        size(chat(extra_body={"max_completion_tokens": value}), CHAT, LIMITS)
    assert err.value.param == "max_completion_tokens"


def test_image_tokens_follow_arks_formula() -> None:
    """min(ceil(w*h/784), 1312 low / 5120 high) from a data URL; the maximum for a remote URL."""
    def part(url: str, detail: str | None = None) -> dict[str, Any]:
        inner: dict[str, Any] = {"url": url} | ({"detail": detail} if detail else {})
        return {"type": "image_url", "image_url": inner}

    assert media.image_tokens(part(png(280, 280), "low")) == 100
    assert media.image_tokens(part(png(4000, 3000), "low")) == 1_338  # scaled to 1,048,576 px first
    assert media.image_tokens(part(png(4000, 3000), "high")) == 5_120
    assert media.image_tokens(part("https://example.invalid/a.png")) == 5_120  # detail unknown: high
    assert media.image_tokens(part("https://example.invalid/a.png", "low")) == 1_338
    base = size(chat([{"type": "text", "text": "what"}]), CHAT, LIMITS).input_tokens
    with_image = size(chat([{"type": "text", "text": "what"}, part(png(280, 280), "low")]), CHAT, LIMITS)
    assert with_image.input_tokens - base == 100


def _lenient(fmt: str) -> bytes:
    """A 4000x4000 image whose header tricks a strict reader into a small size while Pillow, a
    lenient decoder, decodes it whole (red-team, stop 37: guard and fake both said 1 token)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (4000, 4000), 0).save(buf, fmt)
    real = buf.getvalue()
    if fmt == "PNG":  # a 1x1 IHDR first; Pillow reads every IHDR, the last winning
        one = b"IHDR" + struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
        return real[:8] + struct.pack(">I", 13) + one + struct.pack(">I", zlib.crc32(one)) + real[8:]
    if fmt == "GIF":  # a 1x1 screen and a junk byte before the frame; Pillow skips the byte
        flags = real[10]
        start = 13 + (3 << ((flags & 7) + 1) if flags & 0x80 else 0)
        return real[:6] + struct.pack("<HH", 1, 1) + real[10:start] + b"\x00" + real[start:]
    # A 1x1 frame header first, then 67 KB of APP segments: the real one lies past 64 KiB.
    sof = b"\xff\xc0" + struct.pack(">H", 11) + b"\x08" + struct.pack(">HH", 1, 1) + b"\x01\x01\x11\x00"
    pad = (b"\xff\xe1" + struct.pack(">H", 65_002) + b"\x00" * 65_000
           + b"\xff\xe2" + struct.pack(">H", 2_002) + b"\x00" * 2_000)
    return real[:2] + sof + pad + real[2:]


@pytest.mark.parametrize("fmt", ["PNG", "GIF", "JPEG"])
def test_an_image_a_lenient_decoder_reads_larger_is_reserved_at_that_size(fmt: str) -> None:
    """Ark's formula for what Pillow reads (4000x4000, high: 5,120) bounds what the guard
    reserves and what the fake bills, whatever the header's first frame said."""
    from volc_quota_guard.fake import media as fake_media

    url = f"data:image/{fmt.lower()};base64," + base64.b64encode(_lenient(fmt)).decode()
    assert media.image_tokens({"type": "image_url", "image_url": {"url": url, "detail": "high"}}) == 5_120
    assert fake_media.image_tokens(url, "high") == 5_120

def test_video_and_unknown_parts_are_refused_unless_the_deployment_bounds_them() -> None:
    """A video by URL cannot be bounded: 400 naming the part, unless model_info gives a per-part bound."""
    video = chat([{"type": "video_url", "video_url": {"url": "https://example.invalid/v.mp4"}}])
    with pytest.raises(InvalidRequest) as err:
        size(video, CHAT, LIMITS)
    assert err.value.param == "messages[0].content[0]"
    bounded = Limits(None, 8_192, 0, 256, media_part_tokens=250_000)
    assert size(video, CHAT, bounded).input_tokens >= 250_000
    with pytest.raises(InvalidRequest):
        size(chat([{"type": "hologram", "data": "x"}]), CHAT, LIMITS)


def test_a_response_chain_is_reserved_at_its_recorded_size_or_the_context_window() -> None:
    """previous_response_id adds the stored conversation: as recorded, else the context window,
    else a 400 naming the field."""
    follow = {"input": "and then?", "previous_response_id": "resp_1", "max_output_tokens": 500}
    assert size(follow, RESPONSES, LIMITS, chain_tokens=22_000).input_tokens >= 22_000
    assert size(follow, RESPONSES, LIMITS).chain_tokens == 131_072
    with pytest.raises(InvalidRequest) as err:
        size(follow, RESPONSES, Limits(None, 8_192, 0, 256))
    assert err.value.param == "previous_response_id"
    assert size(follow, RESPONSES, LIMITS, 10).per_choice == 500  # max_output_tokens covers reasoning


def test_server_side_context_the_guard_never_saw_is_refused() -> None:
    """A `conversation` object is context Ark holds and the guard cannot size: 400."""
    with pytest.raises(InvalidRequest) as err:
        size({"input": "x", "conversation": {"id": "conv_1"}}, RESPONSES, LIMITS)
    assert err.value.param == "conversation"


def test_routes_the_guard_cannot_settle_are_refused() -> None:
    """Batches, generateContent and WebSocket sessions have no route: a 400 naming it."""
    for call_type in ("acreate_batch", "agenerate_content", "_aresponses_websocket", "atext_completion"):
        with pytest.raises(InvalidRequest) as err:
            admission.route_of(call_type)
        assert err.value.param == "route"


def test_responses_and_messages_inputs_are_counted() -> None:
    """Responses input items and instructions, Anthropic system blocks all count."""
    r = size({"input": [{"role": "user", "content": [{"type": "input_text", "text": "hi " * 300}]}],
              "instructions": "be brief " * 100}, RESPONSES, LIMITS)
    assert r.input_tokens > 400
    m = size({"messages": [{"role": "user", "content": "hello"}], "max_tokens": 100,
              "system": [{"type": "text", "text": "sys " * 200}]}, MESSAGES, LIMITS)
    assert m.input_tokens > 200 and m.per_choice == 100 + 8_192


def test_chinese_is_counted_at_least_one_token_per_character() -> None:
    """cl100k over-counts Chinese (safe for a reservation): never fewer tokens than characters."""
    text = "火山方舟免费额度保护" * 50
    assert size(chat(text), CHAT, LIMITS).input_tokens >= len(text)


def test_tools_and_tool_calls_add_tokens() -> None:
    """Tool definitions are part of the input."""
    tools = [{"type": "function", "function": {"name": "lookup_weather", "description": "x " * 50,
                                               "parameters": {"type": "object"}}}]
    assert size(chat("call f", tools=tools), CHAT, LIMITS).input_tokens > \
        size(chat("call f"), CHAT, LIMITS).input_tokens + 40


@pytest.mark.parametrize("messages", [None, [], "hi", [5], [{"content": "no role"}],
                                      [{"role": "user", "content": 5}],
                                      [{"role": "user", "content": [5]}]])
def test_malformed_chat_messages_are_rejected(messages: object) -> None:
    """Chat messages must be a non-empty list of role/content objects (checked before reserving)."""
    with pytest.raises(InvalidRequest):
        size({"messages": messages}, CHAT, LIMITS)


def test_model_max_output_reads_config_then_litellm_map_and_survives_unmapped_models() -> None:
    """`model_info.max_output_tokens` wins; LiteLLM's map is next; an unmapped model gives None."""
    assert estimate.model_max_output({"max_output_tokens": 777}, "anything") == 777
    assert estimate.model_max_output({}, "deepseek-v3-2-251201") == 32768
    assert estimate.model_max_output({}, "doubao-not-in-the-map-250101") is None


def test_no_client_cap_pins_arks_own_default_not_the_models_maximum() -> None:
    """Without max_tokens Ark caps the answer at 4,096: the guard pins (and holds) that, not the
    32,768 the model may produce; a client's own cap is kept up to the model's maximum."""
    limits = admission.limits_for({}, "deepseek-v3-2-251201", default_output=4_096, min_output=256)
    off = {"thinking": {"type": "disabled"}}
    assert size(chat("hi") | off, CHAT, limits).per_choice == 4_096
    assert size(chat("hi") | off | {"max_tokens": 20_000}, CHAT, limits).per_choice == 20_000
    assert size(chat("hi") | off | {"max_tokens": 90_000}, CHAT, limits).per_choice == 32_768
    small = admission.limits_for({"max_output_tokens": 1_000}, "m", default_output=4_096, min_output=256)
    assert size(chat("hi") | off, CHAT, small).per_choice == 1_000


def test_big_prompts_are_flagged_for_a_worker_thread() -> None:
    """Above THREAD_ABOVE_CHARS of text the count is worth a thread; a short prompt is not."""
    assert not estimate.is_big(chat("short"))
    assert estimate.is_big(chat("长" * (estimate.THREAD_ABOVE_CHARS + 1)))


def test_image_pixel_limit_moves_the_bounds_both_ways() -> None:
    """`min_pixels` scales a small image up (more tokens); `max_pixels` raises the cap for a URL."""
    small = {"type": "image_url", "image_url": {"url": png(28, 28), "detail": "low"},
             "image_pixel_limit": {"min_pixels": 784 * 500}}
    assert media.image_tokens(small) == 500
    remote = {"type": "image_url", "image_url": {"url": "https://example.invalid/a.png"},
              "image_pixel_limit": {"max_pixels": 784 * 9_000}}
    assert media.image_tokens(remote) == 9_000
    with pytest.raises(media.MediaError):
        media.image_tokens({"type": "image_url", "image_url": {"url": "x"},
                            "image_pixel_limit": {"max_pixels": "lots"}})


def test_conflicting_thinking_switches_count_as_thinking() -> None:
    """An off switch with another switch asking for thinking still gets the allowance."""
    on = size(chat(max_tokens=100, thinking={"type": "disabled"}, reasoning_effort="high"), CHAT, LIMITS)
    assert on.reasoning == 8_192


def test_a_jpeg_fill_byte_cannot_hide_its_real_size() -> None:
    """Fill bytes before a marker are skipped, and the largest frame before the scan counts
    (a decoy 1×1 frame further on does not lower an 8000×8000 image's tokens)."""
    real = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 8000, 8000, 1) + b"\x01\x11\x00"
    decoy = b"\xff\xfe\x00\x0d" + b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, 1, 1, 1)[:7]
    data = b"\xff\xd8\xff" + real + decoy + b"\x00" * 0xC000 + b"\xff\xc0" + struct.pack(
        ">HBHHB", 11, 8, 1, 1, 1) + b"\x01\x11\x00\xff\xd9"
    url = "data:image/jpeg;base64," + base64.b64encode(data).decode()
    assert media.image_tokens({"type": "image_url", "image_url": {"url": url, "detail": "high"}}) == 5_120


def test_red_team_shapes_are_sized_or_refused() -> None:
    """n on /v1/messages multiplies; extra_body.model, extra_body.stream, additional_drop_params,
    best_of, caching, built-in tools, item references and a non-string part type are 400s naming
    the field; a bare video item is refused."""
    m = size({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 1_000, "n": 4,
              "thinking": {"type": "disabled"}}, MESSAGES, LIMITS)
    assert m.output == 4_000
    with pytest.raises(InvalidRequest) as err:
        size({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10,
              "extra_body": {"n": 40}}, MESSAGES, LIMITS)
    assert err.value.param == "n"
    cases = {
        "extra_body.model": ({"input": "x", "extra_body": {"model": "other-260101"}}, RESPONSES),
        "extra_body.stream": (chat(extra_body={"stream": True}), CHAT),
        "additional_drop_params": (chat(additional_drop_params=["extra_body.max_completion_tokens"]), CHAT),
        "best_of": (chat(best_of=20), CHAT),
        "caching": ({"input": "x", "caching": {"type": "enabled"}}, RESPONSES),
        "tools[0]": ({"input": "x", "tools": [{"type": "web_search"}]}, RESPONSES),
        "input[0]": ({"input": [{"type": "item_reference", "id": "msg_1"}]}, RESPONSES),
        "messages[0].content[0]": (chat([{"type": ["text"], "text": "x"}]), CHAT),
    }
    for param, (body, route) in cases.items():
        with pytest.raises(InvalidRequest) as err:
            size(body, route, LIMITS)
        assert err.value.param == param, (param, err.value.param)
    with pytest.raises(InvalidRequest):
        size({"input": [{"type": "input_video", "video_url": "https://v.invalid/x.mp4"}]}, RESPONSES, LIMITS)


# ---- counting method per deployment -----------------------------------------------------------

ZH = "请把免费额度的规则总结成三条要点，并说明什么时候开始计费、怎样避免超额。" * 40


def _limits(model: str, **info: Any) -> Limits:
    return admission.limits_for(info, model, default_output=8_192, min_output=256)


def test_the_counting_method_follows_the_model_family_and_model_info() -> None:
    """deepseek* counts exactly, doubao* by ark-api, others cl100k; vqg_tokenizer overrides; a bad
    vqg_tokenizer is a 400 (InvalidRequest), never a crash or an unguarded pass."""
    assert _limits("deepseek-v4-flash-ga-260731").method == "deepseek"
    assert _limits("doubao-seed-2-1-pro-260628").method == "ark-api"
    assert _limits("ep-2026-x").method == "cl100k"
    assert _limits("ep-2026-x", vqg_tokenizer="deepseek").method == "deepseek"
    assert _limits("deepseek-v4", vqg_tokenizer="cl100k").method == "cl100k"
    with pytest.raises(InvalidRequest, match="quota guard misconfigured.*vqg_tokenizer"):
        _limits("deepseek-v4", vqg_tokenizer="gpt2")


def test_a_deepseek_deployment_counts_its_prompt_exactly() -> None:
    """Chat, Responses and Anthropic-style prompts of a DeepSeek deployment are counted with the
    DeepSeek-V4 tokenizer and template (fewer tokens than cl100k for Chinese); others keep cl100k."""

    ds, cl = _limits("deepseek-v4-flash-ga-260731"), _limits("ep-2026-x")
    messages = [{"role": "system", "content": "你是一个助手"}, {"role": "user", "content": ZH}]
    exact = counting.count_chat("deepseek", messages, None) + 2 * admission.EXACT_DRIFT_TOKENS
    body = {"model": "volcengine/m", "messages": messages}
    assert size(body, CHAT, ds).input_tokens == exact
    assert size(body, CHAT, cl).input_tokens == counting.cl100k_chat(messages, None) > exact * 1.3
    tools = [{"type": "function", "function": {"name": "look", "description": "查词 " * 30,
                                               "parameters": {"type": "object"}}}]
    assert size(body | {"tools": tools}, CHAT, ds).input_tokens == \
        counting.count_chat("deepseek", messages, tools) + 2 * admission.EXACT_DRIFT_TOKENS > exact + 224
    resp = {"model": "volcengine/m", "input": ZH, "instructions": "简短"}
    assert size(resp, RESPONSES, ds).input_tokens == \
        counting.deepseek_tokens(ZH) + counting.deepseek_tokens("简短") + 2 * admission.TEMPLATE_TOKENS
    anth = {"model": "volcengine/m", "system": ZH, "max_tokens": 10,
            "messages": [{"role": "user", "content": [{"type": "text", "text": ZH}]}]}
    assert size(anth, MESSAGES, ds).input_tokens == counting.deepseek_tokens(ZH) + \
        admission.TEMPLATE_TOKENS + admission.EXACT_DRIFT_TOKENS + \
        counting.count_chat("deepseek", [{"role": "user", "content": ZH}], None)


def test_fields_the_deepseek_template_does_not_render_are_bounded_by_their_bytes() -> None:
    """Message fields the DeepSeek template leaves out (tool_calls that are not a list of calls,
    a name) still count, by their bytes: an exact count never hides what Ark may read."""

    ds = _limits("deepseek-v4-flash-ga-260731")
    junk = "not a list " * 100
    odd = {"role": "assistant", "content": ZH, "tool_calls": junk, "name": "x" * 300}
    body = {"model": "volcengine/m", "messages": [{"role": "user", "content": "hi"}, odd]}
    exact = counting.count_chat("deepseek", body["messages"], None)
    assert size(body, CHAT, ds).input_tokens >= exact + len(junk) + 300
    calls = [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]
    good = {"role": "assistant", "content": ZH, "tool_calls": calls}
    body = {"model": "volcengine/m", "messages": [{"role": "user", "content": "hi"}, good]}
    assert size(body, CHAT, ds).input_tokens == counting.count_chat("deepseek", body["messages"], None) + \
        2 * admission.EXACT_DRIFT_TOKENS


def test_a_responses_item_that_is_not_a_message_is_bounded_by_its_whole_json() -> None:
    """An unknown type or role, a bare part, an unhashable role: Ark may read the whole item as
    text, so its JSON bounds it (before, `type: "x" + 26,000 characters` with empty content held 29)."""
    cl = _limits("m-1")
    odd_type = {"type": "x" + "A" * 26_000, "content": ""}
    odd_role = {"type": "message", "role": ["A" * 5_000], "content": "hi"}
    bare = {"type": "input_text", "text": "é" * 3_000}
    for item, least in ((odd_type, 26_000), (odd_role, 5_000), (bare, 6 * 3_000)):
        assert size({"input": [item]}, RESPONSES, cl).input_tokens >= least, item["type"]
    usual = {"type": "message", "role": "user", "content": "hi"}
    assert size({"input": [usual]}, RESPONSES, cl).input_tokens < 20


def test_several_text_parts_are_counted_one_by_one_with_their_joints() -> None:
    """Joined, 10,000 "\\n" parts merge into a few hundred tokens; Ark may bill each part and a
    separator between them. Empty parts count for their joints."""
    cl = _limits("m-1")
    for parts, least in (([""] * 20_000, 2 * 19_999), (["\n"] * 10_000, 10_000 + 2 * 9_999)):
        content = [{"type": "text", "text": t} for t in parts]
        assert size({"messages": [{"role": "user", "content": content}]}, CHAT, cl).input_tokens >= least


def test_images_at_any_depth_of_a_byte_bounded_part_are_reserved_at_arks_formula() -> None:
    """A URL image nested in a tool output's parts, or in a chat `tool_result`, is a few bytes of
    JSON that Ark may bill as thousands of tokens: its formula is reserved at every depth."""
    image = {"type": "input_image", "image_url": "https://img.invalid/a.png", "detail": "high"}
    one = media.image_tokens(image)
    assert one > 1_000
    for depth in range(4):
        nested: Any = [image]
        for _ in range(depth):
            nested = [{"type": "output_group", "content": nested}]
        item = {"type": "function_call_output", "call_id": "c", "output": nested}
        assert size({"input": [item]}, RESPONSES, LIMITS).input_tokens >= one, depth
    tool_result = {"type": "tool_result", "content": [{"type": "x", "content": [image]}]}
    assert size(chat([tool_result]), CHAT, LIMITS).input_tokens >= one
    bad = {"type": "tool_result", "content": [{"type": "image_url", "image_url": {}}]}
    with pytest.raises(InvalidRequest, match=r"messages\[0\]\.content\[0\]\.content\[0\]"):
        size(chat([bad]), CHAT, LIMITS)


@pytest.mark.parametrize("key", ["N", "Max_Completion_Tokens", "Background", "Previous_Response_Id",
                                 "CONVERSATION", "Messages"])
def test_a_field_in_another_case_is_refused_naming_it(key: str) -> None:
    """A JSON decoder that matches names regardless of case (Go's) reads `N: 16` as n: 16, or a
    second cap over the pinned one: the guard would not have sized it (red-team, stop 38)."""
    with pytest.raises(admission.InvalidRequest) as err:
        size(chat("hi", extra_body={key: 16}), CHAT, LIMITS)
    assert err.value.param == key and key.lower() in str(err.value)
    with pytest.raises(admission.InvalidRequest):
        size({"input": "hi", key: 16}, RESPONSES, LIMITS)
