"""`volc-quota-guard metrics` — print the Prometheus exposition of every guarded pool once.

The same pool gauges a proxy serves on VQG_METRICS_PORT, read from the shared store
(VQG_REDIS_URL, VQG_KEY_PREFIX): handy for cron jobs, node_exporter's textfile collector and
tests. The per-process counters (blocks, clamps, evictions, sync errors) live in the proxy
processes and are not printed. Exit status 1 when the store did not answer.
"""

from __future__ import annotations

import argparse
from typing import Any

from ..config import load_settings
from ..metrics import exposition


def register(sub: Any) -> None:
    p = sub.add_parser("metrics", help="print every pool's Prometheus metrics once",
                       description="Reads the shared store (VQG_REDIS_URL, VQG_KEY_PREFIX).")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    text = exposition(load_settings())
    print(text, end="")
    return 0 if "\nvqg_store_up 1.0\n" in text else 1
