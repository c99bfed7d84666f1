"""volc_quota_guard: keep Volcengine Ark free token quota from tipping into paid billing."""

from __future__ import annotations

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
]
__version__ = "0.1.0"
