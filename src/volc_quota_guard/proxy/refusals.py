"""What a client sees when the guard says no: 429 / 503 / 400, their messages and Retry-After,
and the fail mode (VQG_FAIL_MODE) decided in one place.

- `QuotaRefused` (429, this request only): the router tries another deployment or a fallback.
- `QuotaStoreDown` (503): the store cannot be reached, so nothing can be admitted (fail-closed).
- `bad_request` (400): the request itself is malformed, or cannot be sized.
- `store_failure`: the store (or the guard) failed; fail-open lets the request pass unguarded
  with a `⚠️ [FAIL-OPEN]` line, fail-closed refuses it with a `⛔` line.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable

import litellm

from ..gate import Decision

log = logging.getLogger("volc_quota_guard")

STORE_RETRY_AFTER_S = 5
REFUSED_RETRY_AFTER_S = 60  # not evicted, just too big now: in-flight requests settle soon
FAR_FUTURE_MS = 2 * 86_400_000  # farther than this = "until the next snapshot"


class QuotaRefused(litellm.CallerCredentialRateLimitError):
    """429 for one request. The router tries another deployment or a fallback.

    A subclass of LiteLLM's caller-scoped 429 because a refusal concerns this request only:
    the router must not cool the deployment down for everyone (eviction is ours to decide).
    """


class QuotaStoreDown(litellm.ServiceUnavailableError):
    """503: the quota store is unreachable, so the guard cannot admit (fail-closed)."""


def retry_after_s(evicted_until_ms: int, now_ms: int, until_sync_s: int) -> int:
    """Seconds a client should wait before the pool can take traffic again."""
    if evicted_until_ms - now_ms > FAR_FUTURE_MS:
        return until_sync_s  # balance wall: lifts at a sync that finds new packages
    if evicted_until_ms > now_ms:
        return max(1, math.ceil((evicted_until_ms - now_ms) / 1000))
    return REFUSED_RETRY_AFTER_S


def message(model: str, pools: Iterable[str], why: str, wait_s: int) -> str:
    """The refusal's text: which model and pools, why, and when to retry."""
    return (f"Volcengine free token quota exhausted for model '{model}' "
            f"(pool {', '.join(sorted(set(pools)))}: {why}); the guard refuses rather than "
            f"bill past the free quota. Retry after {wait_s}s.")


def refused(model: str, pools: Iterable[str], why: str, wait_s: int,
            num_retries: int | None = 0) -> QuotaRefused:
    """A 429 with Retry-After; `num_retries=None` lets the router try the group's other deployments."""
    return QuotaRefused(message=message(model, pools, why, wait_s), llm_provider="volcengine",
                        model=model, headers={"retry-after": str(wait_s)}, num_retries=num_retries)


def gate_refusal(d: Decision, least: int, now_ms: int, until_sync_s: int) -> tuple[str, int]:
    """Why the gate refused a reservation that needed `least` tokens, and the wait to advise."""
    wait = retry_after_s(d.evicted_until, now_ms, until_sync_s)
    if d.reason in ("no_snapshot", "stale_snapshot"):
        wait = until_sync_s
    left = max(d.headroom, 0)
    # A request that fits the headroom was refused by the ceiling bound (docs/gate.md): its
    # prompt, counted at the correction's ceiling with those in flight, would pass the wall.
    ceiling = " (with its prompt at the estimate correction's ceiling)" if least <= left else ""
    why = {"no_snapshot": "no quota snapshot yet", "stale_snapshot": "quota snapshot too old",
           "expiry_wall": f"expiry_wall, a free package expires before Ark could finish this "
                          f"call's max_tokens at VQG_SLOWEST_DECODE_TOKENS_PER_SECOND and the rest "
                          f"does not hold its {least:,} tokens; a smaller max_tokens may fit",
           }.get(d.reason, f"{d.reason}, needs {least:,} tokens{ceiling}, {left:,} left")
    return why, wait


def unreachable_text(model: object, exc: BaseException) -> str:
    return (f"quota store unreachable: the Volcengine quota guard cannot verify free quota "
            f"for model '{model}' ({exc})")


def store_down(model: str, exc: BaseException) -> QuotaStoreDown:
    """A 503 with Retry-After, raised inside the router (deployment hooks, the routing filter)."""
    return unavailable(model, unreachable_text(model, exc))


def clock_untrusted(model: str, reason: str) -> QuotaStoreDown:
    """A 503: the store's clock disagrees with this host's (sync.py `check_clock`)."""
    return unavailable(model, f"quota guard clock check failed for model '{model}': {reason}")


def unavailable(model: str, text: str) -> QuotaStoreDown:
    err = QuotaStoreDown(message=text, llm_provider="volcengine", model=model, num_retries=0)
    err.headers = {"retry-after": str(STORE_RETRY_AFTER_S)}  # type: ignore[attr-defined]  # read by the proxy
    return err


def store_down_http(model: object, exc: BaseException) -> Exception:
    """The same 503 raised before routing (the proxy's pre-call hook answers HTTPException)."""
    from fastapi import HTTPException

    return HTTPException(status_code=503, detail={"error": unreachable_text(model, exc)},
                         headers={"retry-after": str(STORE_RETRY_AFTER_S)})


def bad_request(text: str, model: object, param: str | None = None) -> litellm.BadRequestError:
    """A 400 for the client's own request (`param` names the field, when one is to blame)."""
    body = None if param is None else {"type": "invalid_request_error", "param": param}
    return litellm.MalformedRequestFieldError(message=text, model=model, llm_provider="volcengine",
                                              body=body)


def as_http(exc: litellm.BadRequestError) -> Exception:
    """The same 400 as an HTTP error: LiteLLM's provider pass-through routes (`/vllm`, `/openai`,
    `/azure`) do not map a hook's error, and answer anything but an HTTP one with a bare 500."""
    from fastapi import HTTPException

    return HTTPException(status_code=400, detail={"error": exc.message})


def store_failure(fail_open: bool, passes: str, refused_line: str, refusal: Exception,
                  exc: BaseException, *, traceback: bool = False) -> None:
    """The fail mode, decided here alone: return (fail-open: the request passes unguarded, and
    `⚠️ [FAIL-OPEN] <passes>` says so) or raise `refusal` (fail-closed, after `refused_line`).

    The line ends with the error (`: <exc>`), or is logged with its traceback.
    """
    line = f"⚠️ [FAIL-OPEN] {passes}" if fail_open else refused_line
    if traceback:
        log.exception("%s", line)
    else:
        log.error("%s: %s", line, exc)
    if not fail_open:
        raise refusal from None
