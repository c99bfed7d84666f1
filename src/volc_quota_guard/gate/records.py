"""The store's side records: what the background work keeps beside the gate's own state.

- the sync schedule of an account (`sync_meta`) and the lock that elects its syncing process;
- the limit estimator's state of a pool (JSON of `limit.LimitState`, kept opaque here);
- the consume task's claim of a Beijing day and its per-day history of a pool;
- single fields of a pool's gate state that the sync and `status` read.

Every command runs under `store_errors()` (store.py), the gate's one Redis error mapping, so
the sync thread and the consume task see `StoreUnavailable` and nothing else. The keys come
from `KeySpace` (keys.py), like the gate's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

import redis

from .keys import KeySpace
from .store import store_errors, twice

# Delete the lock only while it is still ours (the usual Redis lock release).
_UNLOCK = """if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end
return 0"""

# Write the limit state unless the stored one names a later listing that is not in the future.
_WRITE_ORDERED = """local cur = redis.call('get', KEYS[1])
if cur then
  local at = tonumber(string.match(cur, '"listed_at_ms": (%d+)') or '0')
  if at > tonumber(ARGV[2]) and at <= tonumber(ARGV[3]) then return 0 end
end
redis.call('set', KEYS[1], ARGV[1])
return 1"""


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


class Records:
    """Side records over a sync redis-py client (or the embedded store)."""

    def __init__(self, client: redis.Redis, keyspace: KeySpace) -> None:
        self._client = client
        self.keyspace = keyspace
        self._unlock = client.register_script(_UNLOCK)
        self._write_ordered = client.register_script(_WRITE_ORDERED)

    # -- one pool's gate state, field by field ---------------------------------------------
    def state_int(self, pool: str, name: str) -> int:
        """One integer field of the pool's gate state (0 when absent)."""
        with store_errors():
            return int(self._client.hget(self.keyspace.pool(pool).state, name) or 0)

    def state_text(self, pool: str, name: str) -> str:
        """One text field of the pool's gate state ('' when absent)."""
        with store_errors():
            raw = self._client.hget(self.keyspace.pool(pool).state, name)
        return "" if raw is None else _text(raw)

    def lifetime_usage(self, pools: Iterable[str]) -> int:
        """The pools' lifetime usage (`ucum`) added up."""
        return sum(self.state_int(pool, "ucum") for pool in pools)

    # -- the sync schedule and its lock ------------------------------------------------------
    def sync_meta(self, account: str) -> dict[str, str]:
        """The account's sync record (next_at, last_at, last_error, usage_total, gen:<pool> …)."""
        with store_errors():
            raw = self._client.hgetall(self.keyspace.sync_meta(account))
        return {_text(k): _text(v) for k, v in raw.items()}

    def write_sync_meta(self, account: str, fields: Mapping[str, object]) -> None:
        with store_errors():
            self._client.hset(self.keyspace.sync_meta(account), mapping=dict(fields))  # type: ignore[arg-type]

    def drop_sync_meta(self, account: str, fields: list[str]) -> None:
        with store_errors():
            self._client.hdel(self.keyspace.sync_meta(account), *fields)

    def take_sync_lock(self, account: str, owner: str, ttl_ms: int) -> bool:
        """Whether `owner` now holds the account's sync lock (held by nobody else, for `ttl_ms`)."""
        key = self.keyspace.sync_lock(account)
        with store_errors():
            if self._client.set(key, owner, nx=True, px=ttl_ms):
                return True
            # A SET whose answer was lost and retried finds its own lock: it holds it.
            held = self._client.get(key)
        return (held.decode() if isinstance(held, bytes) else held) == owner

    def drop_sync_lock(self, account: str, owner: str) -> None:
        """Release the lock if `owner` still holds it (it may have expired and passed on): one
        atomic compare-and-delete, so a lock that passed on between a read and a delete stays."""
        with store_errors():
            twice(self._unlock, [self.keyspace.sync_lock(account)], [owner])

    # -- the limit estimator's state ---------------------------------------------------------
    def limit_state(self, pool: str) -> Any:
        """The pool's limit-estimator state as stored (decoded JSON), or None."""
        with store_errors():
            raw = self._client.get(self.keyspace.pool(pool).limit_state)
        return json.loads(raw) if raw else None

    def write_limit_state(self, pool: str, state: Mapping[str, Any], listed_at_ms: int = 0,
                          now_ms: int = 0) -> bool:
        """Store the pool's limit-estimator state, unless the stored one came from a later
        billing listing (a sync that stalled past its lock must not put its older view back:
        red-team, stop 37); a stored stamp ahead of `now_ms` (a clock since set back) orders
        nothing. False when not written."""
        raw = json.dumps({**state, "listed_at_ms": listed_at_ms})
        with store_errors():
            return bool(twice(self._write_ordered, [self.keyspace.pool(pool).limit_state],
                              [raw, str(listed_at_ms), str(now_ms)]))

    # -- the consume task: the day's claim and the history ----------------------------------
    def claim_day(self, pool: str, day: int, claim: Mapping[str, Any], ttl_ms: int) -> str | None:
        """Claim the pool's Beijing `day` for one run: None when it is now ours, else the claim
        that holds it (as stored, for the log)."""
        key = self.keyspace.consume_done(pool, day)
        with store_errors():
            if self._client.set(key, json.dumps(claim), nx=True, px=ttl_ms):
                return None
            held = self._client.get(key)
        return "" if held is None else _text(held)

    def finish_claim(self, pool: str, day: int, claim: Mapping[str, Any]) -> None:
        """Replace the day's claim by its outcome, keeping its expiry."""
        with store_errors():
            self._client.set(self.keyspace.consume_done(pool, day), json.dumps(claim), xx=True,
                             keepttl=True)

    def consume_history(self, pool: str) -> dict[str, int]:
        """The consume task's history of the pool (`first_day`, `<day>:natural`, `<day>:task`)."""
        with store_errors():
            raw = self._client.hgetall(self.keyspace.consume_history(pool))
        return {_text(k): int(v) for k, v in raw.items()}

    def note_history(self, pool: str, name: str, value: int) -> None:
        """Set a history field unless it is set already."""
        with store_errors():
            self._client.hsetnx(self.keyspace.consume_history(pool), name, value)

    def add_history(self, pool: str, name: str, amount: int) -> None:
        with store_errors():
            self._client.hincrby(self.keyspace.consume_history(pool), name, amount)

    def forget_history(self, pool: str, names: list[str]) -> None:
        if names:
            with store_errors():
                self._client.hdel(self.keyspace.consume_history(pool), *names)

    # -- the whole prefix --------------------------------------------------------------------
    def clear(self) -> None:
        """Delete every key under the prefix (a simulator wipe, the demo's clean-up)."""
        with store_errors():
            for key in self._client.scan_iter(self.keyspace.pattern(), count=1000):
                self._client.delete(key)
