"""The fake Ark data plane: OpenAI-compatible ``POST /api/v3/chat/completions``.

The Bearer key picks the account, the body's ``model`` the pool (``account/model``). Usage
comes from the server defaults, overridden per request by a directive in the last user
message::

    [[fake prompt=1000 completion=500 cached=0 usage=missing delay=0.5 status=429 cut=2]]

``completion`` is capped at the request's ``max_completion_tokens`` / ``max_tokens`` (as a
real upstream stops there). A request that completes consumes prompt + completion from the
ledger at completion time — before the response (non-streaming) or before the final
chunk (streaming) — so a client that has read the answer sees the ledger already charged.
``cut=N`` ends a stream after N content chunks with no usage and no ``[DONE]``; the full
amount is still consumed (the upstream billed what it generated; assume the worst).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from .billing_api import Reply, json_reply
from .state import ChatRecord, FakeState

_DIRECTIVE_RE = re.compile(r"\[\[fake\b([^\]]*)\]\]")
_INT_KEYS = ("prompt", "completion", "cached", "status", "cut")
_ERRORS = {
    400: ("InvalidParameter", "BadRequest"),
    401: ("AuthenticationError", "Unauthorized"),
    403: ("AccountOverdueError", "Forbidden"),
    404: ("InvalidEndpointOrModel.NotFound", "NotFound"),
    429: ("RateLimitExceeded", "TooManyRequests"),
    500: ("InternalServiceError", "InternalServerError"),
    503: ("ServiceUnavailable", "ServiceUnavailable"),
}


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
    cached: int | None = None
    usage_missing: bool = False
    delay: float | None = None
    status: int | None = None
    cut: int | None = None


def openai_error(status: int, message: str) -> Reply:
    code, kind = _ERRORS.get(status, ("FakeError", "Error"))
    return json_reply(status, {"error": {"code": code, "message": message, "param": "",
                                         "type": kind}})


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts
        return " ".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return ""


def parse_directive(messages: list[Any]) -> Directive:
    """The ``[[fake …]]`` directive of the last user message; ValueError on a bad key/value."""
    last_user = next((m for m in reversed(messages)
                      if isinstance(m, dict) and m.get("role") == "user"), None)
    m = _DIRECTIVE_RE.search(_text(last_user.get("content")) if last_user else "")
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
            elif key == "delay":
                values["delay"] = float(value)
            elif key == "usage" and value in ("missing", "present"):
                values["usage_missing"] = value == "missing"
            else:
                raise ValueError
        except ValueError:
            raise ValueError(f"bad directive item {pair!r}") from None
    return Directive(**values)


def count_prompt_tokens(messages: list[Any]) -> int:
    """What a client-side tokenizer would say (cl100k via LiteLLM, offline)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm  # slow to import; only when a request relies on the default

    return int(litellm.token_counter(model="gpt-3.5-turbo", messages=messages))


def _cap(request: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(max_tokens, max_completion_tokens, the cap the upstream applies)."""
    got = []
    for name in ("max_tokens", "max_completion_tokens"):
        value = request.get(name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 0):
            raise ValueError(f"{name} must be a non-negative integer")
        got.append(value)
    present = [v for v in got if v is not None]
    return got[0], got[1], (min(present) if present else None)


def handle_chat(state: FakeState, header: Callable[[str], str | None],
                body: bytes) -> Reply | StreamReply:
    """Answer one chat completion request."""
    bearer = (header("authorization") or "").removeprefix("Bearer ").strip()
    account = state.account_by_api_key(bearer) if bearer else None
    if account is None:
        return openai_error(401, "The API key in the request is missing or invalid.")
    try:
        request = json.loads(body or b"{}")
        if not isinstance(request, dict):
            raise ValueError("the body must be a JSON object")
        model, messages = request.get("model"), request.get("messages")
        if not isinstance(model, str) or not model:
            raise ValueError("model is required")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        directive = parse_directive(messages)
        max_tokens, max_completion_tokens, cap = _cap(request)
    except ValueError as exc:
        return openai_error(400, str(exc))

    defaults = state.get_chat_defaults()
    pool = f"{account.name}/{model}"
    stream = bool(request.get("stream"))
    include_usage = stream and bool((request.get("stream_options") or {}).get("include_usage"))
    prompt = directive.prompt if directive.prompt is not None else defaults.prompt_tokens
    if prompt is None:
        prompt = count_prompt_tokens(messages)
    wanted = directive.completion if directive.completion is not None \
        else defaults.completion_tokens
    completion = wanted if cap is None else min(wanted, cap)
    cached = min(directive.cached if directive.cached is not None else defaults.cached_tokens,
                 prompt)
    consumed = prompt + completion - (0 if defaults.count_cached else cached)
    seq = state.next_chat_seq()

    def record(status: int, billed: int = 0, used: int = consumed) -> None:
        state.record_chat(ChatRecord(
            seq=seq, at_ms=state.now_ms(), account=account.name, model=model, pool=pool,
            stream=stream, include_usage=include_usage, max_tokens=max_tokens,
            max_completion_tokens=max_completion_tokens, prompt_tokens=prompt,
            completion_tokens=completion, cached_tokens=cached, consumed=used, billed=billed,
            status=status, usage_reported=(status == 200 and not directive.usage_missing
                                           and (include_usage or not stream)
                                           and not directive.cut),
        ))

    delay = directive.delay if directive.delay is not None else defaults.delay_s
    if delay > 0:
        time.sleep(delay)
    if directive.status is not None and directive.status >= 400:
        record(directive.status, used=0)
        return openai_error(directive.status, f"fake upstream error {directive.status}")

    usage = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
        "completion_tokens_details": {"reasoning_tokens": 0},
    }
    finish = "length" if cap is not None and wanted > cap else "stop"
    text = f"Fake reply from {model}: {prompt} prompt + {completion} completion tokens."
    base = {"id": f"chatcmpl-fake-{seq}", "created": state.now_ms() // 1000, "model": model}

    def charge() -> None:
        billed = state.consume(pool, consumed).billed
        record(200, billed)

    if not stream:
        charge()
        answer = base | {
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish, "logprobs": None}],
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

        yield chunk([{"index": 0, "delta": {"role": "assistant", "content": ""},
                      "finish_reason": None}])
        pieces = re.findall(r"\S+\s*", text)
        if directive.cut is not None:
            pieces = pieces[: directive.cut]
        for piece in pieces:
            yield chunk([{"index": 0, "delta": {"content": piece}, "finish_reason": None}])
        charge()
        if directive.cut is not None:
            return
        yield chunk([{"index": 0, "delta": {}, "finish_reason": finish}])
        if include_usage and not directive.usage_missing:
            yield chunk([], usage=usage)
        yield b"data: [DONE]\n\n"

    return StreamReply(frames(), cut=directive.cut is not None)
