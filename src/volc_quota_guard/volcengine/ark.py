"""Direct Ark chat calls for the consume task: the deployment's own key and base URL, over httpx.

The task does not go through the proxy (no routing, no 429 to anyone, no eviction of its own
making); `consume.py` reserves and settles each call in the gate itself.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

import httpx
from pydantic import SecretStr

from ..errors import ArkCallError
from ..outcome import UsageReading, read_usage

_FILLER = ("The river carried autumn leaves past the old mill while farmers counted their grain "
           "and children traced maps of distant mountains in the dust. ")
SYSTEM = "You write long, plain prose. Keep writing until you run out of room."
ASK = ("Ignore the background text above; it is only filler. Write a long, detailed story about "
       "a lighthouse keeper, in many chapters, and do not stop early.")


@dataclass(frozen=True)
class ArkTarget:
    """Where a pool's consume calls go: one of its deployments."""

    pool: str
    model: str  # upstream Ark model id
    api_base: str
    api_key: SecretStr

    def __repr__(self) -> str:
        return f"ArkTarget(pool={self.pool!r}, api_base={self.api_base!r})"


def _count(method: str, messages: list[dict[str, str]]) -> int:
    from .. import counting  # imports the tokenizers: only where a consume is planned

    return counting.count_chat("deepseek" if method == "deepseek" else "cl100k",
                               list[Mapping[str, Any]](messages), None)


@cache
def _filler_unit_tokens(method: str = "cl100k") -> int:
    """Tokens one more filler sentence adds, by `method` (the template's overhead left out)."""
    many, none = ({"role": "user", "content": _FILLER * n} for n in (100, 0))
    return max(1, (_count(method, [many]) - _count(method, [none])) // 100)


@cache
def _bare_tokens(method: str) -> int:
    """Tokens of the consume messages without filler (system prompt, ask, template)."""
    return _count(method, [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n" + ASK}])


def consume_messages(prompt_tokens: int, method: str = "cl100k") -> tuple[list[dict[str, str]], int]:
    """Chat messages of at most `prompt_tokens` input tokens by `method`'s count, and that count."""
    def build(units: int) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM},
                {"role": "user", "content": _FILLER * units + "\n\n" + ASK}]

    unit = _filler_unit_tokens(method)
    # The first guess leaves room for the messages without filler, so it is usually the answer:
    # one exact count per call (a 30k-token count takes ~0.1 s), not two.
    units = max(0, (prompt_tokens - _bare_tokens(method)) // unit)
    while True:
        messages = build(units)
        counted = _count(method, messages)
        if counted <= prompt_tokens or units == 0:
            return messages, counted
        units = max(0, units - 1 - (counted - prompt_tokens) // unit)


class ArkChat:
    """Non-streaming chat completions with usage; one httpx client per task."""

    def __init__(self, timeout_s: float, transport: httpx.BaseTransport | None = None) -> None:
        self._http = httpx.Client(timeout=timeout_s, transport=transport)

    def close(self) -> None:
        self._http.close()

    def chat(self, target: ArkTarget, messages: list[dict[str, str]], max_output: int) -> UsageReading:
        """One call; raises ArkCallError saying whether the upstream may have consumed tokens."""
        body = {"model": target.model, "messages": messages, "stream": False,
                # Ark's cap that includes reasoning tokens (thinking models): nothing runs past it.
                "max_completion_tokens": max_output}
        headers = {"Authorization": f"Bearer {target.api_key.get_secret_value()}"}
        try:
            reply = self._http.post(f"{target.api_base}/chat/completions", json=body, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise ArkCallError(f"cannot connect to {target.api_base}: {exc}", may_have_run=False) from exc
        except httpx.HTTPError as exc:
            raise ArkCallError(f"{type(exc).__name__}: {exc}", may_have_run=True) from exc
        if reply.status_code >= 400:
            refused = reply.status_code < 500 and reply.status_code not in (408, 499)
            raise ArkCallError(f"HTTP {reply.status_code}: {reply.text[:200]}",
                               may_have_run=not refused)
        try:
            answer = reply.json()
        except ValueError as exc:
            raise ArkCallError("the answer is not JSON", may_have_run=True) from exc
        return read_usage(answer)
