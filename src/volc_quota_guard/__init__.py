"""volc_quota_guard: keep Volcengine Ark free token quota from tipping into paid billing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import (
    ArkCallError,
    BillingAuthError,
    BillingError,
    BillingMalformed,
    BillingThrottled,
    BillingTransient,
    ConfigError,
    GateError,
    GuardConfigError,
    InvalidRequest,
    QuotaGuardError,
    StoreUnavailable,
)
from .gate import AsyncGate, Decision, Gate, Snapshot

if TYPE_CHECKING:
    from .proxy.hook import QuotaGuard

    proxy_handler_instance: QuotaGuard


def __getattr__(name: str) -> object:
    # The LiteLLM callback (`callbacks: volc_quota_guard.proxy_handler_instance`), imported on
    # first use so the CLI and the library do not load LiteLLM and the tokenizer.
    if name == "proxy_handler_instance":
        from .proxy.runtime import proxy_handler

        return proxy_handler()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "ArkCallError",
    "AsyncGate",
    "BillingAuthError",
    "BillingError",
    "BillingMalformed",
    "BillingThrottled",
    "BillingTransient",
    "ConfigError",
    "Decision",
    "Gate",
    "GateError",
    "GuardConfigError",
    "InvalidRequest",
    "QuotaGuardError",
    "Snapshot",
    "StoreUnavailable",
    "proxy_handler_instance",
]
__version__ = "0.1.0"
