"""The fake Ark data plane: chat completions and embeddings (Responses: ``responses_api.py``).

``POST /api/v3/chat/completions`` and ``POST /api/v3/embeddings``, OpenAI-compatible. The
Bearer key picks the account, the body's ``model`` the pool (``account/model``). The fake is
the guard's test oracle, so it bills at least what Ark would (docs/gate.md, "What a request
may bill"), taking the more expensive reading wherever Ark's behaviour is uncertain.

Usage comes from the server defaults (``ChatDefaults``), overridden per request by a
directive in the last user message (chat), the input text (Responses) or any input string
(embeddings)::

    [[fake prompt=1000 completion=500 reasoning=3000 cached=0 media=200000
            usage=missing delay=0.5 status=429 cut=2 pace=0.5]]

Chat billing rules:

- **Prompt** = text + media. Text is the dearer of ``litellm.token_counter`` (cl100k) over
  every message's text parts, the ``tools`` and ``response_format``'s JSON, and the Doubao count
  below (an unknown model's tokenizer is unknown: the fake takes the reading that bills more) —
  except for models named
  ``deepseek*``, counted like Ark counts them and deliberately *more expensive* than the guard's
  exact model: the DeepSeek-V4 tokenizer over the V4 chat template (``counting.count_chat``),
  then a drift the guard is not told about, +3% on the count and +2 tokens per message
  (``DEEPSEEK_DRIFT_PPM``, ``DEEPSEEK_DRIFT_PER_MESSAGE``). Models named ``doubao*`` are
  counted by the fake's one hidden *Doubao tokenizer* (``doubao_tokens``: the DeepSeek-V4
  tokenizer's count of the text, which ``POST /api/v3/tokenization`` also answers with) over
  each message's text and other fields (JSON) and the tools' JSON, then a chat template and a
  version drift the tokenization API does not show: +``DOUBAO_TEMPLATE_PER_MESSAGE`` per message
  (and once for the tools) and +4% (``DOUBAO_DRIFT_PPM``); ``doubao_control(fake)`` changes
  both for one fake. ``prompt=`` (or the ``prompt_tokens`` default) replaces only this text
  count. Media is added on top: images by Ark's formula (``media.py``), each video/audio/file
  part ``media=`` tokens (default ``media_tokens``, 200,000). An unknown content part type is a 400.
- **Thinking** is on unless the request switches it off: ``thinking: {"type": "disabled"}``
  or ``reasoning_effort: "minimal"``, with no switch asking for it (``thinking.type``
  ``enabled``/``auto`` or an effort other than ``minimal`` win over an off switch). When on,
  each choice produces ``reasoning=`` tokens (default ``reasoning_tokens``, 0) besides the
  answer (``completion=``, default ``completion_tokens``).
- **Caps**: ``max_tokens`` caps the answer only; ``max_completion_tokens`` (0…65,536) caps
  reasoning + answer (reasoning first, the answer gets the rest); both at once is a 400.
  With neither, the answer is capped at 4,096 (Ark's ``max_tokens`` default), reasoning not.
- ``n`` (1…128) choices each produce the full reasoning + answer: output × n; Ark does not
  document `n`, so each is taken to read (and bill) the prompt too: prompt × n.
- ``usage.completion_tokens`` = n × (answer + reasoning);
  ``completion_tokens_details.reasoning_tokens`` = n × reasoning.

Embeddings: prompt = the dearer of cl100k and the Doubao count (``deepseek*``: DeepSeek's + 3%;
``doubao*``: the Doubao tokenizer's + 4%) of every input string
(a token array counts its length), or ``prompt=``; no output. Every request that completes
consumes (prompt + output − cached when ``count_cached`` is off) from the ledger at
completion time — before the response
(non-streaming) or before the final chunk (streaming) — so a client that has read the answer
sees the ledger already charged; beyond the free balance it is billed. ``cut=N`` ends a
stream after N content chunks with no usage and no ``[DONE]``; the full amount is still
consumed (the upstream billed what it generated). ``pace=S`` waits S seconds before each
streamed content chunk; a client that leaves mid-stream does not stop the generation, which is
charged when it ends (the dearer reading: Ark runs a call on). ``status=`` answers that error
and consumes nothing.
"""

from __future__ import annotations

import base64
import json
import os
import re
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from .billing_api import Reply, json_reply
from .media import IMAGE_PARTS, MEDIA_PARTS, TEXT_PARTS, image_tokens, part_image, part_text
from .state import ChatRecord, FakeAccount, FakeState

_DIRECTIVE_RE = re.compile(r"\[\[fake\b([^\]]*)\]\]")
_INT_KEYS = ("prompt", "completion", "reasoning", "cached", "media", "status", "cut")
_ERRORS = {
    400: ("InvalidParameter", "BadRequest"),
    401: ("AuthenticationError", "Unauthorized"),
    403: ("AccountOverdueError", "Forbidden"),
    404: ("InvalidEndpointOrModel.NotFound", "NotFound"),
    429: ("RateLimitExceeded", "TooManyRequests"),
    500: ("InternalServiceError", "InternalServerError"),
    503: ("ServiceUnavailable", "ServiceUnavailable"),
}
DEFAULT_MAX_TOKENS = 4096  # Ark's max_tokens default: caps the answer when no cap is sent
MAX_COMPLETION_TOKENS = 65_536
MAX_N = 128
THINKING_TYPES = ("enabled", "disabled", "auto")
REASONING_EFFORTS = ("minimal", "low", "medium", "high")


@dataclass(frozen=True)
class StreamReply:
    """An SSE answer: ``frames`` are written as they come; ``cut`` drops the connection
    at the end instead of finishing the response."""

    frames: Iterator[bytes]
    cut: bool = False


@dataclass(frozen=True)
class Directive:
    prompt: int | None = None
    completion: int | None = None
    reasoning: int | None = None
    cached: int | None = None
    media: int | None = None
    usage_missing: bool = False
    delay: float | None = None
    status: int | None = None
    cut: int | None = None
    pace: float = 0.0  # seconds before each streamed content chunk (Ark generating slowly)


def openai_error(status: int, message: str, code: str | None = None,
                 param: str = "") -> Reply:
    default_code, kind = _ERRORS.get(status, ("FakeError", "Error"))
    return json_reply(status, {"error": {"code": code or default_code, "message": message,
                                         "param": param, "type": kind}})


def authenticate(state: FakeState, header: Callable[[str], str | None]) -> FakeAccount | None:
    bearer = (header("authorization") or "").removeprefix("Bearer ").strip()
    return state.account_by_api_key(bearer) if bearer else None


def load_body(body: bytes) -> dict[str, Any]:
    request = json.loads(body or b"{}")
    if not isinstance(request, dict):
        raise ValueError("the body must be a JSON object")
    model = request.get("model")
    if not isinstance(model, str) or not model:
        raise ValueError("model is required")
    return request


def text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(part_text(p) for p in content if isinstance(p, dict))
    return ""


def parse_directive_text(text: str) -> Directive:
    """The ``[[fake …]]`` directive in ``text``; ValueError on a bad key/value."""
    m = _DIRECTIVE_RE.search(text)
    if not m:
        return Directive()
    values: dict[str, Any] = {}
    for pair in m.group(1).split():
        key, sep, value = pair.partition("=")
        if not sep:
            raise ValueError(f"directive item {pair!r} is not key=value")
        try:
            if key in _INT_KEYS:
                values[key] = int(value)
            elif key in ("delay", "pace"):
                values[key] = float(value)
            elif key == "usage" and value in ("missing", "present"):
                values["usage_missing"] = value == "missing"
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"bad directive item {pair!r}") from None
    return Directive(**values)


def parse_directive(messages: list[Any]) -> Directive:
    """The ``[[fake …]]`` directive of the last user message; ValueError on a bad key/value."""
    last_user = next((m for m in reversed(messages)
                      if isinstance(m, dict) and m.get("role") == "user"), None)
    return parse_directive_text(text_of(last_user.get("content")) if last_user else "")


def _litellm() -> Any:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm  # slow to import; only when a request relies on counting

    return litellm


# DeepSeek models: the fake counts more than the guard's exact count, on purpose. The guard
# renders the V4 chat template and counts it with the DeepSeek-V4 tokenizer; the fake does
# the same, then adds what the guard is not told: a template that costs DEEPSEEK_DRIFT_PER_MESSAGE
# more tokens per message and a tokenizer version that counts DEEPSEEK_DRIFT_PPM more text. Both
# are inside what the guard's 1.1 floor is meant to cover on messages of ~30+ tokens, so a
# guard that under-counts DeepSeek, or floors it below that, fails the tests.
DEEPSEEK_DRIFT_PER_MESSAGE = 2
DEEPSEEK_DRIFT_PPM = 1_030_000  # +3%


# Doubao models: Ark's Doubao tokenizer is not public, so the fake has one hidden stand-in,
# `doubao_tokens` (the DeepSeek-V4 tokenizer's count of the text), used both to bill Doubao
# prompts and to answer POST /api/v3/tokenization. Billing adds what that API does not show and
# the guard is not told: a chat template of DOUBAO_TEMPLATE_PER_MESSAGE tokens per message (and
# once for the tools) and a tokenizer version that counts DOUBAO_DRIFT_PPM more. Both are inside
# what the guard's exact count covers (8 per message, x 1.1), so a guard that skips the template
# (short messages) or drops the floor (long ones) fails the tests.
DOUBAO_TEMPLATE_PER_MESSAGE = 5
DOUBAO_DRIFT_PPM = 1_040_000  # +4%


@dataclass
class DoubaoControl:
    """One fake's hidden Doubao template and drift (tests raise them to watch the guard learn)."""

    template_tokens: int = DOUBAO_TEMPLATE_PER_MESSAGE
    drift_ppm: int = DOUBAO_DRIFT_PPM


_doubao: weakref.WeakKeyDictionary[Any, DoubaoControl] = weakref.WeakKeyDictionary()
_doubao_lock = threading.Lock()


def doubao_control(state: Any) -> DoubaoControl:
    """The hidden Doubao template and drift of this fake (a FakeState / FakeVolcengine)."""
    with _doubao_lock:
        return _doubao.setdefault(state, DoubaoControl())


def is_deepseek(model: str | None) -> bool:
    """Whether the fake counts `model` with the DeepSeek tokenizer (a name starting `deepseek`)."""
    return bool(model) and str(model).rsplit("/", 1)[-1].lower().startswith("deepseek")


def is_doubao(model: str | None) -> bool:
    """Whether the fake counts `model` with its hidden Doubao tokenizer (a name starting `doubao`)."""
    return bool(model) and str(model).rsplit("/", 1)[-1].lower().startswith("doubao")


def doubao_tokens(text: str) -> int:
    """The fake's hidden Doubao tokenizer: what its tokenization endpoint answers for `text`."""
    from .. import counting

    return counting.deepseek_tokens(text)


def _drift(tokens: int, messages: int = 0) -> int:
    return -(-tokens * DEEPSEEK_DRIFT_PPM // 1_000_000) + DEEPSEEK_DRIFT_PER_MESSAGE * messages


def _doubao_text(content: Any) -> int:
    """Doubao tokens of one message's content: text parts each counted, +1 per join (bill more)."""
    if content is None:
        return 0
    if isinstance(content, str):
        return doubao_tokens(content)
    if isinstance(content, list):
        texts = [part_text(p) if isinstance(p, dict) else str(p) for p in content]
        return max(doubao_tokens("\n".join(texts)), sum(map(doubao_tokens, texts))) + max(0, len(texts) - 1)
    return doubao_tokens(json.dumps(content, ensure_ascii=False, default=str))


def doubao_prompt_tokens(messages: list[Any], tools: list[Any] | None, control: DoubaoControl) -> int:
    """Ark's Doubao bill of a prompt: the hidden tokenizer over each message's text and its other
    fields (JSON, role aside) and the tools' JSON, + drift, + the template per message."""
    text = 0
    for msg in messages:
        if not isinstance(msg, dict):
            raise TypeError("message is not an object")
        text += _doubao_text(msg.get("content"))
        rest = {k: v for k, v in msg.items() if k not in ("role", "content")}
        if rest:
            text += doubao_tokens(json.dumps(rest, ensure_ascii=False, default=str))
    if tools:
        text += doubao_tokens(json.dumps(tools, ensure_ascii=False, default=str))
    return (-(-text * control.drift_ppm // 1_000_000)
            + control.template_tokens * (len(messages) + (1 if tools else 0)))


def count_prompt_tokens(messages: list[Any], tools: list[Any] | None = None,
                        model: str | None = None, state: Any = None) -> int:
    """Ark's count of a prompt: DeepSeek models by the DeepSeek-V4 tokenizer and template plus
    the fake's hidden drift; Doubao models by the hidden Doubao tokenizer plus its template and
    drift (`state`'s `doubao_control`, else the defaults); any other model, whose tokenizer is
    unknown, by the dearer of that Doubao count and cl100k's (via LiteLLM, offline)."""
    try:
        if is_deepseek(model):
            from .. import counting

            return _drift(counting.count_chat("deepseek", messages, tools), len(messages))
        control = doubao_control(state) if state is not None else DoubaoControl()
        doubao = doubao_prompt_tokens(messages, tools, control)
        if is_doubao(model):
            return doubao
        return max(doubao, int(_litellm().token_counter(model="gpt-3.5-turbo", messages=messages,
                                                        tools=tools or None)))
    except Exception as exc:  # a message LiteLLM cannot read: Ark would not either
        raise ValueError(f"unreadable messages or tools: {exc}") from None


def count_text_tokens(text: str, model: str | None = None, state: Any = None) -> int:
    """Ark's count of plain text (DeepSeek models: the DeepSeek-V4 tokenizer + the drift;
    Doubao models: the hidden Doubao tokenizer + its drift; others: the dearer of that and
    cl100k's)."""
    if not text:
        return 0
    if is_deepseek(model):
        from .. import counting

        return _drift(counting.deepseek_tokens(text))
    control = doubao_control(state) if state is not None else DoubaoControl()
    doubao = -(-doubao_tokens(text) * control.drift_ppm // 1_000_000)
    if is_doubao(model):
        return doubao
    return max(doubao, int(_litellm().token_counter(model="gpt-3.5-turbo", text=text)))


# Request fields Ark renders into the prompt besides the messages and tools: their JSON is
# billed as text (the dearer reading: Ark's template for them is not documented). A red-team
# pass found the fake billed 18 tokens for 20 legacy functions the guard reserved 120,990 for.
PROMPT_FIELDS = ("functions", "function_call", "tool_choice", "response_format", "text",
                 "context_management")
# Message fields DeepSeek's V4 template renders (its count above); every other field of a
# message (a name, an assistant's refusal or audio, reasoning outside an assistant turn) is
# billed as its JSON: the dearer reading, as for Doubao (a red-team pass, stop 37, found the
# fake billed 0 for them).
RENDERED_FIELDS = frozenset({"role", "content", "tool_calls"})


def extra_prompt_tokens(request: dict[str, Any], messages: list[Any], model: str | None,
                        state: Any = None) -> int:
    """Tokens of `PROMPT_FIELDS` that are objects or lists (a named tool choice, a schema) and,
    for DeepSeek models, of each message's fields the DeepSeek count does not read (JSON)."""
    parts = [json.dumps(request[f], ensure_ascii=False) for f in PROMPT_FIELDS
             if isinstance(request.get(f), (dict, list))]
    if is_deepseek(model):
        for m in messages:
            if not isinstance(m, dict):
                continue
            read = RENDERED_FIELDS | ({"reasoning_content"} if m.get("role") == "assistant" else set())
            rest = {k: v for k, v in m.items() if k not in read and v is not None}
            if rest:
                parts.append(json.dumps(rest, ensure_ascii=False, default=str))
    return count_text_tokens("\n".join(parts), model, state) if parts else 0


def split_content(content: Any, media_per_part: int) -> tuple[Any, int]:
    """(the content's text parts only, the media tokens of its other parts)."""
    if not isinstance(content, list):
        return content, 0
    texts: list[Any] = []
    media = 0
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if isinstance(part, str):
            texts.append({"type": "text", "text": part})
        elif kind in TEXT_PARTS:
            texts.append({"type": "text", "text": part_text(part)})
        elif kind in IMAGE_PARTS:
            media += image_tokens(*part_image(part))
        elif kind in MEDIA_PARTS:
            media += media_per_part
        else:
            raise ValueError(f"unknown content part type {kind!r}")
    return texts, media


def thinking_on(thinking: Any, effort: Any) -> bool:
    """Ark's default is thinking on; off only when asked and nothing asks for it."""
    kind = None
    if thinking is not None:
        if not isinstance(thinking, dict) or thinking.get("type") not in THINKING_TYPES:
            raise ValueError(f"thinking.type must be one of {THINKING_TYPES}")
        kind = thinking["type"]
    if effort is not None and effort not in REASONING_EFFORTS:
        raise ValueError(f"reasoning effort must be one of {REASONING_EFFORTS}")
    off = kind == "disabled" or effort == "minimal"
    on = kind in ("enabled", "auto") or effort in ("low", "medium", "high")
    return on or not off


def int_field(request: dict[str, Any], name: str, low: int, high: int | None) -> int | None:
    value = request.get(name)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < low \
            or (high is not None and value > high):
        bound = f"{low}…{high}" if high is not None else f">= {low}"
        raise ValueError(f"{name} must be an integer {bound}")
    return value


@dataclass(frozen=True)
class Output:
    """One choice's output: the answer and the reasoning before it."""

    answer: int
    reasoning: int
    truncated: bool


def split_output(wanted: int, reasoning: int, *, answer_cap: int | None,
                 total_cap: int | None) -> Output:
    """Reasoning first (bounded only by ``total_cap``), then the answer gets what is left."""
    r = reasoning if total_cap is None else min(reasoning, total_cap)
    a = wanted if answer_cap is None else min(wanted, answer_cap)
    if total_cap is not None:
        a = min(a, total_cap - r)
    return Output(a, r, a < wanted or r < reasoning)


def consumed_tokens(state: FakeState, prompt: int, output: int, cached: int) -> int:
    return prompt + output - (0 if state.get_chat_defaults().count_cached else cached)


def sleep_for(directive: Directive, default: float) -> None:
    delay = directive.delay if directive.delay is not None else default
    if delay > 0:
        time.sleep(delay)


# ----------------------------------------------------------------------------- chat


@dataclass(frozen=True)
class _ChatBill:
    prompt: int
    media: int
    output: Output
    n: int
    cached: int
    thinking: bool


def _chat_bill(state: FakeState, request: dict[str, Any], directive: Directive) -> _ChatBill:
    messages = request["messages"]
    defaults = state.get_chat_defaults()
    per_part = directive.media if directive.media is not None else defaults.media_tokens
    text_messages, media = [], 0
    for message in messages:
        if not isinstance(message, dict):
            raise ValueError("each message must be an object")
        content, tokens = split_content(message.get("content"), per_part)
        text_messages.append(message | {"content": content} if "content" in message else message)
        media += tokens
    tools = request.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ValueError("tools must be a list")
    text = directive.prompt if directive.prompt is not None else defaults.prompt_tokens
    if text is None:
        model = request.get("model")
        text = count_prompt_tokens(text_messages, tools, model, state) \
            + extra_prompt_tokens(request, text_messages, model, state)
    max_tokens = int_field(request, "max_tokens", 0, None)
    max_completion = int_field(request, "max_completion_tokens", 0, MAX_COMPLETION_TOKENS)
    if max_tokens is not None and max_completion is not None:
        raise ValueError("max_tokens and max_completion_tokens cannot be set at the same time")
    n = int_field(request, "n", 1, MAX_N) or 1
    thinking = thinking_on(request.get("thinking"), request.get("reasoning_effort"))
    wanted = directive.completion if directive.completion is not None \
        else defaults.completion_tokens
    reasoning = directive.reasoning if directive.reasoning is not None \
        else defaults.reasoning_tokens
    answer_cap = max_tokens if max_tokens is not None else (
        DEFAULT_MAX_TOKENS if max_completion is None else None)
    output = split_output(wanted, reasoning if thinking else 0, answer_cap=answer_cap,
                          total_cap=max_completion)
    prompt = (text + media) * n  # each choice an inference that reads the prompt (dearer reading)
    cached = min(directive.cached if directive.cached is not None else defaults.cached_tokens,
                 prompt)
    return _ChatBill(prompt, media, output, n, cached, thinking)


def handle_chat(state: FakeState, header: Callable[[str], str | None],
                body: bytes) -> Reply | StreamReply:
    """Answer one chat completion request."""
    account = authenticate(state, header)
    if account is None:
        return openai_error(401, "The API key in the request is missing or invalid.")
    try:
        request = load_body(body)
        messages = request.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        directive = parse_directive(messages)
        bill = _chat_bill(state, request, directive)
    except ValueError as exc:
        return openai_error(400, str(exc))

    defaults = state.get_chat_defaults()
    model: str = request["model"]
    pool = f"{account.name}/{model}"
    stream = bool(request.get("stream"))
    include_usage = stream and bool((request.get("stream_options") or {}).get("include_usage"))
    out, n = bill.output, bill.n
    completion = n * (out.answer + out.reasoning)
    consumed = consumed_tokens(state, bill.prompt, completion, bill.cached)
    seq = state.next_chat_seq()

    def record(status: int, billed: int = 0, used: int = consumed) -> None:
        state.record_chat(ChatRecord(
            seq=seq, at_ms=state.now_ms(), account=account.name, model=model, pool=pool,
            stream=stream, include_usage=include_usage, max_tokens=request.get("max_tokens"),
            max_completion_tokens=request.get("max_completion_tokens"),
            prompt_tokens=bill.prompt, completion_tokens=completion, cached_tokens=bill.cached,
            consumed=used, billed=billed, status=status,
            usage_reported=(status == 200 and not directive.usage_missing
                            and (include_usage or not stream) and not directive.cut),
            n=n, thinking=bill.thinking, reasoning_tokens=n * out.reasoning,
            media_tokens=bill.media,
        ))

    sleep_for(directive, defaults.delay_s)
    if directive.status is not None and directive.status >= 400:
        record(directive.status, used=0)
        return openai_error(directive.status, f"fake upstream error {directive.status}")

    usage = {
        "prompt_tokens": bill.prompt,
        "completion_tokens": completion,
        "total_tokens": bill.prompt + completion,
        "prompt_tokens_details": {"cached_tokens": bill.cached},
        "completion_tokens_details": {"reasoning_tokens": n * out.reasoning},
    }
    finish = "length" if out.truncated else "stop"
    text = (f"Fake reply from {model}: {bill.prompt} prompt + {completion} completion tokens.")
    thought = f"Fake reasoning: {out.reasoning} tokens." if out.reasoning else ""
    base = {"id": f"chatcmpl-fake-{seq}", "created": state.now_ms() // 1000, "model": model}

    def charge() -> None:
        billed = state.consume(pool, consumed).billed
        record(200, billed)

    if not stream:
        charge()
        message: dict[str, Any] = {"role": "assistant", "content": text}
        if thought:
            message["reasoning_content"] = thought
        answer = base | {
            "object": "chat.completion",
            "choices": [{"index": i, "message": message, "finish_reason": finish,
                         "logprobs": None} for i in range(n)],
        }
        if not directive.usage_missing:
            answer["usage"] = usage
        return json_reply(200, answer)

    def frames() -> Iterator[bytes]:
        def chunk(choices: list[Any], **extra: Any) -> bytes:
            obj = base | {"object": "chat.completion.chunk", "choices": choices} | extra
            if include_usage and "usage" not in obj:
                obj["usage"] = None
            return b"data: " + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n"

        pieces = [("reasoning_content", p) for p in re.findall(r"\S+\s*", thought)]
        pieces += [("content", p) for p in re.findall(r"\S+\s*", text)]
        left = directive.cut
        for i in range(n):
            yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                          "finish_reason": None}])
            for key, piece in pieces:
                if left is not None:
                    if left <= 0:
                        break
                    left -= 1
                if directive.pace > 0:
                    time.sleep(directive.pace)
                yield chunk([{"index": i, "delta": {key: piece}, "finish_reason": None}])
        charge()
        if directive.cut is not None:
            return
        for i in range(n):
            yield chunk([{"index": i, "delta": {}, "finish_reason": finish}])
        if include_usage and not directive.usage_missing:
            yield chunk([], usage=usage)
        yield b"data: [DONE]\n\n"

    return StreamReply(frames(), cut=directive.cut is not None)


# ----------------------------------------------------------------------------- embeddings


def _embedding_inputs(value: Any) -> list[str | list[int]]:
    """Ark's ``input``: a string, a token array, or a list of either; ValueError otherwise."""
    def token_array(v: Any) -> bool:
        return isinstance(v, list) and bool(v) and all(
            isinstance(t, int) and not isinstance(t, bool) for t in v)

    if isinstance(value, str) or token_array(value):
        return [value]
    if isinstance(value, list) and value and all(isinstance(v, str) or token_array(v)
                                                 for v in value):
        return list(value)
    raise ValueError("input must be a string, a token array or a non-empty list of them")


def _vector(seed: int, dims: int = 8) -> list[float]:
    return [round(((seed * 2654435761 + i * 40503) % 1000) / 1000 - 0.5, 3) for i in range(dims)]


def handle_embeddings(state: FakeState, header: Callable[[str], str | None],
                      body: bytes) -> Reply:
    """Answer one embeddings request: usage is the input's tokens, no output."""
    account = authenticate(state, header)
    if account is None:
        return openai_error(401, "The API key in the request is missing or invalid.")
    try:
        request = load_body(body)
        inputs = _embedding_inputs(request.get("input"))
        strings = [v for v in inputs if isinstance(v, str)]
        directive = next((d for d in map(parse_directive_text, strings) if d != Directive()),
                         Directive())
        fmt = request.get("encoding_format")
        if fmt not in (None, "float", "base64"):
            raise ValueError("encoding_format must be float or base64")
    except ValueError as exc:
        return openai_error(400, str(exc))
    defaults = state.get_chat_defaults()
    model: str = request["model"]
    pool = f"{account.name}/{model}"
    if directive.prompt is not None:
        prompt = directive.prompt
    else:
        prompt = sum(len(v) if isinstance(v, list) else count_text_tokens(v, model, state)
                     for v in inputs)
    seq = state.next_chat_seq()
    record = ChatRecord(
        seq=seq, at_ms=state.now_ms(), account=account.name, model=model, pool=pool,
        stream=False, include_usage=False, max_tokens=None, max_completion_tokens=None,
        prompt_tokens=prompt, completion_tokens=0, cached_tokens=0, consumed=prompt, billed=0,
        status=200, usage_reported=not directive.usage_missing, endpoint="embeddings")
    sleep_for(directive, defaults.delay_s)
    if directive.status is not None and directive.status >= 400:
        state.record_chat(replace(record, status=directive.status, consumed=0,
                                  usage_reported=False))
        return openai_error(directive.status, f"fake upstream error {directive.status}")
    billed = state.consume(pool, prompt).billed
    state.record_chat(replace(record, billed=billed, at_ms=state.now_ms()))
    data = []
    for i in range(len(inputs)):
        vector = _vector(seq * 1000 + i)
        embedding: Any = vector if fmt != "base64" else base64.b64encode(
            struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"object": "embedding", "index": i, "embedding": embedding})
    answer: dict[str, Any] = {"id": f"embd-fake-{seq}", "object": "list", "model": model,
                              "created": state.now_ms() // 1000, "data": data}
    if not directive.usage_missing:
        answer["usage"] = {"prompt_tokens": prompt, "total_tokens": prompt}
    return json_reply(200, answer)
