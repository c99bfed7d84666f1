"""Ark's tokenization API, for the counts only Ark can make (Doubao models): a cache in front,
a short timeout, and None on any failure so the caller falls back to the cheap count × k.

    client = ArkTokenizer(timeout_s=0.3)
    n = await client.count(api_base, api_key, "doubao-seed-2-1-pro-260628", text)  # int | None

`POST {api_base}/tokenization`, Bearer API key, body `{"model": m, "text": [..]}`, answer
`data[i].total_tokens` (ARK.md §3). Text only: the chat template is not in the count, so a
caller adds its own per-message allowance (counting.ARK_API_MESSAGE_TOKENS). A network call
per request would cost more than the guard's whole hot path; ask only where the answer can
change a decision (the cheap count × k does not fit the headroom) and let the cache answer
repeats (system prompts, retried requests).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import httpx

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 0.3
DEFAULT_CACHE_SIZE = 4_096


# No tokenizer's token spans more bytes than this (cl100k's and DeepSeek-V4's longest, runs of
# spaces, are ~128 and ~118): a count below bytes / this is a broken answer, not a count.
MAX_BYTES_PER_TOKEN = 256


def _key(model: str, text: str) -> tuple[str, bytes]:
    return model, hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


def parse_counts(answer: Any, expected: int) -> list[int] | None:
    """`data[i].total_tokens` for each of `expected` texts, or None when the answer is not that."""
    data = answer.get("data") if isinstance(answer, dict) else None
    if not isinstance(data, list) or len(data) != expected:
        return None
    counts: list[int] = []
    for item in data:
        n = item.get("total_tokens") if isinstance(item, dict) else None
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            return None
        counts.append(n)
    return counts


class ArkTokenizer:
    """An async client of Ark's tokenization API with an LRU cache of (model, sha256(text)).

    One instance per process (it holds the connection pool); `close()` on shutdown.
    `transport` is the test seam (an `httpx.MockTransport`).
    """

    def __init__(self, *, timeout_s: float = DEFAULT_TIMEOUT_S, cache_size: int = DEFAULT_CACHE_SIZE,
                 transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.timeout_s = timeout_s
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, bytes], int] = OrderedDict()
        self._http = httpx.AsyncClient(timeout=timeout_s, transport=transport)
        self.calls = 0  # requests sent (cache misses that reached the network)
        self.failures = 0
        self.last_error = ""  # why the last failed call failed, for the caller's (rate-limited) log

    async def aclose(self) -> None:
        await self._http.aclose()

    def cached(self, model: str, text: str) -> int | None:
        """The cached count of `text`, or None (no network)."""
        key = _key(model, text)
        found = self._cache.get(key)
        if found is not None:
            self._cache.move_to_end(key)
        return found

    def _store(self, model: str, text: str, count: int) -> None:
        self._cache[_key(model, text)] = count
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    async def count(self, api_base: str, api_key: str, model: str, text: str) -> int | None:
        """Ark's token count of `text` for `model`, or None if Ark did not answer in time."""
        found = await self.count_many(api_base, api_key, model, [text])
        return None if found is None else found[0]

    async def count_many(self, api_base: str, api_key: str, model: str,
                         texts: Sequence[str]) -> list[int] | None:
        """Counts of each of `texts` (one request for the uncached ones), or None on any failure."""
        counts: list[int | None] = [self.cached(model, t) for t in texts]
        missing = [t for t, c in zip(texts, counts, strict=True) if c is None]
        if missing:
            fresh = await self._ask(api_base, api_key, model, missing)
            if fresh is None:
                return None
            by_text = dict(zip(missing, fresh, strict=True))
            for text, n in by_text.items():
                self._store(model, text, n)
            counts = [c if c is not None else by_text[t] for t, c in zip(texts, counts, strict=True)]
        return [c for c in counts if c is not None]

    async def _ask(self, api_base: str, api_key: str, model: str, texts: list[str]) -> list[int] | None:
        self.calls += 1
        try:
            async with asyncio.timeout(self.timeout_s):  # the whole call, not each read
                reply = await self._http.post(
                    f"{api_base.rstrip('/')}/tokenization", json={"model": model, "text": texts},
                    headers={"Authorization": f"Bearer {api_key}"})
            if reply.status_code != 200:
                raise ValueError(f"HTTP {reply.status_code}")
            counts = parse_counts(reply.json(), len(texts))
            if counts is None:
                raise ValueError("the answer has no data[i].total_tokens for every text")
            for text, n in zip(texts, counts, strict=True):
                size = len(text.encode("utf-8", "surrogatepass"))
                if n * MAX_BYTES_PER_TOKEN < size:  # a broken answer must not shrink a reservation
                    raise ValueError(f"an implausible count: {n} tokens for {size} bytes")
            return counts
        except (httpx.HTTPError, TimeoutError, ValueError) as exc:  # bad JSON is a ValueError
            self.failures += 1
            self.last_error = f"{type(exc).__name__}: {str(exc)[:120]}"
            # The hook logs a warning once per deployment a minute; every failure is here at debug.
            log.debug("volc_quota_guard: Ark tokenization for %s failed (%s); counting without it",
                      model, self.last_error)
            return None
