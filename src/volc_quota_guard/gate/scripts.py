"""The gate: one atomic Lua call per verb, checking both walls of a pool.

Scripts live in `resources/lua/` (one verb per file, `_common.lua` prepended) and are bound
with redis-py's `register_script`, which reloads them after a `SCRIPT FLUSH` (NOSCRIPT).
`Gate` is for threads (sync, CLI, simulator); `AsyncGate` is for the LiteLLM hook. Both
share the argument building and answer parsing below, so they cannot drift apart.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from functools import cache
from importlib import resources
from typing import Any

import redis
import redis.asyncio as aioredis

from ..clock import MINUTE_MS, Clock, ServerClock
from ..errors import GateError
from .keys import KeySpace, PoolKeys
from .records import Records
from .store import amapped as _acall
from .store import atwice as _atwice
from .store import is_cluster, twice
from .store import mapped as _call
from .values import Decision, PoolState, Snapshot, ladder_arg

VERBS = ("reserve", "settle", "release", "snapshot", "status", "recover")


@cache
def script_source(verb: str) -> str:
    lua = resources.files("volc_quota_guard.resources.lua")
    return lua.joinpath("_common.lua").read_text() + "\n" + lua.joinpath(f"{verb}.lua").read_text()


# Every gate of this process (the hook's and the sync thread's) keeps each pool's latest answer
# per generation: if the state is lost, what was admitted after the sync thread's last poll is
# in it (sync.py). Two generations are kept: a new one's answers must not hide the lost one's.
_SIGHTINGS: dict[tuple[str, str], dict[int, Decision]] = {}
_SIGHTINGS_LOCK = threading.Lock()


def _sighted(keyspace: KeySpace, pool: str, d: Decision) -> Decision:
    if d.generation > 0:
        with _SIGHTINGS_LOCK:
            gens = _SIGHTINGS.setdefault((keyspace.prefix, pool), {})
            old = gens.get(d.generation)
            # Lifetime usage never decreases within a generation: keep the answer that saw the
            # most (answers of concurrent calls may come back out of order; a lower one after a
            # higher one is either that, or a store restored from an older copy: sync.py).
            if old is None or d.ucum >= old.ucum:
                gens[d.generation] = d
            if len(gens) > 2:  # the first seen goes (a simulator's clock may run backwards)
                del gens[next(iter(gens))]
    return d


def sighting(keyspace: KeySpace, pool: str, generation: int) -> Decision | None:
    """This process's latest answer for `pool` in state generation `generation`, if any."""
    with _SIGHTINGS_LOCK:
        return _SIGHTINGS.get((keyspace.prefix, pool), {}).get(generation)


def forget_sightings(keyspace: KeySpace) -> None:
    """Drop what this process kept of the pools under `keyspace` (a simulator run's end)."""
    with _SIGHTINGS_LOCK:
        for key in [k for k in _SIGHTINGS if k[0] == keyspace.prefix]:
            del _SIGHTINGS[key]


_DROP_ROLLED_BACK = """
local unpack = unpack or table.unpack
local got = redis.call('HMGET', KEYS[1], 'hist_at', 'ucum')
local gen, ucum = got[1], got[2]
if tonumber(gen) == tonumber(ARGV[1]) and (tonumber(ucum) or 0) < tonumber(ARGV[2]) then
  redis.call('DEL', unpack(KEYS))
  return 1
end
return 0
"""


def _parse(raw: list[Any]) -> Decision:
    vals = [v.decode() if isinstance(v, bytes) else v for v in raw]
    if vals[0] == "error":
        raise GateError(str(vals[1]), str(vals[2]))
    return Decision(
        status=vals[0], reason=vals[1], amount=int(vals[2]), headroom=int(vals[3]),
        used_balance=int(vals[4]), balance_wall=int(vals[5]), used_today=int(vals[6]),
        daily_cap=int(vals[7]), inflight=int(vals[8]), evicted_until=int(vals[9]),
        overrun=bool(int(vals[10])), balance_at_sync=int(vals[11]), input_reserved=int(vals[12]),
        correction_ppm=int(vals[13]), exact_correction_ppm=int(vals[14]),
        generation=int(vals[15]), day=int(vals[16]), today_worst=int(vals[17]),
        lifetime_worst=int(vals[18]), settled=int(vals[19]),
        ucum=int(vals[20]), carry_day=int(vals[21]), carry=int(vals[22]),
    )


def _now_arg(clock: Clock) -> str:
    now = clock.now_ms()
    return "" if now is None else str(now)


def _num(v: int | None) -> str:
    return "" if v is None else str(v)  # the script validates; a float or negative is refused


def _decode_fields(raw: dict[Any, Any]) -> dict[str, int]:
    out = {}
    for k, v in raw.items():
        key = k.decode() if isinstance(k, bytes) else k
        try:
            out[key] = int(v)
        except (TypeError, ValueError):
            continue
    return out


class _Args:
    """Key and argument lists per verb; shared by the sync and async gates."""

    def __init__(self, keyspace: KeySpace, clock: Clock) -> None:
        self.keyspace = keyspace
        self.clock = clock

    def keys(self, pool: str) -> PoolKeys:
        return self.keyspace.pool(pool)

    def reserve(self, request_id: str, wanted: int, least: int | None, ttl_ms: int,
                input_tokens: int, exact: bool = False, run_ms: int = 0) -> list[str]:
        return [_now_arg(self.clock), request_id, _num(wanted), _num(wanted if least is None else least),
                _num(ttl_ms), _num(input_tokens), "exact" if exact else "", "",
                _num(run_ms) if run_ms else ""]

    def renew(self, request_id: str, ttl_ms: int) -> list[str]:
        return [_now_arg(self.clock), request_id, "1", "1", _num(ttl_ms), "0", "", "renew"]

    def settle(self, request_id: str, actual: int | None, measured_input: int | None,
               estimated: bool = False, running: bool = False) -> list[str]:
        return [_now_arg(self.clock), request_id, _num(actual), _num(measured_input),
                "estimated" if estimated else "running" if running else ""]

    def release(self, request_id: str) -> list[str]:
        return [_now_arg(self.clock), request_id]

    def snapshot(self, s: Snapshot) -> list[str]:
        return [_now_arg(self.clock), _num(s.balance), _num(s.settled_usage), _num(s.expiring),
                _num(s.small_buffer), _num(s.daily_cap), _num(s.valid_until_ms), _num(s.evict_below),
                json.dumps(s.packages), _num(s.correction_min_ppm), _num(s.correction_max_ppm),
                _num(s.hold_until_ms) if s.hold_until_ms else "", _num(s.hold_cap),
                _num(s.unseen_day_tokens), *_day_args(s), _num(s.generation),
                _num(s.listed_at_ms), ladder_arg(s)]

    def recover(self, generation: int, day: int, seen_today: int, carry_day: int = 0,
                carry: int = 0, inflight: int = 0) -> list[str]:
        return [_now_arg(self.clock), _num(generation), _num(day), _num(seen_today), _num(carry_day),
                _num(carry), _num(inflight)]

    def status(self) -> list[str]:
        return [_now_arg(self.clock)]


def _day_args(s: Snapshot) -> list[str]:
    return ["" if s.day_step is None else _num(s.day_step), _num(s.day_since_ms),
            "" if s.day_from is None else _num(s.day_from)]


def _tl_value(raw: Any) -> tuple[int, int]:
    """A timeline minute's "lifetime usage:of it unsure" (older entries: just the usage)."""
    text = raw.decode() if isinstance(raw, bytes) else str(raw or "0")
    used, _, unsure = text.partition(":")
    return int(used or 0), int(unsure or 0)


def _minute_before(ms: int) -> int:
    # The last *complete* minute before `ms`: its recorded usage is <= the usage at `ms`.
    return ms // MINUTE_MS - 1


class Gate:
    """The gate over a sync redis-py client (or the embedded store)."""

    def __init__(self, client: redis.Redis, keyspace: KeySpace | None = None,
                 clock: Clock | None = None) -> None:
        self.client = client
        self.args = _Args(keyspace or KeySpace(), clock or ServerClock())
        self.records = Records(client, self.args.keyspace)  # the side records, same store
        self._scripts = {v: client.register_script(script_source(v)) for v in VERBS}

    def _run(self, verb: str, pool: str, args: list[str]) -> Decision:
        keys = self.args.keys(pool).gate_keys(verb)
        return _sighted(self.args.keyspace, pool,
                        _parse(_call(lambda: twice(self._scripts[verb], keys, args))))

    def reserve(self, pool: str, request_id: str, wanted: int, least: int | None = None,
                ttl_ms: int = 900_000, input_tokens: int = 0, exact: bool = False,
                run_ms: int = 0) -> Decision:
        """Reserve up to `wanted` tokens (at least `least`) for `request_id`, or refuse.

        `input_tokens` is the tokenizer's part of both amounts: it is reserved times the pool's
        estimate correction (`Decision.input_reserved`), so the grant may exceed `wanted`.
        `exact`: the count is exact (the DeepSeek tokenizer, Ark's tokenization API): reserved
        times the exact class's own correction kx (floor 1.1) and held to the exact miscount
        ceiling (1.5). `run_ms`: how long Ark may run the call (`Settings.call_run_ms`); the
        snapshot ladder's packages that expire by then are off its balance wall.
        """
        return self._run("reserve", pool, self.args.reserve(request_id, wanted, least, ttl_ms,
                                                            input_tokens, exact, run_ms))

    def renew(self, pool: str, request_id: str, ttl_ms: int) -> Decision:
        """Move a live reservation's deadline to `ttl_ms` from now (its request is still running);
        an id that is not live is left alone (`unknown_id`, `resolved`): a renewal never admits."""
        return self._run("reserve", pool, self.args.renew(request_id, ttl_ms))

    def settle(self, pool: str, request_id: str, actual: int | None,
               measured_input: int | None = None, estimated: bool = False,
               running: bool = False) -> Decision:
        """Replace the reservation by real usage; `None` = unknown: the reservation counts as
        consumed, its prompt at its class's miscount ceiling (`estimated`: `actual` is a local
        estimate, counted as at least that). `running` (implied by `estimated`): Ark may still
        be running the call (the proxy gave up on it), so near Beijing midnight it is counted on
        the next day too.

        `measured_input` (the upstream's prompt tokens, only when measured) teaches the pool's
        estimate correction.
        """
        return self._run("settle", pool,
                         self.args.settle(request_id, actual, measured_input, estimated, running))

    def release(self, pool: str, request_id: str) -> Decision:
        """Free the reservation of a request that never reached the upstream."""
        return self._run("release", pool, self.args.release(request_id))

    def install_snapshot(self, pool: str, snapshot: Snapshot) -> Decision:
        decision = self._run("snapshot", pool, self.args.snapshot(snapshot))
        # The index lives outside the pool's slot, so it cannot join the atomic call.
        _call(lambda: self.client.sadd(self.args.keyspace.pools_index(), pool))
        return decision

    def recover(self, pool: str, generation: int, day: int, seen_today: int, carry_day: int = 0,
                carry: int = 0, inflight: int = 0) -> Decision:
        """Mark generation `generation` of the pool's state as lost state (not a first start) and
        raise today's usage to `seen_today` (what this process saw before the loss) if `day` is
        today, and count on today or tomorrow what it carried to `carry_day` (calls Ark may still
        bill then) and its calls `inflight` (at the miscount ceiling) when the loss is near a
        Beijing midnight. `reason` is 'recovered', or 'generation' when the state is another
        generation."""
        return self._run("recover", pool,
                         self.args.recover(generation, day, seen_today, carry_day, carry, inflight))

    def sighting(self, pool: str, generation: int) -> Decision | None:
        """This process's latest answer for `pool` in state generation `generation` (any gate's)."""
        return sighting(self.args.keyspace, pool, generation)

    def drop_rolled_back(self, pool: str, generation: int, seen_ucum: int) -> bool:
        """Delete the pool's state if it is generation `generation` with lifetime usage below
        `seen_ucum` (what this process saw of it): the store went back to an older copy of itself,
        which the lost-state path must treat as lost. True when it was dropped."""
        keys = self.args.keys(pool)
        return bool(_call(lambda: self.client.eval(
            _DROP_ROLLED_BACK, 9, *keys.gate_keys("snapshot"), keys.limit_state,
            str(generation), str(seen_ucum))))

    def history(self, pool: str) -> dict[str, int] | None:
        """The pool's generation and today's count, one read: None when the pool has no state."""
        names = ("hist_at", "hist_lost", "day", "day_usage", "inflight", "ucum", "inflight_est",
                 "inflight_est_res", "inflight_xest", "inflight_xest_res", "corr_max", "settled",
                 "carry_day", "carry", "snap_at")
        keys = self.args.keys(pool)
        vals = _call(lambda: self.client.hmget(keys.state, names))
        if vals[-1] is None:
            return None
        return {n: int(v or 0) for n, v in zip(names, vals, strict=True)}

    def _reads(self) -> Any:
        """A pipeline for plain reads of one pool's keys (one round trip; one node on a cluster)."""
        return self.client.pipeline() if is_cluster(self.client) else self.client.pipeline(transaction=False)

    def status(self, pool: str) -> PoolState:
        decision = self._run("status", pool, self.args.status())
        keys = self.args.keys(pool)
        pipe = self._reads()
        pipe.hgetall(keys.state)
        pipe.get(keys.packages)
        raw, pk = _call(pipe.execute)
        return PoolState(pool, decision, decision.amount, _decode_fields(raw),
                         json.loads(pk) if pk else [])

    def usage_at(self, pool: str, ms: int) -> int:
        """Lifetime usage recorded up to the last complete minute before `ms`."""
        keys = self.args.keys(pool)
        found = _call(lambda: self.client.zrevrangebyscore(
            keys.timeline_index, _minute_before(ms), "-inf", start=0, num=1))
        if found:
            minute: str = found[0].decode() if isinstance(found[0], bytes) else str(found[0])
            return _tl_value(_call(lambda: self.client.hget(keys.timeline, minute)))[0]
        return int(_call(lambda: self.client.hget(keys.state, "tl_floor")) or 0)

    def now_ms(self) -> int:
        """The gate's time: the injected clock, else the Redis server's (what the scripts use)."""
        pinned = self.args.clock.now_ms()
        return self._server_ms() if pinned is None else pinned

    def _server_ms(self) -> int:
        sec, usec = _call(self.client.time)
        return int(sec) * 1000 + int(usec) // 1000

    def clock_skew_ms(self, host_s: Callable[[], float] = time.time) -> tuple[int, int] | None:
        """(the Redis server's clock less this host's, the reading's uncertainty: half the round
        trip), in ms; None when a clock is injected (the gate does not read Redis's then)."""
        if self.args.clock.now_ms() is not None:
            return None
        # Each pool's scripts read the clock of the node holding its keys: on a Cluster, every
        # primary's is checked, and the one furthest off is the reading.
        client: Any = self.client
        nodes: list[Any] = client.get_primaries() if is_cluster(client) else [None]
        worst: tuple[int, int] | None = None
        for node in nodes:
            def read(node: Any = node) -> Any:
                return client.time() if node is None else client.time(target_nodes=node)
            before = host_s()
            sec, usec = _call(read)
            after = host_s()
            server = int(sec) * 1000 + int(usec) // 1000
            reading = server - int((before + after) * 500), int((after - before) * 500) + 1
            if worst is None or abs(reading[0]) - reading[1] > abs(worst[0]) - worst[1]:
                worst = reading
        return worst

    def timeline(self, pool: str, since_ms: int = 0) -> tuple[list[tuple[int, int]], int]:
        """The pool's (minute, lifetime usage) entries from `since_ms` on, ascending, and the
        usage recorded before them (the floor)."""
        entries, floor = self.timeline_entries(pool, since_ms)
        return [(m, used) for m, used, _ in entries], floor

    def timeline_entries(self, pool: str, since_ms: int = 0) -> tuple[list[tuple[int, int, int]], int]:
        """As `timeline`, each entry with the lifetime usage of it counted unmeasured. Two round
        trips: the sync reads it every time."""
        keys = self.args.keys(pool)
        since = since_ms // MINUTE_MS
        pipe = self._reads()
        pipe.zrangebyscore(keys.timeline_index, since, "+inf")
        pipe.zrevrangebyscore(keys.timeline_index, since - 1, "-inf", start=0, num=1)
        pipe.hget(keys.state, "tl_floor")
        found, before, tl_floor = _call(pipe.execute)
        minutes = [int(m) for m in found]
        values: list[Any] = []
        floor = int(tl_floor or 0)
        if minutes or before:
            pipe = self._reads()
            if minutes:
                pipe.hmget(keys.timeline, minutes)
            if before:  # the last minute before `since`: its usage is the floor, not tl_floor
                pipe.hget(keys.timeline, before[0].decode() if isinstance(before[0], bytes) else before[0])
            answers = _call(pipe.execute)
            values = answers[0] if minutes else []
            floor = _tl_value(answers[-1])[0] if before else floor
        return [(m, *_tl_value(v)) for m, v in zip(minutes, values, strict=True)], floor

    def pools(self) -> list[str]:
        members = _call(lambda: self.client.smembers(self.args.keyspace.pools_index()))
        return sorted(m.decode() if isinstance(m, bytes) else m for m in members)


class AsyncGate:
    """The gate over an asyncio redis client; the verbs the request path needs."""

    def __init__(self, client: aioredis.Redis, keyspace: KeySpace | None = None,
                 clock: Clock | None = None) -> None:
        self.client = client
        self.args = _Args(keyspace or KeySpace(), clock or ServerClock())
        self._scripts = {v: client.register_script(script_source(v)) for v in VERBS}
        self._cluster = is_cluster(client)

    async def _run(self, verb: str, pool: str, args: list[str]) -> Decision:
        keys = self.args.keys(pool).gate_keys(verb)
        return _sighted(self.args.keyspace, pool,
                        _parse(await _acall(lambda: _atwice(self._scripts[verb], keys, args))))

    async def reserve(self, pool: str, request_id: str, wanted: int, least: int | None = None,
                      ttl_ms: int = 900_000, input_tokens: int = 0, exact: bool = False,
                      run_ms: int = 0) -> Decision:
        return await self._run("reserve", pool, self.args.reserve(
            request_id, wanted, least, ttl_ms, input_tokens, exact, run_ms))

    async def renew(self, pool: str, request_id: str, ttl_ms: int) -> Decision:
        return await self._run("reserve", pool, self.args.renew(request_id, ttl_ms))

    async def settle(self, pool: str, request_id: str, actual: int | None,
                     measured_input: int | None = None, estimated: bool = False,
                     running: bool = False) -> Decision:
        return await self._run("settle", pool,
                               self.args.settle(request_id, actual, measured_input, estimated, running))

    async def release(self, pool: str, request_id: str) -> Decision:
        return await self._run("release", pool, self.args.release(request_id))

    async def status(self, pool: str) -> Decision:
        return await self._run("status", pool, self.args.status())

    async def response_chain(self, response_id: str) -> int | None:
        """Tokens of the stored conversation ending at `response_id`, if the guard settled it."""
        key = self.args.keyspace.response_chain(response_id)
        raw = await _acall(lambda: self.client.get(key))
        try:
            return int(raw) if raw is not None else None
        except ValueError:
            return None  # not ours to trust: sized as unknown

    async def remember_response(self, response_id: str, tokens: int, ttl_s: int) -> None:
        """Record what a stored response's conversation holds (its input + output), for follow-ups."""
        key = self.args.keyspace.response_chain(response_id)
        await _acall(lambda: self.client.set(key, str(max(tokens, 0)), ex=ttl_s))

    async def evicted_until(self, pools: list[str]) -> dict[str, int]:
        """Each pool's eviction deadline (0 = routable), one pipelined round trip.

        The scripts stamp deadlines on the Redis server's clock; they come back translated to
        this host's clock, so callers compare them with `time.time()` whatever the skew.
        """
        async def fetch() -> list[Any]:
            if self._cluster:
                # A cluster pipeline splits per node and cannot carry the key-less TIME:
                # ask one node for the time, then read every pool's node in parallel.
                now = await self.client.time()
                pipe = self.client.pipeline()
            else:
                pipe = self.client.pipeline(transaction=False)
                pipe.time()
            for pool in pools:
                pipe.hget(self.args.keys(pool).state, "evicted_until")
            values = await pipe.execute()
            return [now, *values] if self._cluster else values

        (sec, usec), *values = await _acall(fetch)
        pinned = self.args.clock.now_ms()
        server_now = pinned if pinned is not None else int(sec) * 1000 + int(usec) // 1000
        skew = int(time.time() * 1000) - server_now
        return {p: int(v) + skew if v and int(v) else 0 for p, v in zip(pools, values, strict=True)}
