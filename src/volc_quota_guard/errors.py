"""Every failure the guard raises, under one root.

    QuotaGuardError
    ├── ConfigError            a setting is missing or out of range (startup stops)
    │   └── GuardConfigError       a guarded deployment names no valid pool (its requests are refused)
    ├── InvalidRequest         a client's request is malformed (HTTP 400); `param` names the field
    ├── StoreUnavailable       Redis (or the embedded store) cannot be reached
    ├── GateError              the gate script refused its arguments (a bug, never a write)
    ├── BillingError           the Volcengine billing API failed
    │   ├── BillingAuthError       credentials are wrong or lack permission
    │   ├── BillingThrottled       the API asks us to slow down
    │   ├── BillingTransient       5xx, timeouts, connection resets
    │   └── BillingMalformed       the answer is not what the API documents
    └── ArkCallError           a consume task's chat call to Ark failed

Redis errors become `StoreUnavailable` in one place, `gate/store.py`'s `store_errors()`, for the
gate and its side records alike; billing SDK errors in `volcengine/billing.py`; both
`raise … from exc`.
"""

from __future__ import annotations

import re

_URL_CREDENTIALS = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/\s]*@")


def redact(text: str) -> str:
    """`text` with the user:password part of every URL in it replaced by `***`."""
    return _URL_CREDENTIALS.sub(r"\1***@", text)


class QuotaGuardError(Exception):
    """Root of every error raised by volc_quota_guard."""


class ConfigError(QuotaGuardError):
    """A setting is missing, malformed or out of its allowed range."""


class GuardConfigError(ConfigError, ValueError):
    """A guarded deployment's config cannot name a valid pool (a fail-closed refusal)."""


class InvalidRequest(QuotaGuardError, ValueError):
    """The request's own fields are malformed (HTTP 400); `param` names the field."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


class StoreUnavailable(QuotaGuardError):
    """The shared store (Redis) cannot be reached or answered with a server error.

    The message is redacted: a Redis URL's password never reaches a log line or a client.
    """

    def __init__(self, message: str) -> None:
        super().__init__(redact(message))


class GateError(QuotaGuardError):
    """The gate script rejected its inputs; nothing was written.

    `code` is the script's reason (``bad_amount``, ``bad_id``, ``unknown_pool`` …).
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


class BillingError(QuotaGuardError):
    """The Volcengine billing API call failed."""


class BillingAuthError(BillingError):
    """Credentials were rejected or lack the permission to list resource packages."""


class BillingThrottled(BillingError):
    """The billing API throttled us (HTTP 429, FlowLimitExceeded, AccountFlowLimitExceeded)."""


class BillingTransient(BillingError):
    """A failure that may pass on retry: 5xx, timeout, connection error."""


class BillingMalformed(BillingError):
    """The billing API answered with something that is not the documented shape."""


class ArkCallError(QuotaGuardError):
    """A consume-task chat call to Ark failed. `may_have_run` is False only when the upstream
    surely consumed nothing (never connected, or it refused with a 4xx)."""

    def __init__(self, message: str, *, may_have_run: bool) -> None:
        super().__init__(message)
        self.may_have_run = may_have_run
