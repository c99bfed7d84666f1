"""How many tokens a request may consume: its input (tokenized) plus its output cap.

The reservation is only as safe as this estimate, so every doubt rounds up: an unknown
tokenizer is cl100k (over-counts Chinese ~1.5x), a media part costs a generous constant, and
content the tokenizer cannot read is counted as its UTF-8 byte length (a token is never less
than one byte). Client numbers are validated here: a bad `max_tokens` is the client's error
(a clear 400), never a crash and never a way around the cap.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm  # noqa: E402  (after the env default above)

from .errors import QuotaGuardError  # noqa: E402

OUTPUT_PARAMS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
MAX_OUTPUT_TOKENS = 10_000_000  # above any Ark model's output; larger is a client error
THREAD_ABOVE_CHARS = 20_000  # tokenize bigger prompts off the event loop
TOKENIZER_MODEL = "volcengine/unknown"  # no Ark tokenizer in LiteLLM: resolves to cl100k
IMAGE_PART_TOKENS = 4_096  # Ark bills a high-detail image at up to a few thousand tokens
MEDIA_PART_TOKENS = 16_384  # video / audio / file parts: unknown, so generous
_TEXT_PARTS = {"text", "input_text", "output_text"}
_IMAGE_PARTS = {"image_url", "input_image", "image"}


class InvalidRequest(QuotaGuardError, ValueError):
    """The request's own fields are malformed (HTTP 400); `param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class OutputCap:
    """The most output tokens a request may produce, and where that number came from."""

    tokens: int
    source: str  # "request" | "model" | "default"


def warm_up() -> None:
    """Load the tokenizer now, so the first request does not pay for it (~200 ms)."""
    litellm.token_counter(model=TOKENIZER_MODEL, text="warm up 预热")


def requested_output(params: Mapping[str, Any]) -> int | None:
    """The client's output cap, validated; None when it set none.

    LiteLLM sends `max_completion_tokens` upstream as `max_tokens` and the two may both be
    present, so the larger one is what the upstream may be allowed to produce.
    """
    found: list[int] = []
    for name in OUTPUT_PARAMS:
        if name in params and params[name] is not None:
            found.append(_valid_cap(name, params[name]))
    extra = params.get("extra_body")
    if isinstance(extra, Mapping):  # extra_body is merged into the upstream JSON body
        for name in OUTPUT_PARAMS:
            if extra.get(name) is not None:
                found.append(_valid_cap(f"extra_body.{name}", extra[name]))
    return max(found) if found else None


def _valid_cap(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(name, f"{name} must be a positive integer, got {value!r:.40}")
    if value < 1:
        raise InvalidRequest(name, f"{name} must be a positive integer, got {value}")
    if value > MAX_OUTPUT_TOKENS:
        raise InvalidRequest(name, f"{name}={value} is larger than any model allows "
                                   f"(at most {MAX_OUTPUT_TOKENS:,})")
    return value


def validate_messages(params: Mapping[str, Any]) -> None:
    """A chat request's `messages` must be a non-empty list of role/content objects.

    Checked before reserving: LiteLLM turns a malformed message into an error that looks
    like a connection failure, which would keep the reservation as consumed.
    """
    messages = params.get("messages")
    if not isinstance(messages, list) or not messages:
        raise InvalidRequest("messages", "messages must be a non-empty list of message objects")
    for i, msg in enumerate(messages):
        if not isinstance(msg, Mapping) or not isinstance(msg.get("role"), str):
            raise InvalidRequest("messages", f"messages[{i}] must be an object with a string 'role'")
        content = msg.get("content")
        if content is None or isinstance(content, str):
            continue
        if not isinstance(content, list) or not all(isinstance(p, Mapping | str) for p in content):
            raise InvalidRequest("messages", f"messages[{i}].content must be a string, null or "
                                             f"a list of content parts")


def model_max_output(model_info: Mapping[str, Any] | None, upstream_model: str) -> int | None:
    """The deployment's max output: `model_info.max_output_tokens`, else LiteLLM's model map."""
    configured = (model_info or {}).get("max_output_tokens")
    if isinstance(configured, int) and not isinstance(configured, bool) and configured > 0:
        return configured
    try:
        found = litellm.get_max_tokens(f"volcengine/{upstream_model}")
    except Exception:  # noqa: BLE001  unmapped models raise a bare Exception
        return None
    return found if isinstance(found, int) and found > 0 else None


def output_cap(params: Mapping[str, Any], model_max: int | None, default: int) -> OutputCap:
    """The output to reserve: the client's cap (at most the model's), else the model's, else default."""
    asked = requested_output(params)
    if asked is not None:
        return OutputCap(min(asked, model_max) if model_max else asked, "request")
    if model_max:
        return OutputCap(model_max, "model")
    return OutputCap(default, "default")


def _byte_bound(obj: object) -> int:
    return len(json.dumps(obj, default=str, ensure_ascii=False).encode())


def _split_content(content: object) -> tuple[object, int]:
    """(text-only content for the tokenizer, tokens charged for media parts)."""
    if content is None or isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        return json.dumps(content, default=str, ensure_ascii=False), 0
    texts: list[str] = []
    media = 0
    for part in content:
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind in _IMAGE_PARTS:
            media += IMAGE_PART_TOKENS
        elif isinstance(part, str):
            texts.append(part)
        else:
            media += max(MEDIA_PART_TOKENS, _byte_bound(part))
    return "\n".join(texts), media


def _count_messages(messages: list[Any], tools: object) -> int:
    plain: list[dict[str, Any]] = []
    media = 0
    for msg in messages:
        if not isinstance(msg, Mapping):
            raise TypeError("message is not an object")
        text, extra = _split_content(msg.get("content"))
        media += extra
        clean = {k: v for k, v in msg.items() if k != "content"}
        clean["content"] = text if text is not None else ""
        plain.append(clean)
    tool_list = tools if isinstance(tools, list) and tools else None
    return litellm.token_counter(model=TOKENIZER_MODEL, messages=plain, tools=tool_list,
                                 use_default_image_token_count=True) + media


def _count_text(value: object) -> int:
    if isinstance(value, str):
        return litellm.token_counter(model=TOKENIZER_MODEL, text=value)
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return litellm.token_counter(model=TOKENIZER_MODEL, text=value)
    if isinstance(value, list) and all(isinstance(v, Mapping) for v in value):
        return _count_messages(list(value), None)  # Responses API input items
    return _byte_bound(value)


def count_input_sync(params: Mapping[str, Any]) -> int:
    """Input tokens of a chat / responses / completion / embedding request (never fails)."""
    total = 0
    messages = params.get("messages")
    if messages:
        try:
            if not isinstance(messages, list):
                raise TypeError("messages is not a list")
            total += _count_messages(messages, params.get("tools"))
        except Exception:  # noqa: BLE001  malformed content: count bytes, an upper bound
            total += _byte_bound(messages) + _byte_bound(params.get("tools") or [])
    elif params.get("tools"):
        total += _byte_bound(params.get("tools"))
    for name in ("system", "instructions", "input", "prompt"):
        value = params.get(name)
        if value:
            try:
                total += _count_text(value)
            except Exception:  # noqa: BLE001
                total += _byte_bound(value)
    return max(total, 1)


def _is_big(value: object, budget: int = THREAD_ABOVE_CHARS) -> int:
    """Remaining budget after walking `value`'s strings; <= 0 means big. Stops early."""
    if isinstance(value, str):
        return budget - len(value)
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, list | tuple):
        for item in value:
            budget = _is_big(item, budget)
            if budget <= 0:
                break
    return budget


async def count_input(params: Mapping[str, Any]) -> int:
    """`count_input_sync`, in a worker thread for big prompts (tiktoken releases the GIL)."""
    fields = [params.get(k) for k in ("messages", "tools", "input", "prompt", "system", "instructions")]
    if _is_big(fields) <= 0:
        return await asyncio.to_thread(count_input_sync, params)
    return count_input_sync(params)
