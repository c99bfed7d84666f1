"""A fake Volcengine for tests, the simulator and the demo.

- ``ledger.Ledger``: the free-quota rules (FIFO packages, expiry, daily cap, next-day return,
  settlement lag, billing), pure and deterministic — the simulator uses it directly.
- ``server.FakeVolcengine``: a local HTTP server around a ledger that answers the billing
  OpenAPI (``ListResourcePackages``, SDK-signed), Ark chat completions and ``/_fake/`` admin.
"""

from __future__ import annotations

from .clock import ScaledClock
from .ledger import Consumption, Ledger, PackageView, PoolTotals, configuration_code_for
from .server import FakeVolcengine
from .state import BILLING_FAULTS, ChatDefaults, ChatRecord, FakeAccount

__all__ = [
    "BILLING_FAULTS",
    "ChatDefaults",
    "ChatRecord",
    "Consumption",
    "FakeAccount",
    "FakeVolcengine",
    "Ledger",
    "PackageView",
    "PoolTotals",
    "ScaledClock",
    "configuration_code_for",
]
