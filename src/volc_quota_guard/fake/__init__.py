"""A fake Volcengine for tests, the simulator and the demo.

- ``ledger.Ledger``: the free-quota rules (FIFO packages, expiry, daily cap, next-day return,
  settlement lag, billing), pure and deterministic — the simulator uses it directly.
- ``server.FakeVolcengine``: a local HTTP server around a ledger that answers the billing
  OpenAPI (``ListResourcePackages``, SDK-signed), the Ark data plane (chat completions,
  Responses, embeddings; billed as docs/gate.md says, see ``ark_api``) and ``/_fake/`` admin.
"""

from __future__ import annotations

from .clock import ScaledClock
from .ledger import Consumption, Ledger, LedgerPackage, PoolTotals, configuration_code_for
from .server import FakeVolcengine
from .state import BILLING_FAULTS, ChatDefaults, ChatRecord, FakeAccount, StoredResponse, UpstreamRequest

__all__ = [
    "BILLING_FAULTS",
    "ChatDefaults",
    "ChatRecord",
    "Consumption",
    "FakeAccount",
    "FakeVolcengine",
    "Ledger",
    "LedgerPackage",
    "PoolTotals",
    "ScaledClock",
    "StoredResponse",
    "UpstreamRequest",
    "configuration_code_for",
]
