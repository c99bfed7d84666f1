"""The LiteLLM proxy callback: every Volcengine deployment reserves before it runs.

Where each job happens (LiteLLM 1.108.7; docs/operating.md, "What happens to a request"):

- `async_pre_call_hook` (proxy only, before routing): validate the client's output cap and
  messages (400), and when *every* deployment of the requested group is evicted, raise
  `ProxyRateLimitError` so the proxy walks the configured fallbacks and otherwise answers
  429 + Retry-After.
- `async_filter_deployments` (every routing attempt): drop evicted pools (one pipelined read, or
  this process's read of under a second ago that found them routable: `PoolReads`)
  and deployments that already refused this request, so the router picks another account or
  falls back.
- `async_pre_call_deployment_hook` (after routing, before the HTTP call; the real gate): one
  atomic reservation of input + output cap, clamping the output cap to what fits. For an
  "ark-api" (Doubao) deployment, a prompt of `VQG_EXACT_COUNT_MIN_TOKENS` or more, or one whose
  cheap count × k does not fit, is counted by Ark's tokenization API and reserved as an exact
  count instead (`_exact_sizing`).
- `log_pre_api_call` (sync, just before the HTTP call) marks the attempt as sent;
  `async_post_call_streaming_iterator_hook` keeps a handle on a stream's raw chunks, to tell the
  upstream's usage from LiteLLM's local count.
- `async_log_success_event` / `async_post_call_failure_deployment_hook` /
  `async_log_failure_event`: settle real usage, release what never reached the upstream, keep
  what may have run.

Reservations are keyed by a fresh id per deployment attempt, never by `litellm_call_id`: the
client can set that id (`x-litellm-call-id`), and concurrent requests sharing it would otherwise
ride one reservation. Per-request state hangs on LiteLLM's logging object, out of the client's
reach; the metadata only carries the reservation id, checked against this process's registry.

The proxy only calls hooks defined on the registered class itself (a leaf `vars(cls)` check),
so every hook is defined here, on `QuotaGuard`, never inherited. The class is an adapter: the
sizing rule is `admission.py`'s, the gate's verbs `gate/`'s, what a call carries `calls.py`'s,
refusals and the fail mode `refusals.py`'s; `runtime.py` builds it and starts the process's
background work, which this module never does.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import sys
import time
import uuid
import weakref
from collections.abc import AsyncGenerator, Callable, Mapping
from dataclasses import replace
from typing import Any, NoReturn

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network at import

import litellm  # noqa: E402
from litellm.integrations.custom_logger import CustomLogger  # noqa: E402

from .. import admission, counting, estimate, metrics  # noqa: E402
from ..clock import SKEW, SkewAlarm  # noqa: E402
from ..config import MIN_OUTPUT_TOKENS, Settings, reservation_keep_s, settings  # noqa: E402
from ..errors import ConfigError, GateError, GuardConfigError, InvalidRequest, StoreUnavailable  # noqa: E402
from ..gate import AsyncGate, Decision, KeySpace  # noqa: E402
from ..gate.store import connect_async  # noqa: E402
from ..gate.values import corrected  # noqa: E402
from ..outcome import failure_action, read_usage  # noqa: E402
from ..volcengine.volc_tokenize import ArkTokenizer  # noqa: E402
from . import loglines, refusals  # noqa: E402
from .calls import (  # noqa: E402
    RESPONSES_TERMINAL_EVENTS,
    PoolReads,
    RequestState,
    Reservation,
    Reservations,
    call_type_name,
    deployment_id_of,
    foreign_credentials,
    group_size,
    guard_of_call,
    guards_of_group,
    llm_router,
    metadatas,
    model_group_of,
    model_info_of,
    request_state,
    stamp,
    upstream_response_id,
    upstream_responses_usage,
    upstream_sent_usage,
)
from .deployments import (  # noqa: E402
    DEFAULT_API_BASE,
    GuardedDeployment,
    api_base_of,
    guard_for_deployment,
    guarded_deployments,
    pass_through_to_ark,
)
from .refusals import QuotaRefused, QuotaStoreDown, store_failure  # noqa: E402

log = logging.getLogger("volc_quota_guard")

CLAMP_HEADER = "x-vqg-clamped-max-tokens"
LIMITS_CACHE_SIZE = 4096  # deployments whose Limits are kept (cleared when full)
RESPONSE_RECORD_S = 30 * 86_400  # a stored response's size is kept as long as Ark may store it
HEADROOM_HINT_S = 10.0  # a pool's last gate answer in this process says "near the wall" this long
FALLBACK_LOG_S = 60.0  # a deployment's tokenization failures are logged once a minute
EXACT_BACKOFF_S = 30.0  # after a failure, big prompts wait this long before asking first again
PASS_THROUGH = "allm_passthrough_route"  # the router call of /vllm, /openai, /azure, /bedrock …


def _now_ms() -> int:
    return int(time.time() * 1000)


def _ark_credentials(kwargs: Mapping[str, Any]) -> tuple[str, str]:
    """(api_base, api key) of the deployment serving this call, as LiteLLM's volcengine provider
    resolves them: its litellm_params, else VOLCENGINE_API_BASE / VOLCENGINE_API_KEY."""
    base = kwargs.get("api_base") or os.environ.get("VOLCENGINE_API_BASE") or DEFAULT_API_BASE
    key = kwargs.get("api_key") or os.environ.get("VOLCENGINE_API_KEY") or os.environ.get("ARK_API_KEY")
    return str(base), str(key or "")


class QuotaGuard(CustomLogger):
    """Reserve, clamp, route around exhausted pools, and settle real usage."""

    def __init__(self, config: Settings | None = None, gate: AsyncGate | None = None,
                 on_new_loop: Callable[[Settings], object] | None = None,
                 alarm: SkewAlarm = SKEW) -> None:
        """`on_new_loop` runs before a gate is built for a new event loop: the proxy's runtime
        starts this process's background work there (a forked worker inherits no thread).
        `alarm` is the sync thread's verdict on the store's clock (refused while it is set)."""
        super().__init__()
        self._config = config
        self.alarm = alarm
        self._fixed_gate = gate
        self._on_new_loop = on_new_loop
        self._gates: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncGate] = (
            weakref.WeakKeyDictionary())
        self.reservations = Reservations()  # this process's live reservations
        self._sees_sends = False  # log_pre_api_call fires here, so "never sent" is knowable
        self._pool_reads = PoolReads()
        self._limits_of: dict[str, tuple[GuardedDeployment, admission.Limits]] = {}  # see _limits
        self._tokenizers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ArkTokenizer] = (
            weakref.WeakKeyDictionary())
        # pool -> (monotonic time, headroom, k) of this process's last reserve answer: a hint of
        # when to ask Ark for an exact count first (the reserve stays the only authority)
        self._headroom_seen: dict[str, tuple[float, int, int]] = {}
        self._fallback_logged: dict[str, float] = {}  # model id -> when its failure was logged
        self._exact_failed_at: dict[str, float] = {}  # model id -> when Ark's tokenization last failed
        self._background: set[asyncio.Task[None]] = set()  # kept until done (a task needs a ref)
        self._renewers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Task[None]] = (
            weakref.WeakKeyDictionary())

    # ---- plumbing ------------------------------------------------------------------------

    @property
    def config(self) -> Settings:
        if self._config is None:
            self._config = settings()
        return self._config

    def gate(self) -> AsyncGate:
        """The gate for the running event loop (asyncio clients cannot cross loops)."""
        if self._fixed_gate is not None:
            return self._fixed_gate
        loop = asyncio.get_running_loop()
        found = self._gates.get(loop)
        if found is None:
            if self._on_new_loop is not None:
                self._on_new_loop(self.config)
            client = connect_async(self.config.redis_url, self.config.redis_cluster)
            found = AsyncGate(client, KeySpace(self.config.key_prefix))
            self._gates[loop] = found
        return found

    # ---- renewals: a running request's reservation never reaches its deadline ----------------

    def _call_s(self, kwargs: dict[str, Any]) -> float:
        """How long LiteLLM may let this call run: its `timeout`, else LiteLLM's default, never
        beyond VQG_MAX_CALL_SECONDS (the sync keeps packages expiring within that of a snapshot's
        validity off the wall). The call's timeout is capped there; a stream, whose timeout is a
        per-read one, is cut there by the streaming hook."""
        timeout = kwargs.get("timeout")
        if isinstance(timeout, str):  # LiteLLM reads "100" as 100 s (red-team, stop 37)
            try:
                timeout = float(timeout)
            except ValueError:
                timeout = None
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < math.inf:
            timeout = litellm.request_timeout
        most = self.config.max_call_seconds
        if not isinstance(timeout, int | float) or not timeout <= most:
            timeout = most
        kwargs["timeout"] = timeout  # a call running past it could outlive a package's expiry
        return float(timeout)

    def _keep_renewing(self) -> None:
        loop = asyncio.get_running_loop()
        task = self._renewers.get(loop)
        if task is None or task.done():
            self._renewers[loop] = loop.create_task(self._renew_running())

    async def _renew_running(self) -> None:
        """Every third of a TTL, move the deadline of each reservation this process still holds
        a TTL ahead. A request that outlived its deadline was counted whole at the deadline, on
        that Beijing day, while Ark collected it on the day it ended (a 30-minute stream across
        midnight burned 552,000 tokens past the next day's cap): only a crashed process's
        reservations expire now."""
        ttl_s = self.config.reservation_ttl_seconds
        period = max(1.0, ttl_s / 3)
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for res in self.reservations.values():
                if now - res.created < period or now > res.keep_until - ttl_s:
                    continue  # young: far from its deadline; or past the call's own timeout
                try:
                    await self.gate().renew(res.pool, res.rid, ttl_s * 1000)
                except Exception as exc:  # noqa: BLE001  the deadline stands: counted whole then
                    log.warning("⚠️ [RENEW] %s call=%s: its reservation's deadline could not be moved "
                                "(%s); if the request outlives it, it counts as consumed then",
                                res.pool, res.call_id, type(exc).__name__)

    def tokenizer(self) -> ArkTokenizer:
        """The tokenization API client of the running event loop (its cache is per loop)."""
        loop = asyncio.get_running_loop()
        found = self._tokenizers.get(loop)
        if found is None:
            found = self._tokenizers[loop] = ArkTokenizer()
        return found

    @property
    def fail_open(self) -> bool:
        return self.config.fail_mode == "open"

    def _until_sync_s(self) -> int:
        return self.config.sync_low_interval_minutes * 60

    # ---- pre-call (proxy) ------------------------------------------------------------------

    async def async_pre_call_hook(self, user_api_key_dict: Any, cache: Any, data: dict,
                                  call_type: Any) -> dict | None:
        """Validate, and refuse up front when every deployment of the group is evicted."""
        try:
            return await self._pre_call(data, call_type_name(call_type))
        except InvalidRequest as exc:
            from fastapi import HTTPException

            raise HTTPException(status_code=400, detail={"error": str(exc)}) from None
        except StoreUnavailable as exc:
            store_failure(self.fail_open, "quota store unreachable, request passes unguarded",
                          "⛔ [STORE-DOWN] quota store unreachable, request refused",
                          refusals.store_down_http(data.get("model"), exc), exc)
            return None
        except litellm.RateLimitError:
            raise
        except Exception:  # noqa: BLE001  never a 500 from the guard; the deployment hook still guards
            log.exception("pre-call check failed; the deployment gate still applies")
            return None

    async def _pre_call(self, data: dict, call_type: str) -> dict | None:
        if call_type == "pass_through_endpoint":
            self._refuse_pass_through_to_ark()
        router = llm_router()
        model = data.get("model")
        if router is None or not isinstance(model, str):
            return None
        if "," in model:  # LiteLLM's fan-out: one client request, several upstream calls
            self._refuse_fan_out(router, model, data)
            return None
        guarded, all_guarded = guards_of_group(router, model, data)
        if not guarded or call_type in admission.FREE_CALL_TYPES:
            return None
        route = admission.route_of(call_type)  # a route the guard cannot settle is a 400 here
        admission.validate(data, route)  # a malformed request is the client's 400, before routing
        if not all_guarded:
            return None  # unguarded deployments remain: the filter routes around evicted pools
        evicted = await self._evicted([g.pool for g in guarded])
        now = _now_ms()
        if all(until > now for until in evicted.values()):
            await self._refuse_group(model, guarded, evicted, data, route)
        return None

    @staticmethod
    def _refuse_pass_through_to_ark() -> None:
        proxy_server = sys.modules.get("litellm.proxy.proxy_server")
        router = llm_router()
        try:
            bases = [api_base_of(d.get("litellm_params") or {})
                     for d, _ in guarded_deployments(router.get_model_list() if router else ())]
        except ConfigError:
            bases = []  # the deployment hook refuses those deployments' own calls
        target = pass_through_to_ark(os.environ, getattr(proxy_server, "general_settings", None), bases)
        if target is not None:
            log.warning("⛔ [PASS-THROUGH] refused: %s points LiteLLM's pass-through routes at Ark, "
                        "where no reservation guards them", target)
            raise InvalidRequest(target, (
                f"{target} points LiteLLM's pass-through routes at Ark, where the free-quota guard "
                "can neither reserve nor settle a call: pass-through requests are refused on this "
                "proxy; use /v1/chat/completions, /v1/responses, /v1/embeddings or /v1/messages"))

    @staticmethod
    def _refuse_fan_out(router: Any, model: str, data: Mapping[str, Any]) -> None:
        for name in (m.strip() for m in model.split(",")):
            if name and guards_of_group(router, name, data)[0]:
                raise InvalidRequest("model", (
                    f"model '{model}' names several models at once; '{name}' is a Volcengine model "
                    "guarded by the free-quota guard, which reserves one upstream call per request: "
                    "send one request per model"))

    async def _refuse_group(self, model: str, guarded: list[GuardedDeployment],
                            evicted: Mapping[str, int], data: Mapping[str, Any],
                            route: admission.Route) -> None:
        from litellm.proxy.common_utils.proxy_rate_limit_error import ProxyRateLimitError

        wait = min(refusals.retry_after_s(u, _now_ms(), self._until_sync_s()) for u in evicted.values())
        reserve = await self._least_for_log(data, route, guarded[0])
        metrics.blocked(g.pool for g in guarded)
        for g in guarded:
            d = await self.gate().status(g.pool)
            log.warning(loglines.pre_block(g.upstream_model, d, reserve, reason="evicted",
                                           pool=g.pool, group=model,
                                           call=data.get("litellm_call_id")))
        raise ProxyRateLimitError(
            detail={"error": refusals.message(model, [g.pool for g in guarded], "evicted", wait)},
            headers={"retry-after": str(wait)}, model=model, llm_provider="volcengine")

    async def _least_for_log(self, data: Mapping[str, Any], route: admission.Route,
                             guard: GuardedDeployment) -> int:
        try:
            sizing = await self._size(data, route, self._limits(guard), None)
        except Exception:  # noqa: BLE001
            return 0
        return sizing.input_tokens + sizing.least_output

    def _limits(self, guard: GuardedDeployment) -> admission.Limits:
        # Per guard object: `guard_of_call` hands out the same one while the router keeps the
        # deployment unchanged, so this is computed once per deployment (LiteLLM's model map
        # look-ups cost ~0.13 ms); a guard built from the call's own fields is a new object.
        hit = self._limits_of.get(guard.model_id)
        if hit is not None and hit[0] is guard:
            return hit[1]
        limits = admission.limits_for(guard.model_info, guard.upstream_model,
                                      default_output=self.config.default_output_tokens,
                                      min_output=MIN_OUTPUT_TOKENS)
        if len(self._limits_of) >= LIMITS_CACHE_SIZE:
            self._limits_of.clear()
        self._limits_of[guard.model_id] = (guard, limits)
        return limits

    @staticmethod
    async def _size(params: Mapping[str, Any], route: admission.Route, limits: admission.Limits,
                    chain: int | None) -> admission.Sizing:
        if estimate.is_big(admission.upstream_view(params)):
            return await asyncio.to_thread(admission.size, params, route, limits, chain)
        return admission.size(params, route, limits, chain)

    # ---- routing ---------------------------------------------------------------------------

    async def async_filter_deployments(self, model: str, healthy_deployments: list,
                                       messages: list | None, request_kwargs: dict | None = None,
                                       parent_otel_span: Any = None) -> list[dict]:
        """Drop evicted pools and deployments that refused this request; never a bare error."""
        try:
            return await self._filter(model, healthy_deployments, request_kwargs or {})
        except (QuotaRefused, QuotaStoreDown):
            raise
        except Exception:  # noqa: BLE001  a ValueError here would reach the client as a 500
            log.exception("deployment filter failed; the deployment gate still applies")
            return healthy_deployments

    async def _filter(self, model: str, healthy: list, request_kwargs: Mapping[str, Any]) -> list[dict]:
        guards: dict[int, GuardedDeployment] = {}
        for i, dep in enumerate(healthy):
            try:
                g = guard_for_deployment(dep)
            except GuardConfigError:
                continue  # left to the deployment gate, which refuses it with a clear message
            if g is not None:
                guards[i] = g
        if not guards:
            return healthy
        state = request_state(request_kwargs)
        try:
            evicted = await self._evicted(sorted({g.pool for g in guards.values()}))
        except StoreUnavailable as exc:
            unguarded = [d for i, d in enumerate(healthy) if i not in guards]
            if unguarded and not self.fail_open:
                return unguarded  # fail-closed: the guarded ones are out, the rest can serve
            store_failure(self.fail_open, "quota store unreachable, routing unguarded",
                          f"⛔ [STORE-DOWN] quota store unreachable, model {model} refused",
                          refusals.store_down(model, exc), exc)
            return healthy
        now = _now_ms()
        kept = [d for i, d in enumerate(healthy)
                if i not in guards or (evicted[guards[i].pool] <= now
                                       and guards[i].model_id not in state.refused)]
        if kept or not healthy:
            return kept
        gone = list(guards.values())
        wait = min(refusals.retry_after_s(evicted[g.pool], now, self._until_sync_s()) for g in gone)
        why = "evicted" if any(evicted[g.pool] > now for g in gone) else "request does not fit"
        metrics.blocked(g.pool for g in gone if g.model_id not in state.refused)
        for g in gone:
            if g.model_id not in state.refused:  # refusals were logged where they happened
                d = await self.gate().status(g.pool)
                log.warning(loglines.pre_block(g.upstream_model, d, 0, reason="evicted",
                                               pool=g.pool, group=model,
                                               call=request_kwargs.get("litellm_call_id")))
        raise refusals.refused(model, [g.pool for g in gone], why, wait)

    async def _evicted(self, pools: list[str]) -> dict[str, int]:
        """Each pool's eviction deadline (host clock): this process's read of less than a second
        ago where it showed every pool routable (`PoolReads`), else one pipelined round trip."""
        reads = self._pool_reads
        found = reads.find(pools)
        if found is None:
            since = reads.mark()
            try:
                found = await self.gate().evicted_until(pools)
            except BaseException:
                # find() may have just made an old read young for the requests behind this one:
                # a failed refresh must not leave it answering routing (fail-closed routes around
                # guarded deployments on every request while the store is down).
                for pool in pools:
                    reads.forget(pool)
                raise
            reads.keep(found, since)
        return found

    def _saw(self, pool: str, d: Decision) -> None:
        """A gate answer that takes the pool out of routing: its routing read is stale now."""
        if d.evicted_until:
            self._pool_reads.forget(pool)

    # ---- the gate --------------------------------------------------------------------------

    async def async_pre_call_deployment_hook(self, kwargs: dict[str, Any],
                                             call_type: Any) -> dict | None:
        """Reserve input + output cap for this deployment attempt; clamp or refuse."""
        name = call_type_name(call_type)
        try:
            return await self._reserve(kwargs, name)
        except litellm.BadRequestError as exc:
            if name == PASS_THROUGH:
                raise refusals.as_http(exc) from None
            raise
        except (QuotaRefused, QuotaStoreDown):
            raise
        except Exception as exc:  # noqa: BLE001  an unguarded pass needs fail-open
            store_failure(self.fail_open, "guard error, request passes unguarded",
                          "⛔ guard error, request refused (fail-closed)",
                          refusals.store_down(model_group_of(kwargs), exc), exc, traceback=True)
            return None

    async def _reserve(self, kwargs: dict[str, Any], call_type: str) -> dict | None:
        try:
            guard = guard_of_call(kwargs)
        except GuardConfigError as exc:
            raise refusals.bad_request(f"quota guard misconfigured: {exc}", kwargs.get("model")) from None
        if guard is None:
            return None
        if guard.model_id and not model_info_of(kwargs).get("id"):
            # A call made from a deployment's litellm_params alone (a health check): its later
            # hooks find the reservation by this id (`calls.built_from`).
            kwargs["model_info"] = {**(kwargs.get("model_info") or {}), "id": guard.model_id}
        state = request_state(kwargs)
        group = model_group_of(kwargs)
        foreign = foreign_credentials(kwargs)
        if foreign is not None:  # a client's key or endpoint a fallback carried past the pre-call check
            raise refusals.bad_request(
                f"{foreign}: a request may not choose the Ark account or endpoint of a guarded "
                "deployment (the guard reserves in the deployment's own account); it is refused",
                group, foreign)
        if call_type in admission.FREE_CALL_TYPES:
            return None
        try:
            route = admission.route_of(call_type)
            live = state.live.get(guard.model_id)
            sizing = None
            if live is not None and live.rid in self.reservations:
                why = "retried"
                if live.route == "messages" and route.kind == "chat" and not live.handed_over \
                        and not live.sent:
                    # The hook runs twice on /v1/messages: the translated chat call rides the
                    # reservation once, never with more choices or input than it was sized for.
                    if admission.choices(admission.upstream_view(kwargs)) > live.choices:
                        raise InvalidRequest("n", "n changed between the two halves of one call")
                    sizing = await self._size(kwargs, route, self._limits(guard), None)
                    if sizing.input_tokens <= live.input_tokens:
                        live.handed_over = True
                        return stamp(kwargs, route, live)
                    why = "resized"  # the translation grew the call: it is reserved afresh
                # A retry of this request on the same deployment: the earlier attempt may have
                # reached Ark (an error LiteLLM raised after the answer, such as a failed JSON
                # schema check), and its reservation is about to lose its stash. Settle it now.
                await self._retire(live, state, why)
            chain = await self._known_chain(guard, kwargs, route)
            if sizing is None or chain:
                sizing = await self._size(kwargs, route, self._limits(guard), chain)
            sizing.check_fits()
        except InvalidRequest as exc:
            raise refusals.bad_request(str(exc), group, exc.param) from None
        except StoreUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001  a request the guard cannot size never passes
            log.exception("⛔ request could not be sized, refused")
            raise refusals.bad_request(f"the quota guard cannot size this request ({type(exc).__name__})",
                                       group, "body") from None
        untrusted = self.alarm.reason
        if untrusted is not None and not self.fail_open:
            log.error("⛔ [CLOCK] %s refused: %s call=%s", guard.pool, untrusted,
                      kwargs.get("litellm_call_id"))
            raise refusals.clock_untrusted(group, untrusted)
        rid = uuid.uuid4().hex  # never the client-settable call id: see docs/operating.md
        call_id = str(kwargs.get("litellm_call_id") or "")
        ttl_ms = self.config.reservation_ttl_seconds * 1000
        limits = self._limits(guard)
        # A DeepSeek count is exact offline: the gate's exact class (its own k and miscount
        # ceiling); a Doubao one becomes exact where Ark's tokenization API is asked.
        exact, asked = counting.counts_exactly(limits.method), False
        if limits.method == "ark-api" and (self._exact_by_size(guard, sizing)
                                           or self._exact_first(guard.pool, sizing)):
            asked = True
            found = await self._exact_sizing(guard, kwargs, route, limits, chain, sizing)
            if found is not None:
                sizing, exact = found, True
        call_s = self._call_s(kwargs)
        if kwargs.get("stream") is True:  # its timeout is per read: it runs to the cap (then cut)
            call_s = self.config.max_call_seconds
        # Ark may run the call on after the proxy gives up on it: a package expiring before its
        # output could be written at the slowest rate is off its wall.
        run_ms = self.config.call_run_ms(call_s, sizing.output)
        try:
            d = await self.gate().reserve(guard.pool, rid, sizing.wanted, sizing.least, ttl_ms,
                                          input_tokens=sizing.input_tokens, exact=exact, run_ms=run_ms)
            if limits.method == "ark-api" and not asked and d.refused_at_wall:
                # The cheap count × k did not fit: Ark's exact count may (a refusal wrote nothing
                # under this id, so it is asked again with the exact count).
                found = await self._exact_sizing(guard, kwargs, route, limits, chain, sizing)
                if found is not None:
                    sizing, exact = found, True
                    d = await self.gate().reserve(guard.pool, rid, sizing.wanted, sizing.least,
                                                  ttl_ms, input_tokens=sizing.input_tokens, exact=True,
                                                  run_ms=run_ms)
        except (StoreUnavailable, GateError) as exc:
            if not self.fail_open:  # refused: a reserve that ran with its answer lost holds quota
                self._release_later(guard.pool, rid)
            store_failure(self.fail_open, f"quota store unreachable, {guard.pool} passes unguarded",
                          f"⛔ [STORE-DOWN] quota store unreachable, {guard.pool} refused",
                          refusals.store_down(group, exc), exc)
            return None
        inp = sizing.input_tokens
        self._saw(guard.pool, d)
        if limits.method == "ark-api":  # the hint only ark-api deployments read (_exact_first)
            self._headroom_seen[guard.pool] = (time.monotonic(), d.headroom, d.correction_ppm)
        metrics.reserved(guard.pool, d, sizing.output)
        if not d.admitted:  # what it needed: the prompt as the gate holds it (k applied) + least output
            self._refuse(kwargs, guard, group, state, d,
                         max(d.input_reserved, inp) + sizing.least_output, call_id)
        per_choice = sizing.granted_per_choice(d)
        res = Reservation(rid, guard.pool, guard.model_id, guard.upstream_model, group, call_id,
                          inp, sizing.per_choice, d.amount,
                          per_choice if per_choice < sizing.per_choice else None,
                          state=state, choices=sizing.choices, route=route.kind)
        res.call_until = res.created + call_s
        self.reservations.remember(res, reservation_keep_s(self.config.reservation_ttl_seconds, call_s))
        self._keep_renewing()
        state.live[guard.model_id] = res
        if res.clamped_to is not None:
            state.clamped_to = res.clamped_to
            log.warning("✂️ [CLAMP] %s max_tokens %d -> %d (headroom %s) pool=%s group=%s call=%s",
                        guard.upstream_model, sizing.per_choice, per_choice,
                        f"{d.headroom + d.amount:,}", guard.pool, group, call_id)
        return stamp(kwargs, route, res)

    def _exact_by_size(self, guard: GuardedDeployment, sizing: admission.Sizing) -> bool:
        """A big prompt is counted exactly wherever the wall is, unless Ark's tokenization API
        failed for this deployment in the last EXACT_BACKOFF_S (then only a refusal asks: an API
        that is down costs its timeout where the count changes a decision, not on every big prompt)."""
        if sizing.input_tokens < self.config.exact_count_min_tokens:
            return False
        failed = self._exact_failed_at.get(guard.model_id)
        return failed is None or time.monotonic() - failed >= EXACT_BACKOFF_S

    def _exact_first(self, pool: str, sizing: admission.Sizing) -> bool:
        """Whether this process's last answer for `pool` (a few seconds old at most) says the
        cheap count × k would not fit: then Ark is asked before the first reserve, saving one."""
        seen = self._headroom_seen.get(pool)
        if seen is None or time.monotonic() - seen[0] > HEADROOM_HINT_S:
            return False
        _, headroom, k = seen
        return corrected(sizing.input_tokens, k) + sizing.output > headroom

    async def _exact_sizing(self, guard: GuardedDeployment, kwargs: Mapping[str, Any],
                            route: admission.Route, limits: admission.Limits, chain: int | None,
                            cheap: admission.Sizing) -> admission.Sizing | None:
        """The sizing with Ark's tokenization API counting each text (cached per text), or None
        when Ark did not answer (the caller keeps the cheap count × k: never less)."""
        try:
            collect = admission.ExactCounts()
            await self._size(kwargs, route, replace(limits, exact=collect), chain)
            texts = list(dict.fromkeys(collect.texts))
            base, key = _ark_credentials(kwargs)
            counts = await self.tokenizer().count_many(base, key, guard.upstream_model, texts) \
                if key else None
            if counts is None:
                self._exact_failed(guard, self.tokenizer().last_error if key else "no API key")
                return None
            exact = admission.ExactCounts(dict(zip(texts, counts, strict=True)))
            sizing = await self._size(kwargs, route, replace(limits, exact=exact), chain)
        except Exception as exc:  # noqa: BLE001  the cheap count stands: never a 500 from here
            log.exception("exact count failed")
            self._exact_failed(guard, type(exc).__name__)
            return None
        metrics.exact_count(guard.pool, "exact")
        log.info("🔢 [EXACT] %s: input %d (cheap) -> %d (Ark's count + template) pool=%s call=%s",
                 guard.upstream_model, cheap.input_tokens, sizing.input_tokens, guard.pool,
                 kwargs.get("litellm_call_id"))
        return sizing

    def _exact_failed(self, guard: GuardedDeployment, why: str) -> None:
        metrics.exact_count(guard.pool, "fallback")
        now = time.monotonic()
        self._exact_failed_at[guard.model_id] = now
        if now - self._fallback_logged.get(guard.model_id, -FALLBACK_LOG_S) >= FALLBACK_LOG_S:
            self._fallback_logged[guard.model_id] = now
            log.warning("⚠️ [EXACT-FALLBACK] %s: Ark's tokenization API failed (%s); reserving at "
                        "the cheap count × k (logged once a minute) pool=%s deployment=%s",
                        guard.upstream_model, why, guard.pool, guard.model_id)

    async def _known_chain(self, guard: GuardedDeployment, kwargs: Mapping[str, Any],
                           route: admission.Route) -> int | None:
        """What the guard recorded for the stored conversation a follow-up names."""
        if route.kind != "responses":
            return None
        prev = upstream_response_id(admission.upstream_view(kwargs).get("previous_response_id"))
        if prev is None:
            return None
        try:
            return await self.gate().response_chain(prev)
        except ValueError:
            return None

    def _refuse(self, kwargs: Mapping[str, Any], guard: GuardedDeployment, group: str,
                state: RequestState, d: Decision, least: int, call_id: str) -> None:
        state.refused.add(guard.model_id)
        log.warning(loglines.pre_block(guard.upstream_model, d, least, pool=guard.pool,
                                       group=group, call=call_id))
        why, wait = refusals.gate_refusal(d, least, _now_ms(), self._until_sync_s())
        size = group_size(kwargs)
        tried_all = size is not None and len(state.refused) >= size
        raise refusals.refused(group, [guard.pool], why, wait,
                               num_retries=0 if (size is None or size <= 1 or tried_all) else None)

    def log_pre_api_call(self, model: Any, messages: Any, kwargs: Any) -> None:
        """LiteLLM is about to send the HTTP request: from now on the upstream may consume."""
        try:
            res = self.reservations.stashed(kwargs, deployment_id_of(kwargs))
            if res is not None:
                res.sent = True
                self._sees_sends = True
        except Exception:  # noqa: BLE001
            log.exception("pre-API-call hook failed")

    # ---- response headers ------------------------------------------------------------------

    async def async_post_call_response_headers_hook(self, data: dict, user_api_key_dict: Any,
                                                    response: Any,
                                                    request_headers: dict[str, str] | None = None,
                                                    litellm_call_info: dict | None = None,
                                                    ) -> dict[str, str] | None:
        """Tell the client when its output cap was lowered to fit the free quota."""
        try:
            logging_obj = data.get("litellm_logging_obj")
            state = getattr(logging_obj, "_vqg_state", None)
            if isinstance(state, RequestState) and state.clamped_to is not None:
                return {CLAMP_HEADER: str(state.clamped_to)}
        except Exception:  # noqa: BLE001
            log.exception("response headers hook failed")
        return None

    # ---- streams -------------------------------------------------------------------------

    async def async_post_call_streaming_iterator_hook(self, user_api_key_dict: Any, response: Any,
                                                      request_data: dict) -> AsyncGenerator[Any, None]:
        """Pass the stream through untouched, noting whether the upstream sent a usage frame, and
        cut it at the call's deadline.

        Without that frame LiteLLM fills the usage in by counting tokens locally; that count is
        an estimate and must not replace the reservation (the upstream may have used more).
        LiteLLM's timeout is a per-read one: a stream whose chunks keep coming would run past
        VQG_MAX_CALL_SECONDS, and past a package expiry the sync planned for (a 105 s stream
        against a 70 s cap, one that outlived an expiry billed 35,636; red-team, stop 37).
        """
        found = getattr(request_data.get("litellm_logging_obj"), "_vqg_state", None)
        state = found if isinstance(found, RequestState) else RequestState()
        live = state.live
        if live:
            state.stream = response  # LiteLLM's wrapper keeps the raw chunks as `.chunks`
        deadline = min((res.call_until for res in live.values()), default=math.inf)
        chunks = aiter(response)
        while True:
            left = deadline - time.monotonic()
            try:  # the read runs in this task (LiteLLM's iterators keep per-task context)
                async with asyncio.timeout(None if left == math.inf else max(0.0, left)) as timer:
                    item = await anext(chunks)
            except StopAsyncIteration:
                return
            except TimeoutError:
                if not timer.expired():
                    raise  # the stream's own
                await self._cut(response, state)
            if live and getattr(item, "type", None) in RESPONSES_TERMINAL_EVENTS:
                done = getattr(item, "response", None)
                state.responses_usage = upstream_responses_usage(getattr(done, "usage", None))
                if item.type == "response.completed":
                    for res in list(live.values()):  # before the client can send a follow-up
                        await self._record_stored(res, done, trusted=state.responses_usage)
            yield item

    async def _cut(self, response: Any, state: RequestState) -> NoReturn:
        """End a stream at its deadline: close the upstream connection, settle each reservation
        it holds whole, as a call Ark may still run (a fallback LiteLLM switched to mid-stream
        has no failure hook of its own: red-team, stop 38), and fail the request."""
        held = [res for res in state.live.values() if res.rid in self.reservations]
        for res in held:
            log.warning("⏱️ [DEADLINE] %s call=%s: the stream ran %.0f s, past VQG_MAX_CALL_SECONDS "
                        "(%s s); cut, its reservation counts whole pool=%s", res.upstream_model,
                        res.call_id, time.monotonic() - res.created, f"{self.config.max_call_seconds:g}",
                        res.pool)
            metrics.stream_cut(res.pool)
            try:
                await self._retire(res, state, "deadline")
            except Exception:  # noqa: BLE001  it then expires as consumed: never a pass
                log.exception("settling a cut stream failed; the reservation expires as consumed")
        close = getattr(response, "aclose", None)
        if close is not None:
            try:
                await close()
            except Exception:  # noqa: BLE001  the connection is dropped anyway
                log.debug("closing a cut stream failed", exc_info=True)
        model = held[0].upstream_model if held else ""
        raise litellm.Timeout(
            message=f"quota guard: the stream ran past VQG_MAX_CALL_SECONDS "
                    f"({self.config.max_call_seconds:g} s) and was cut", model=model,
            llm_provider="volcengine")

    # ---- stored responses ----------------------------------------------------------------

    async def async_post_call_success_deployment_hook(self, request_data: dict, response: Any,
                                                      call_type: Any) -> Any | None:
        """Record a stored response's size before the client gets its id (a follow-up naming it
        may arrive before the success event settles)."""
        try:
            model_id = deployment_id_of(request_data)
            res = self.reservations.stashed(request_data, model_id) if model_id else None
            if res is not None:
                await self._record_stored(res, response)
        except Exception:  # noqa: BLE001  follow-ups are then sized as unknown: safe
            log.exception("recording a stored response failed")
        return None

    # ---- settle ----------------------------------------------------------------------------

    async def async_log_success_event(self, kwargs: dict, response_obj: Any, start_time: Any,
                                      end_time: Any) -> None:
        """Settle the serving deployment's reservation with the usage the upstream reported."""
        try:
            await self._settle_success(kwargs, response_obj)
        except StoreUnavailable as exc:
            log.error("⛔ [STORE-DOWN] usage not recorded (the reservation, if any, expires as "
                      "consumed): %s", exc)
        except Exception:  # noqa: BLE001  logging must never fail the request
            log.exception("settle after success failed; the reservation expires as consumed")

    async def _settle_success(self, kwargs: Mapping[str, Any], response_obj: Any) -> None:
        model_id = deployment_id_of(kwargs)
        res = self.reservations.stashed(kwargs, model_id) if model_id else None
        if res is None:
            try:
                guard = guard_of_call(kwargs)
            except GuardConfigError:
                guard = None
            if guard is None:
                return
            res = Reservation(uuid.uuid4().hex, guard.pool, guard.model_id, guard.upstream_model,
                              model_group_of(kwargs), str(kwargs.get("litellm_call_id") or ""),
                              0, 0, 0, None)  # unreserved: count what it used, nothing held
        self.reservations.forget(res)
        if kwargs.get("cache_hit") is True and res.granted:
            await self._release(res, "cache hit")
            return
        disconnected = any(md.get("client_disconnected") is True for md in metadatas(kwargs))
        local_count = kwargs.get("stream") is True and not upstream_sent_usage(res.state)
        reading = read_usage(response_obj,
                             estimated=disconnected or local_count)
        actual = reading.tokens
        # The upstream may bill more than a local estimate: the gate counts at least what a
        # settle without usage would (the reservation, its prompt at the miscount ceiling).
        estimated = reading.source == "estimated"
        if reading.source == "unavailable" and not res.granted:
            log.warning("📊 [Usage] %s: no usage reported and nothing reserved pool=%s call=%s",
                        res.upstream_model, res.pool, res.call_id)
            return
        # A call of several choices does not teach k: Ark may read its prompt once or n times.
        measured_input = reading.prompt if reading.source == "measured" and res.choices <= 1 else None
        d = await self.gate().settle(res.pool, res.rid, actual, measured_input, estimated)
        self._log_usage(res, reading.tokens, d, reading.source, reading.cached)
        await self._record_stored(res, response_obj, trusted=not estimated)

    async def _record_stored(self, res: Reservation, response_obj: Any, trusted: bool = True) -> None:
        """A Responses API answer may be stored: the conversation it ends (its input, which
        holds any earlier chain, plus its output) sizes follow-ups that name it. Without
        measured usage the reservation's size stands in (it covered the whole call)."""
        if getattr(response_obj, "object", None) != "response":
            return
        rid = upstream_response_id(getattr(response_obj, "id", None))
        reading = read_usage(response_obj)
        tokens = reading.tokens if trusted and reading.source == "measured" and reading.tokens \
            else res.granted
        if rid is not None and tokens > 0:
            await self.gate().remember_response(rid, tokens, RESPONSE_RECORD_S)

    async def async_post_call_failure_deployment_hook(self, request_data: Mapping[str, object],
                                                      exception: Exception, call_type: Any,
                                                      fallback_depth: int | None = None) -> None:
        """Per failed attempt: release if the upstream surely consumed nothing, else keep."""
        try:
            await self._settle_failure(request_data, exception)
        except StoreUnavailable as exc:
            log.error("⛔ [STORE-DOWN] failed attempt not settled (its reservation expires as "
                      "consumed): %s", exc)
        except Exception:  # noqa: BLE001
            log.exception("settle after failure failed; the reservation expires as consumed")

    async def _retire(self, res: Reservation, state: RequestState, why: str) -> None:
        """A reservation no settle will reach (a retry replaces it, or the request failed after
        its call): released if it surely never reached the upstream, else kept whole as consumed."""
        self.reservations.forget(res, state)
        if self._sees_sends and not res.sent:
            await self._release(res, f"{why} before the request was sent")
            return
        d = await self.gate().settle(res.pool, res.rid, None, running=True)
        self._log_usage(res, None, d, "unavailable", 0, outcome=why)

    async def async_post_call_failure_hook(self, request_data: dict, original_exception: Exception,
                                           user_api_key_dict: Any, traceback_str: str | None = None) -> None:
        """The request failed for good. An attempt LiteLLM failed after its upstream call (a failed
        JSON schema check) has no per-attempt failure hook: settle it here, not at its expiry."""
        try:
            for res in self.reservations.all_stashed(request_data):  # the proxy's copy of the call
                await self._retire(res, res.state or RequestState(), type(original_exception).__name__)
        except Exception:  # noqa: BLE001  it then expires as consumed: never a pass
            log.exception("settle after the failed request failed; the reservation expires as consumed")

    async def _settle_failure(self, kwargs: Mapping[str, Any], exc: BaseException) -> None:
        model_id = deployment_id_of(kwargs)
        res = self.reservations.stashed(kwargs, model_id) if model_id else None
        if res is None:
            return
        state = request_state(kwargs)
        if failure_action(exc) == "release" and (res.sent or not self._sees_sends):
            self.reservations.forget(res, state)
            await self._release(res, f"{type(exc).__name__} before the upstream accepted")
        else:
            await self._retire(res, state, type(exc).__name__)

    async def async_log_failure_event(self, kwargs: dict, response_obj: Any, start_time: Any,
                                      end_time: Any) -> None:
        """A failure the per-attempt hook did not see (a stream cut mid-way): keep as consumed."""
        try:
            model_id = deployment_id_of(kwargs)
            res = self.reservations.stashed(kwargs, model_id) if model_id else None
            if res is None:
                return
            self.reservations.forget(res, request_state(kwargs))
            d = await self.gate().settle(res.pool, res.rid, None, running=True)
            self._saw(res.pool, d)
            if d.reason == "settled":
                exc = kwargs.get("exception")
                self._log_usage(res, None, d, "unavailable", 0,
                                      outcome=type(exc).__name__ if exc is not None else "failure")
        except Exception:  # noqa: BLE001
            log.exception("settle after failure event failed; the reservation expires as consumed")

    def _release_later(self, pool: str, rid: str) -> None:
        """Release `rid` in the background, best effort: a reserve whose answer was lost (the
        store timed out) may have run, and would hold its tokens a TTL, then count them; the
        release also marks the id, so a reserve that lands later finds it resolved."""
        async def release() -> None:
            try:
                d = await self.gate().release(pool, rid)
                if d.reason == "released":
                    log.info("↩️ [RELEASE] %s: -%d (a reserve whose answer was lost) pool=%s",
                             rid, d.amount, pool)
            except Exception as exc:  # noqa: BLE001  the store is still down: it expires as consumed
                log.warning("⚠️ [STORE-DOWN] could not release %s after a failed reserve (%s): if it "
                            "ran, it counts as consumed at its deadline", rid, exc)
        task = asyncio.get_running_loop().create_task(release())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _release(self, res: Reservation, why: str) -> None:
        d = await self.gate().release(res.pool, res.rid)
        log.info("↩️ [RELEASE] %s:%s: -%d (%s) pool=%s call=%s", res.upstream_model,
                 loglines.short_hash(res.pool), d.amount, why, res.pool, res.call_id)

    def _log_usage(self, res: Reservation, tokens: int | None, d: Decision, source: str,
                   cached: int, **fields: object) -> None:
        self._saw(res.pool, d)
        line = loglines.usage(res.upstream_model, res.pool, tokens, d, d.balance_at_sync, source=source,
                              counted=d.amount, reserved=res.granted, cached=cached or None,
                              group=res.model_group, call=res.call_id,
                              overrun="yes" if d.overrun else None, **fields)
        (log.warning if d.overrun else log.info)(line)
