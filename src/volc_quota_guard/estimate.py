"""The checks a request's messages must pass, and a deployment's output limit.

Counting is `counting.py`'s job (the cheap count there: cl100k, weighed); what a whole request
may bill (media, output, server-side context) is `admission.py`'s.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm  # noqa: E402  (after the env default above)

from .errors import InvalidRequest  # noqa: E402

MAX_OUTPUT_TOKENS = 10_000_000  # above any Ark model's output; larger is a client error
THREAD_ABOVE_CHARS = 20_000  # tokenize bigger prompts off the event loop


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


def is_big(params: Mapping[str, Any]) -> bool:
    """Whether counting `params` is worth a worker thread (tiktoken releases the GIL)."""
    return _is_big(list(params.values())) <= 0
