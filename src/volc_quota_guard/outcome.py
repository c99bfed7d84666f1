"""What a finished or failed upstream call consumed, as far as we can know.

Two jobs kept apart: the *guard* needs a number to settle, and keeps the
reservation when it has none; *telemetry* records where the number came from and never
invents one. `0/0` usage on a stream means the usage frame was missing, not a free call.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Literal

import httpx
import litellm

Source = Literal["measured", "estimated", "unavailable"]
FailureAction = Literal["release", "keep"]

# Failures of the connect phase: the request body never reached the upstream.
_CONNECT_ERRORS: tuple[type[BaseException], ...] = (
    httpx.ConnectError, httpx.ConnectTimeout, ConnectionRefusedError, socket.gaierror)
try:
    import aiohttp

    _CONNECT_ERRORS += (aiohttp.ClientConnectorError,)
except ImportError:  # pragma: no cover - LiteLLM's proxy extras ship aiohttp
    pass


@dataclass(frozen=True)
class UsageReading:
    """Tokens one call consumed, and whether they were measured, estimated, or unknown."""

    source: Source
    tokens: int | None  # None when unavailable
    prompt: int = 0
    completion: int = 0
    cached: int = 0


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _field(obj: object, name: str) -> object:
    return obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)


def read_usage(response: object, estimated: bool = False) -> UsageReading:
    """Usage of a response (chat, responses or completion shapes).

    `estimated` marks LiteLLM's local reconstruction after a client disconnect.
    Prompt tokens include cached ones (OpenAI semantics), and a cache hit draws on the free
    quota like any input (ARK.md §2): they are counted whole.
    """
    usage = _field(response, "usage")
    if usage is None:
        return UsageReading("unavailable", None)
    prompt = _int(_field(usage, "prompt_tokens")) or _int(_field(usage, "input_tokens"))
    completion = _int(_field(usage, "completion_tokens")) or _int(_field(usage, "output_tokens"))
    details = _field(usage, "prompt_tokens_details") or _field(usage, "input_tokens_details")
    cached = min(_int(_field(details, "cached_tokens")), prompt) if details is not None else 0
    if prompt + completion == 0:
        return UsageReading("unavailable", None)
    tokens = prompt + completion
    return UsageReading("estimated" if estimated else "measured", tokens, prompt, completion, cached)


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    node: BaseException | None = exc
    while node is not None and node not in seen and len(seen) < 16:
        seen.append(node)
        node = node.__cause__ or node.__context__
    return seen


def failure_action(exc: BaseException) -> FailureAction:
    """Release a reservation only when the upstream surely consumed nothing.

    A connect-phase failure (refused, DNS, connect timeout) means the upstream never saw the
    request; a 4xx answer means it refused it. LiteLLM wraps both, so the exception chain is
    searched. Timeouts, 5xx, resets and anything unknown may have run: keep.
    """
    if any(isinstance(e, _CONNECT_ERRORS) for e in _chain(exc)):
        return "release"
    if isinstance(exc, litellm.Timeout | litellm.ContentPolicyViolationError):
        return "keep"  # a content filter may trip after the output was generated
    status = getattr(exc, "status_code", None)
    if any(word in str(exc) for word in _AFTER_GENERATION):
        return "keep"  # Ark's output moderation answers 4xx after the output was generated
    if isinstance(status, int) and 400 <= status < 500 and status not in (408, 499):
        return "release"
    return "keep"


# Ark error codes of a refusal that comes after tokens were generated (billed all the same).
_AFTER_GENERATION = ("SensitiveContentDetected", "OutputText", "OutputImage", "ContentFilter")
