"""volc_quota_guard: keep Volcengine Ark free token quota from tipping into paid billing."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .errors import (
    BillingAuthError,
    BillingError,
    BillingMalformed,
    BillingThrottled,
    BillingTransient,
    ConfigError,
    GateError,
    QuotaGuardError,
    StoreUnavailable,
)
from .gate import AsyncGate, Decision, Gate, Snapshot

if TYPE_CHECKING:
    from .hook import QuotaGuard

    proxy_handler_instance: QuotaGuard


def __getattr__(name: str) -> object:
    # The LiteLLM callback (`callbacks: volc_quota_guard.proxy_handler_instance`), imported on
    # first use so the CLI and the library do not load LiteLLM and the tokenizer.
    if name == "proxy_handler_instance":
        from .hook import proxy_handler_instance

        return proxy_handler_instance
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
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
    "QuotaGuardError",
    "Snapshot",
    "StoreUnavailable",
    "proxy_handler_instance",
]
__version__ = "0.1.0"
