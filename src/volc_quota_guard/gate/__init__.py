"""The gate and the store it keeps: every Redis command the guard sends is issued in here.

    values.py    what the gate answers and takes (Decision, Snapshot, PoolState): no Redis
    keys.py      every key, under one prefix, a pool's keys under one `{pool}` hash tag
    store.py     connections, and the one mapping of Redis errors to `StoreUnavailable`
    scripts.py   `Gate` / `AsyncGate`: one atomic Lua call per verb (resources/lua/)
    records.py   the side records: sync schedule and lock, limit state, consume claim, history
    model.py     the pure-Python reference model the Lua is checked against
"""

from __future__ import annotations

from .keys import KeySpace, PoolKeys, pool_id, validate_pool
from .records import Records
from .scripts import AsyncGate, Gate
from .values import MAX_REQUEST, PPM, Decision, PoolState, Snapshot

__all__ = [
    "MAX_REQUEST",
    "PPM",
    "AsyncGate",
    "Decision",
    "Gate",
    "KeySpace",
    "PoolKeys",
    "PoolState",
    "Records",
    "Snapshot",
    "pool_id",
    "validate_pool",
]
