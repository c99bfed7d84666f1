"""The LiteLLM hook's logic, driven directly (no proxy): pools, reserve, clamp, refuse, settle."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import time
import types
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # before litellm: no network

import litellm  # noqa: E402
import pytest  # noqa: E402
import redis  # noqa: E402
import yaml  # noqa: E402

from volc_quota_guard import metrics  # noqa: E402
from volc_quota_guard.admission import EXACT_DRIFT_TOKENS, ROUTES, pin_output  # noqa: E402
from volc_quota_guard.clock import SkewAlarm  # noqa: E402
from volc_quota_guard.config import load_settings  # noqa: E402
from volc_quota_guard.errors import ConfigError  # noqa: E402
from volc_quota_guard.gate import AsyncGate, Decision, Gate, Snapshot  # noqa: E402
from volc_quota_guard.gate.keys import KeySpace  # noqa: E402
from volc_quota_guard.gate.store import connect_async  # noqa: E402
from volc_quota_guard.outcome import failure_action, read_usage  # noqa: E402
from volc_quota_guard.proxy import (
    calls,  # noqa: E402
    loglines,  # noqa: E402
    refusals,  # noqa: E402
)
from volc_quota_guard.proxy import hook as hook_mod  # noqa: E402
from volc_quota_guard.proxy.deployments import (  # noqa: E402
    GuardConfigError,
    guard_for,
    guard_for_deployment,
    pools_from_litellm_config,
    pools_from_model_list,
)
from volc_quota_guard.proxy.hook import QuotaGuard  # noqa: E402
from volc_quota_guard.proxy.refusals import QuotaRefused, QuotaStoreDown  # noqa: E402
from volc_quota_guard.sync import SyncService  # noqa: E402
from volc_quota_guard.volcengine.packages import PoolSpec  # noqa: E402

TEST_REDIS_URL = os.environ.get("VQG_TEST_REDIS_URL") or None  # as tests/conftest.py

POOL = "acct-a/m-1"


# ---- pure helpers ---------------------------------------------------------------------------


def kept_whole(st: Mapping[str, int]) -> int:
    """What the gate counts for the one in-flight reservation if its usage never comes: the
    reservation, its prompt at its class's miscount ceiling (cheap 3.0, exact 1.5; gate.md)."""
    return (st["inflight"] + max(0, -(-st["inflight_est"] * 3) - st["inflight_est_res"])
            + max(0, -(-st["inflight_xest"] * 3 // 2) - st["inflight_xest_res"]))


def test_pool_comes_from_the_deployment_config_only() -> None:
    """Account from model_info (default 'default'), model from litellm_params without the prefix."""
    g = guard_for_deployment({"litellm_params": {"model": "volcengine/deepseek-v4-flash-ga-260731"},
                              "model_info": {"id": "d1", "vqg_account": "acct-a"}})
    assert g is not None and g.pool == "acct-a/deepseek-v4-flash-ga-260731" and g.model_id == "d1"
    assert guard_for("volcengine/m-1", None, {"id": "d"}).pool == "default/m-1"
    assert guard_for("m-1", "volcengine", {"id": "d"}).pool == "default/m-1"


def test_only_volcengine_is_guarded_unless_the_operator_says_otherwise() -> None:
    """Other providers pass; `vqg_guard: false` opts out; `vqg_guard: true` opts in."""
    assert guard_for("openai/gpt-4o", None, {"id": "d"}) is None
    assert guard_for("volcengine/m-1", None, {"id": "d", "vqg_guard": False}) is None
    assert guard_for("volcengine/m-1", None, {"id": "d", "vqg_guard": "false"}) is None
    assert guard_for("openai/ep-1", None, {"id": "d", "vqg_guard": True}).pool == "default/ep-1"


def test_a_guarded_deployment_without_a_valid_pool_is_a_config_error() -> None:
    """A bad account name fails closed with an error naming the deployment."""
    with pytest.raises(GuardConfigError, match="d9"):
        guard_for("volcengine/m-1", None, {"id": "d9", "vqg_account": "has space"})


def test_a_guarded_deployment_may_not_drop_params_after_the_hook(tmp_path: Path) -> None:
    """An operator's `additional_drop_params` would strip the pinned cap after the hook: a config
    error naming the deployment and the field, at startup (the model list is read) and per call;
    an unguarded deployment may keep it."""
    bad = {"litellm_params": {"model": "volcengine/m-1", "additional_drop_params": ["max_completion_tokens"]},
           "model_info": {"id": "d-drop"}}
    with pytest.raises(GuardConfigError, match="d-drop.*additional_drop_params"):
        guard_for_deployment(bad)
    config = tmp_path / "litellm.yaml"
    config.write_text(yaml.safe_dump({"model_list": [{"model_name": "m", **bad}]}))
    with pytest.raises(ConfigError, match="additional_drop_params"):
        pools_from_litellm_config(config)
    assert guard_for_deployment({"litellm_params": {"model": "openai/gpt-4o",
                                                    "additional_drop_params": ["user"]}}) is None


def test_output_cap_is_pinned_where_it_bounds_reasoning() -> None:
    """Chat: one max_completion_tokens in extra_body, no max_tokens anywhere; responses: its own field."""
    kw: dict[str, Any] = {"max_tokens": 50, "max_completion_tokens": 900,
                          "extra_body": {"max_tokens": 800, "thinking": {"type": "enabled"}}}
    pin_output(kw, ROUTES["acompletion"], 100)
    assert kw == {"extra_body": {"max_completion_tokens": 100, "thinking": {"type": "enabled"}}}
    kw = {}
    pin_output(kw, ROUTES["acompletion"], 100)
    assert kw == {"extra_body": {"max_completion_tokens": 100}}
    kw = {"extra_body": {"max_output_tokens": 5000}}
    pin_output(kw, ROUTES["aresponses"], 100)
    assert kw == {"max_output_tokens": 100, "extra_body": {}}
    kw = {"input": "x"}
    pin_output(kw, ROUTES["aembedding"], 100)
    assert kw == {"input": "x"}


def test_retry_after_follows_the_wall() -> None:
    """Collection wall: until midnight; balance wall (far future): the sync interval; else a minute."""
    now = 1_000_000_000_000
    assert refusals.retry_after_s(now + 90_500, now, 300) == 91
    assert refusals.retry_after_s(4_102_444_800_000, now, 300) == 300
    assert refusals.retry_after_s(0, now, 300) == refusals.REFUSED_RETRY_AFTER_S


def test_usage_reading_sources() -> None:
    """Usage present is measured; missing or 0/0 is unavailable; cached tokens count."""
    resp = litellm.ModelResponse(usage=litellm.Usage(prompt_tokens=100, completion_tokens=20,
                                                     prompt_tokens_details={"cached_tokens": 30}))
    assert read_usage(resp).tokens == 120  # cached prompt tokens draw on the free quota too
    assert read_usage(resp).cached == 30
    assert read_usage(resp, estimated=True).source == "estimated"
    zero = litellm.ModelResponse(usage=litellm.Usage(prompt_tokens=0, completion_tokens=0))
    assert read_usage(zero).source == "unavailable" and read_usage(zero).tokens is None
    assert read_usage(object()).source == "unavailable"
    assert read_usage({"usage": {"input_tokens": 7, "output_tokens": 3}}).tokens == 10


def _chained(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException:
            raise outer  # noqa: B904 - LiteLLM chains implicitly, like this
    except BaseException as exc:
        return exc


def test_failure_outcomes() -> None:
    """Refused connections and 4xx release; timeouts, 5xx and unknowns keep the reservation."""
    import httpx

    def err(cls: type, **kw: Any) -> Exception:
        return cls(message="x", model="m", llm_provider="volcengine", **kw)

    assert failure_action(err(litellm.BadRequestError)) == "release"
    assert failure_action(err(litellm.RateLimitError)) == "release"
    assert failure_action(err(litellm.Timeout)) == "keep"
    assert failure_action(err(litellm.InternalServerError)) == "keep"
    assert failure_action(err(litellm.ContentPolicyViolationError)) == "keep"
    assert failure_action(ValueError("what")) == "keep"
    refused = _chained(err(litellm.InternalServerError), httpx.ConnectError("Cannot connect"))
    assert failure_action(refused) == "release"
    reset = _chained(err(litellm.APIConnectionError), httpx.ReadError("reset"))
    assert failure_action(reset) == "keep"


def test_log_line_formats() -> None:
    """PRE-BLOCK and Usage lines keep the seed's exact prefix; extra fields follow as key=value."""
    d = Decision("refused", "balance_wall", 0, 300, 1_700_000, 2_000_000, 1_696_135, 2_000_000,
                 0, 0, False)
    line = loglines.pre_block("deepseek-v4-flash-ga-260731", d, 16, pool="acct-a/x")
    assert line.startswith("🚫 [PRE-BLOCK] deepseek-v4-flash-ga-260731 daily limit reached "
                           "(1,696,135+16/1,696,435) reason=balance_wall wall=balance")
    ok = Decision("ok", "settled", 38_083, 720_096, 1_279_904, 2_000_000, 1_279_904, 2_000_000,
                  0, 0, False)
    line = loglines.usage("deepseek-v4-flash-ga-260731", "acct-a/x", 38_083, ok, 1_558_307,
                          source="measured")
    assert re.match(r"📊 \[Usage\] deepseek-v4-flash-ga-260731:[0-9a-f]{8}: \+38083 "
                    r"\(Today: 1,279,904 \| BalAtSync: 1,558,307 \| Limit: 2,000,000\) "
                    r"source=measured pool=acct-a/x$", line), line
    assert "+? (" in loglines.usage("m", "a/m", None, ok, None)


# ---- the hook against the store --------------------------------------------------------------

Scenario = Callable[["World"], Awaitable[None]]


class World:
    """A QuotaGuard on the test store, plus the sync gate to seed and inspect pools."""

    def __init__(self, keyspace: KeySpace, client: redis.Redis, **settings: Any) -> None:
        self.keyspace = keyspace
        self.sync = Gate(client, keyspace)
        self.settings = load_settings(**settings)
        self.guard = QuotaGuard(self.settings, AsyncGate(connect_async(TEST_REDIS_URL), keyspace))

    def seed(self, headroom: int, pool: str = POOL, evict_below: int = 1_000) -> None:
        st = self.sync.status(pool)
        self.sync.install_snapshot(pool, Snapshot(
            balance=headroom, settled_usage=st.get("ucum"), expiring=0, small_buffer=0,
            daily_cap=1_000_000_000, valid_until_ms=int(time.time() * 1000) + 3_600_000,
            evict_below=evict_below))

    def state(self, pool: str = POOL) -> dict[str, int]:
        return self.sync.status(pool).fields


def call(logging_obj: object | None = None, text: str = "hello", model_id: str = "dep-a",
         group_size: int = 1, **params: Any) -> dict[str, Any]:
    """Deployment-hook kwargs as the router builds them."""
    return {"model": "volcengine/m-1", "messages": [{"role": "user", "content": text}],
            "litellm_call_id": params.pop("call_id", "call-1"),
            "litellm_logging_obj": logging_obj or types.SimpleNamespace(),
            "metadata": {"model_info": {"id": model_id, "vqg_account": "acct-a",
                                        "max_output_tokens": 4096, "vqg_reasoning_tokens": 0},
                         "model_group": "g", "model_group_size": group_size}, **params}


def upstream_cap(kw: dict[str, Any]) -> int:
    """The cap the upstream will apply to answer + reasoning (what the hook pinned)."""
    assert "max_tokens" not in kw and "max_tokens" not in kw.get("extra_body", {})
    return int(kw["extra_body"]["max_completion_tokens"])


def success_kwargs(kw: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """What `async_log_success_event` receives for that call."""
    return {"model": "m-1", "custom_llm_provider": "volcengine", "stream": False,
            "litellm_call_id": kw["litellm_call_id"],
            "litellm_params": {"metadata": kw["metadata"],
                               "model_info": kw["metadata"]["model_info"]}, **extra}


def response(prompt: int, completion: int, cached: int = 0) -> litellm.ModelResponse:
    return litellm.ModelResponse(usage=litellm.Usage(
        prompt_tokens=prompt, completion_tokens=completion,
        prompt_tokens_details={"cached_tokens": cached}))


@pytest.fixture
def world(keyspace: KeySpace, client: redis.Redis) -> Callable[..., Any]:
    """Run a scenario (a coroutine taking a World) on a fresh event loop."""
    def run(scenario: Scenario, **settings: Any) -> None:
        async def main() -> None:
            await scenario(World(keyspace, client, **settings))
        asyncio.run(main())
    return run


def test_reservation_is_idempotent_per_request_not_per_call_id(world: Callable[..., Any]) -> None:
    """Two hook runs for one request reserve once; another request with the same id reserves anew."""
    async def scenario(w: World) -> None:
        w.seed(100_000)
        first = types.SimpleNamespace()
        kw = call(first, max_tokens=100)
        await w.guard.async_pre_call_deployment_hook(kw, "acompletion")
        once = w.state()["inflight"]
        await w.guard.async_pre_call_deployment_hook(kw, "acompletion")  # /v1/messages does this
        assert w.state()["inflight"] == once > 100
        await w.guard.async_pre_call_deployment_hook(call(types.SimpleNamespace(), max_tokens=100),
                                                     "acompletion")  # same client call id
        assert w.state()["inflight"] == 2 * once
    world(scenario)


def test_a_messages_chat_half_bigger_than_its_sizing_is_reserved_afresh(world: Callable[..., Any]) -> None:
    """/v1/messages: the translated chat call rides the Anthropic call's reservation only when it
    is no bigger; one LiteLLM grew is reserved again (the first released), never under-held."""
    async def scenario(w: World) -> None:
        w.seed(1_000_000)
        rides = types.SimpleNamespace()
        await w.guard.async_pre_call_deployment_hook(call(rides, max_tokens=100), "anthropic_messages")
        once = w.state()["inflight"]
        await w.guard.async_pre_call_deployment_hook(call(rides, max_tokens=100), "acompletion")
        assert w.state()["inflight"] == once
        grew = types.SimpleNamespace()
        await w.guard.async_pre_call_deployment_hook(call(grew, max_tokens=100), "anthropic_messages")
        assert w.state()["inflight"] == 2 * once
        await w.guard.async_pre_call_deployment_hook(call(grew, "word " * 3_000, max_tokens=100),
                                                     "acompletion")
        assert w.state()["inflight"] >= once + 3_000
    world(scenario)


def test_a_running_request_keeps_its_reservation_past_the_ttl(world: Callable[..., Any]) -> None:
    """A request that runs longer than VQG_RESERVATION_TTL_SECONDS keeps its reservation: the hook
    moves its deadline a TTL ahead every third of one (before, a 30-minute stream across midnight
    was counted whole on the first day and Ark collected it on the second: 552,000 burned)."""
    async def scenario(w: World) -> None:
        w.seed(100_000)
        kw = call(types.SimpleNamespace(), max_tokens=100)
        await w.guard.async_pre_call_deployment_hook(kw, "acompletion")
        deadlines = w.keyspace.pool(POOL).deadlines
        first = w.sync.client.zrange(deadlines, 0, -1, withscores=True)[0][1]
        await asyncio.sleep(12)  # past the 10 s TTL: renewed at 3.3, 6.7 and 10 s
        held = w.state()
        assert held["expired_count"] == 0 and held["inflight"] > 100
        assert w.sync.client.zrange(deadlines, 0, -1, withscores=True)[0][1] >= first + 6_000
        await w.guard.async_log_success_event(success_kwargs(kw), response(10, 50), None, None)
        done = w.state()
        assert done["inflight"] == 0 and done["ucum"] == 60 and done["expired_count"] == 0
    world(scenario, reservation_ttl_seconds=10)


def test_forged_reservation_stash_is_ignored(world: Callable[..., Any]) -> None:
    """A client-supplied `vqg_reservations` in metadata does not count as a reservation."""
    async def scenario(w: World) -> None:
        w.seed(100_000)
        kw = call(max_tokens=100)
        kw["metadata"]["vqg_reservations"] = {"dep-a": "f" * 32}
        await w.guard.async_pre_call_deployment_hook(kw, "acompletion")
        assert w.state()["inflight"] > 100
        assert kw["metadata"]["vqg_reservations"]["dep-a"] != "f" * 32
    world(scenario)


def test_short_headroom_clamps_the_output_cap(world: Callable[..., Any]) -> None:
    """Headroom below input + cap lowers max_tokens to what fits and records the clamp."""
    async def scenario(w: World) -> None:
        w.seed(1_000, evict_below=0)
        state_holder = types.SimpleNamespace()
        kw = call(state_holder, max_tokens=4_000)
        out = await w.guard.async_pre_call_deployment_hook(kw, "acompletion")
        assert out is kw and 256 <= upstream_cap(kw) < 1_000
        assert state_holder._vqg_state.clamped_to == upstream_cap(kw)
        headers = await w.guard.async_post_call_response_headers_hook(
            {"litellm_logging_obj": state_holder}, None, None)
        assert headers == {hook_mod.CLAMP_HEADER: str(upstream_cap(kw))}
        # all of the headroom but what the prompt could use beyond its reservation at the
        # correction's ceiling (a few tokens for this prompt)
        assert 950 < w.state()["inflight"] <= 1_000
    world(scenario)


def test_refusal_is_a_caller_scoped_429_without_retries(world: Callable[..., Any]) -> None:
    """When even input + the minimum output does not fit, a 429 that cools no deployment is raised."""
    async def scenario(w: World) -> None:
        w.seed(100, evict_below=0)
        with pytest.raises(QuotaRefused) as err:
            await w.guard.async_pre_call_deployment_hook(call(max_tokens=500), "acompletion")
        e = err.value
        assert e.status_code == 429 and e.num_retries == 0 and int(e.headers["retry-after"]) > 0
        assert isinstance(e, litellm.CallerCredentialRateLimitError)  # the router skips cooldown
        assert "free token quota exhausted" in str(e) and "'g'" in str(e)
        assert w.state()["inflight"] == 0
    world(scenario)


def test_refusal_in_a_multi_deployment_group_lets_the_router_try_the_others(
        world: Callable[..., Any]) -> None:
    """In a group of two, the first refusal allows a retry, and the filter then skips that deployment."""
    async def scenario(w: World) -> None:
        w.seed(100, evict_below=0)
        holder = types.SimpleNamespace()
        with pytest.raises(QuotaRefused) as err:
            await w.guard.async_pre_call_deployment_hook(call(holder, group_size=2), "acompletion")
        assert err.value.num_retries is None
        deps = [{"litellm_params": {"model": "volcengine/m-1"},
                 "model_info": {"id": i, "vqg_account": "acct-a"}} for i in ("dep-a", "dep-b")]
        kept = await w.guard.async_filter_deployments("g", deps, None,
                                                      {"litellm_logging_obj": holder})
        assert [d["model_info"]["id"] for d in kept] == ["dep-b"]
    world(scenario)


def test_filter_drops_evicted_pools_and_raises_429_when_nothing_is_left(
        world: Callable[..., Any]) -> None:
    """Evicted pools leave routing; other providers stay; an empty result is our 429, not a 500."""
    async def scenario(w: World) -> None:
        w.seed(10)  # below evict_below
        w.seed(100_000, pool="acct-b/m-1")
        deps = [{"litellm_params": {"model": "volcengine/m-1"},
                 "model_info": {"id": "a", "vqg_account": "acct-a"}},
                {"litellm_params": {"model": "volcengine/m-1"},
                 "model_info": {"id": "b", "vqg_account": "acct-b"}},
                {"litellm_params": {"model": "openai/gpt-x"}, "model_info": {"id": "o"}}]
        kept = await w.guard.async_filter_deployments("g", deps, None, {})
        assert [d["model_info"]["id"] for d in kept] == ["b", "o"]
        with pytest.raises(QuotaRefused) as err:
            await w.guard.async_filter_deployments("g", deps[:1], None, {})
        assert err.value.status_code == 429 and int(err.value.headers["retry-after"]) > 0
    world(scenario)


def test_success_settles_measured_usage_cached_tokens_included(world: Callable[..., Any]) -> None:
    """Success replaces the reservation by prompt + completion, cached prompt tokens included:
    a cache hit draws on the free quota (a switch that left them out let a red-team run bill
    211,280 tokens on a 60,000-token pool)."""
    async def scenario(w: World) -> None:
        w.seed(100_000)
        kw = call(max_tokens=100)
        await w.guard.async_pre_call_deployment_hook(kw, "acompletion")
        before = w.state()["ucum"]
        await w.guard.async_log_success_event(success_kwargs(kw), response(50, 10, cached=20),
                                              None, None)
        assert w.state()["ucum"] - before == 60 and w.state()["inflight"] == 0
    world(scenario)


def test_success_without_usage_keeps_the_reservation(world: Callable[..., Any]) -> None:
    """0/0 usage is unknown, not free: the reservation is counted as consumed."""
    async def scenario(w: World) -> None:
        w.seed(100_000)
        kw = call(max_tokens=100)
        await w.guard.async_pre_call_deployment_hook(kw, "acompletion")
        reserved, before = kept_whole(w.state()), w.state()["ucum"]
        await w.guard.async_log_success_event(success_kwargs(kw), response(0, 0), None, None)
        assert w.state()["ucum"] - before == reserved and w.state()["inflight"] == 0
    world(scenario)


def test_client_disconnect_estimate_never_lowers_the_reservation(world: Callable[..., Any]) -> None:
    """After a disconnect LiteLLM's count is an estimate: the larger of it and the reservation (its
    prompt at the miscount ceiling) counts."""
    async def scenario(w: World) -> None:
        w.seed(100_000)
        kw = call(max_tokens=100)
        await w.guard.async_pre_call_deployment_hook(kw, "acompletion")
        reserved, before = kept_whole(w.state()), w.state()["ucum"]
        kw["metadata"]["client_disconnected"] = True
        await w.guard.async_log_success_event(success_kwargs(kw), response(5, 3), None, None)
        assert w.state()["ucum"] - before == reserved
        # An estimate just above the grant is still under what the prompt may have been (the
        # miscount ceiling): the gate counts the larger, never the estimate alone (red team).
        mid = call(max_tokens=100, call_id="call-3")
        await w.guard.async_pre_call_deployment_hook(mid, "acompletion")
        granted, whole, before = w.state()["inflight"], kept_whole(w.state()), w.state()["ucum"]
        assert whole > granted + 1
        mid["metadata"]["client_disconnected"] = True
        await w.guard.async_log_success_event(success_kwargs(mid), response(granted - 99, 100), None, None)
        assert w.state()["ucum"] - before == whole
        big = call(max_tokens=100, call_id="call-2")
        await w.guard.async_pre_call_deployment_hook(big, "acompletion")
        big["metadata"]["client_disconnected"] = True
        before = w.state()["ucum"]
        await w.guard.async_log_success_event(success_kwargs(big), response(400, 300), None, None)
        assert w.state()["ucum"] - before == 700
    world(scenario)


def test_cache_hit_releases_the_reservation(world: Callable[..., Any]) -> None:
    """A response served from LiteLLM's cache never reached the upstream: nothing is counted."""
    async def scenario(w: World) -> None:
        w.seed(100_000)
        kw = call(max_tokens=100)
        await w.guard.async_pre_call_deployment_hook(kw, "acompletion")
        before = w.state()["ucum"]
        await w.guard.async_log_success_event(success_kwargs(kw, cache_hit=True), response(5, 5),
                                              None, None)
        assert w.state()["ucum"] == before and w.state()["inflight"] == 0
    world(scenario)


@pytest.mark.parametrize(("exc", "counted"), [
    (litellm.BadRequestError(message="bad", model="m", llm_provider="volcengine"), False),
    (litellm.Timeout(message="slow", model="m", llm_provider="volcengine"), True),
])
def test_failed_attempts_release_or_keep(world: Callable[..., Any], exc: Exception,
                                         counted: bool) -> None:
    """A 4xx releases the reservation; a timeout keeps it as consumed."""
    async def scenario(w: World) -> None:
        w.seed(100_000)
        kw = call(max_tokens=100)
        await w.guard.async_pre_call_deployment_hook(kw, "acompletion")
        reserved, before = kept_whole(w.state()), w.state()["ucum"]
        await w.guard.async_post_call_failure_deployment_hook(kw, exc, "acompletion")
        assert w.state()["inflight"] == 0
        assert w.state()["ucum"] - before == (reserved if counted else 0)
    world(scenario)


def test_unguarded_deployments_never_touch_the_store(world: Callable[..., Any]) -> None:
    """Other providers and opted-out deployments pass every hook with the store unreachable."""
    async def scenario(w: World) -> None:
        kw = call()
        kw["model"] = "openai/gpt-x"
        assert await w.guard.async_pre_call_deployment_hook(kw, "acompletion") is None
        optout = call()
        optout["metadata"]["model_info"]["vqg_guard"] = False
        assert await w.guard.async_pre_call_deployment_hook(optout, "acompletion") is None
        deps = [{"litellm_params": {"model": "openai/gpt-x"}, "model_info": {"id": "o"}}]
        assert await w.guard.async_filter_deployments("g", deps, None, {}) == deps
        await w.guard.async_log_success_event(success_kwargs(kw) | {"custom_llm_provider": "openai"},
                                              response(5, 5), None, None)
    world(scenario, redis_url="redis://127.0.0.1:1/0")


def _dead_guard(w: World, mode: str) -> QuotaGuard:
    dead = AsyncGate(connect_async("redis://127.0.0.1:1/0"), w.keyspace)
    return QuotaGuard(load_settings(fail_mode=mode), dead)


def test_store_down_fails_closed_with_a_503(world: Callable[..., Any]) -> None:
    """An unreachable store refuses guarded requests with a 503 naming the cause."""
    async def scenario(w: World) -> None:
        guard = _dead_guard(w, "closed")
        with pytest.raises(QuotaStoreDown) as err:
            await guard.async_pre_call_deployment_hook(call(max_tokens=10), "acompletion")
        assert err.value.status_code == 503 and "quota store unreachable" in str(err.value)
        deps = [{"litellm_params": {"model": "volcengine/m-1"}, "model_info": {"id": "a"}}]
        with pytest.raises(QuotaStoreDown):
            await guard.async_filter_deployments("g", deps, None, {})
    world(scenario)


def test_store_down_fails_open_only_when_asked(world: Callable[..., Any]) -> None:
    """With fail_mode=open an unreachable store lets the request pass unchanged."""
    async def scenario(w: World) -> None:
        guard = _dead_guard(w, "open")
        kw = call(max_tokens=10)
        assert await guard.async_pre_call_deployment_hook(kw, "acompletion") is None
        deps = [{"litellm_params": {"model": "volcengine/m-1"}, "model_info": {"id": "a"}}]
        assert await guard.async_filter_deployments("g", deps, None, {}) == deps
    world(scenario)


def test_invalid_output_cap_is_a_400_that_cools_nothing(world: Callable[..., Any]) -> None:
    """A bad max_tokens reaching the deployment hook is LiteLLM's malformed-request 400."""
    async def scenario(w: World) -> None:
        w.seed(100_000)
        with pytest.raises(litellm.MalformedRequestFieldError) as err:
            await w.guard.async_pre_call_deployment_hook(call(max_tokens="9"), "acompletion")
        assert err.value.status_code == 400 and w.state()["inflight"] == 0
    world(scenario)


def test_every_hook_is_defined_on_the_registered_class() -> None:
    """The proxy only calls hooks found in the leaf class's own __dict__."""
    for name in ("async_pre_call_hook", "async_filter_deployments", "async_pre_call_deployment_hook",
                 "async_post_call_response_headers_hook", "async_post_call_streaming_iterator_hook",
                 "async_log_success_event", "async_log_failure_event",
                 "async_post_call_failure_deployment_hook", "log_pre_api_call"):
        assert name in vars(QuotaGuard), name


def test_package_exports_the_proxy_instance() -> None:
    """`callbacks: volc_quota_guard.proxy_handler_instance` resolves to a QuotaGuard instance."""
    import volc_quota_guard

    assert isinstance(volc_quota_guard.proxy_handler_instance, QuotaGuard)
    assert "proxy_handler_instance" in volc_quota_guard.__all__


def test_prompts_are_reserved_times_the_pool_correction_which_measured_usage_raises(
        world: Callable[..., Any]) -> None:
    """The hook reserves the counted prompt times k (1.7 before any measurement); a success whose
    measured prompt is 2.4x the count raises k, and the next reservation holds 2.4x; an estimated
    (disconnected stream) reading teaches nothing."""
    async def scenario(w: World) -> None:
        w.seed(1_000_000)
        text = "quota " * 600
        kw = call(types.SimpleNamespace(), text=text, max_tokens=100, call_id="c1")
        await w.guard.async_pre_call_deployment_hook(kw, "acompletion")
        res = next(iter(w.guard.reservations.values()))
        counted = res.input_tokens
        assert counted > 500 and upstream_cap(kw) == 100
        assert w.state()["inflight"] == -(-counted * 17 // 10) + 100
        measured = counted * 12 // 5
        await w.guard.async_log_success_event(success_kwargs(kw), response(measured, 90), None, None)
        k = -(-measured * 1_000_000 // counted)  # ceil, in parts per million
        assert w.state()["corr"] == k and 2_399_000 < k <= 2_400_000 and w.state()["inflight"] == 0
        kw2 = call(types.SimpleNamespace(), text=text, max_tokens=100, call_id="c2")
        await w.guard.async_pre_call_deployment_hook(kw2, "acompletion")
        assert w.state()["inflight"] == -(-counted * k // 1_000_000) + 100
        cut = success_kwargs(kw2, metadata={"client_disconnected": True})
        cut["litellm_params"]["metadata"]["client_disconnected"] = True
        await w.guard.async_log_success_event(cut, response(counted * 3, 90), None, None)
        assert w.state()["corr"] == k and w.state()["corr_n"] == 1
    world(scenario)


def test_a_moderation_refusal_after_generation_keeps_the_reservation() -> None:
    """Ark's output moderation answers 400 after the tokens were generated (and billed): keep."""
    exc = litellm.BadRequestError(message='VolcengineException - {"error": {"code": '
                                  '"OutputTextSensitiveContentDetected"}}', model="m",
                                  llm_provider="volcengine")
    assert failure_action(exc) == "keep"


def test_the_counting_method_comes_from_model_info_and_a_bad_one_is_a_400(
        world: Callable[..., Any]) -> None:
    """A deployment with vqg_tokenizer=deepseek is held at the exact DeepSeek count; an unknown
    vqg_tokenizer is a 400 naming the misconfiguration, with nothing reserved and no pass."""
    from volc_quota_guard import counting

    async def scenario(w: World) -> None:
        w.seed(1_000_000)
        text = "请把免费额度的规则总结成三条要点。" * 50
        kw = call(types.SimpleNamespace(), text=text, max_tokens=100, call_id="c1")
        kw["metadata"]["model_info"]["vqg_tokenizer"] = "deepseek"
        await w.guard.async_pre_call_deployment_hook(kw, "acompletion")
        exact = counting.count_chat("deepseek", [{"role": "user", "content": text}], None) + \
            EXACT_DRIFT_TOKENS
        assert next(iter(w.guard.reservations.values())).input_tokens == exact
        assert (w.state()["inflight_xest"], w.state()["inflight_est"]) == (exact, 0)  # the exact class
        bad = call(types.SimpleNamespace(), text=text, max_tokens=100, call_id="c2")
        bad["metadata"]["model_info"]["vqg_tokenizer"] = "gpt2"
        with pytest.raises(litellm.MalformedRequestFieldError, match="misconfigured") as err:
            await w.guard.async_pre_call_deployment_hook(bad, "acompletion")
        assert err.value.status_code == 400 and w.state()["inflight_xest"] == exact
    world(scenario)


def _router_for(monkeypatch: pytest.MonkeyPatch, accounts: dict[str, str], **info: Any) -> Any:
    """A LiteLLM router with one volcengine deployment per id -> account, where the hook finds it."""
    import sys

    router = litellm.Router(model_list=[
        {"model_name": "g", "litellm_params": {"model": "volcengine/m-1", "api_key": f"k-{acct}",
                                               "api_base": "http://127.0.0.1:9"},
         "model_info": {"id": dep, "vqg_account": acct, **info}} for dep, acct in accounts.items()])
    module = sys.modules.get("litellm.proxy.proxy_server") or types.ModuleType("litellm.proxy.proxy_server")
    monkeypatch.setitem(sys.modules, "litellm.proxy.proxy_server", module)
    monkeypatch.setattr(module, "llm_router", router, raising=False)
    return router


def test_the_cached_deployment_guard_follows_changes_to_the_routers_model_list(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The guard of a deployment id is reused while the router keeps that deployment, and a
    changed account (in place or by a new model list), a removed or a re-added deployment is seen."""
    from volc_quota_guard.proxy import calls

    router = _router_for(monkeypatch, {"dep-a": "acct-a", "dep-b": "acct-b"})
    first = calls.guard_of_call(call(model_id="dep-a"))
    assert first is not None and first.pool == "acct-a/m-1"
    assert calls.guard_of_call(call(model_id="dep-a")) is first  # cached, not rebuilt
    assert calls.guard_of_call(call(model_id="dep-b")).pool == "acct-b/m-1"
    entry = router.model_list[router.model_id_to_deployment_index_map["dep-a"]]
    entry["model_info"]["vqg_account"] = "acct-c"
    assert calls.guard_of_call(call(model_id="dep-a")).pool == "acct-c/m-1"  # edited in place
    router.set_model_list([{"model_name": "g", "litellm_params": {"model": "volcengine/m-2", "api_key": "k"},
                            "model_info": {"id": "dep-a", "vqg_account": "acct-d"}}])
    assert calls.guard_of_call(call(model_id="dep-a")).pool == "acct-d/m-2"  # a new model list
    router.set_model_list([{"model_name": "g", "litellm_params": {"model": "openai/gpt-x", "api_key": "k"},
                            "model_info": {"id": "dep-a"}}])
    assert calls.guard_of_call(call(model_id="dep-a", model="openai/gpt-x")) is None  # not volcengine now
    router.delete_deployment("dep-a")
    fallback = calls.guard_of_call(call(model_id="dep-a"))  # unknown to the router: the call's own fields
    assert fallback is not None and fallback.pool == "acct-a/m-1"


def _router_of(monkeypatch: pytest.MonkeyPatch, *deployments: dict[str, Any]) -> Any:
    import sys

    from volc_quota_guard.proxy import calls

    calls._guards.clear()
    router = litellm.Router(model_list=list(deployments))
    module = sys.modules.get("litellm.proxy.proxy_server") or types.ModuleType("litellm.proxy.proxy_server")
    monkeypatch.setitem(sys.modules, "litellm.proxy.proxy_server", module)
    monkeypatch.setattr(module, "llm_router", router, raising=False)
    return router


def _dep(dep_id: str, model: str, **info: Any) -> dict[str, Any]:
    params = {"model": model, "api_key": info.pop("api_key", f"key-{dep_id}")}
    if params["api_key"] is None:
        del params["api_key"]
    if "api_base" in info:
        params["api_base"] = info.pop("api_base")
    params |= info.pop("params", {})
    return {"model_name": dep_id, "litellm_params": params, "model_info": {"id": dep_id, **info}}


def _raw_call(dep_id: str, model: str, **info: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}],
            "metadata": {"model_info": {"id": dep_id, **info}}}


def test_a_call_bound_for_ark_through_an_unguarded_deployment_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A `*` deployment resolves a client's `volcengine/x` to Ark without a pool: refused (never an
    unguarded pass), unless the operator opted that deployment out; other providers pass."""
    from volc_quota_guard.proxy import calls

    _router_of(monkeypatch, _dep("star", "*"), _dep("out", "*", vqg_guard=False), _dep("oa", "openai/gpt-x"))
    with pytest.raises(GuardConfigError, match="goes to Ark.*'star'"):
        calls.guard_of_call(_raw_call("star", "volcengine/any-260101"))
    with pytest.raises(GuardConfigError, match="goes to Ark"):  # the call's own metadata cannot opt out
        calls.guard_of_call(_raw_call("star", "volcengine/any-260101", vqg_guard=False))
    assert calls.guard_of_call(_raw_call("out", "volcengine/any-260101")) is None  # the operator's opt-out
    assert calls.guard_of_call(_raw_call("star", "gpt-4o")) is None
    assert calls.guard_of_call(_raw_call("oa", "openai/gpt-x")) is None
    monkeypatch.setenv("VOLCENGINE_API_BASE", "http://ark.local:9/api/v3")
    with pytest.raises(GuardConfigError, match="goes to Ark"):
        calls.guard_of_call(_raw_call("oa", "openai/gpt-x") | {"api_base": "http://ark.local:9/api/v3/"})


@pytest.mark.parametrize(("dep", "match"), [
    (_dep("oa", "openai/ep-1", vqg_account="acct-c"), "sets model_info.vqg_account but its provider"),
    (_dep("oa", "openai/ep-1", api_base="https://ark.cn-beijing.volces.com/api/v3"), "sends to Ark"),
    (_dep("oa", "hosted_vllm/ep-1", api_base="os.environ/VOLCENGINE_API_BASE"), "sends to Ark"),
    (_dep("pm", "volcengine/m-1", params={"prompt_id": "big"}), "litellm_params.prompt_id"),
    (_dep("vs", "volcengine/m-1", params={"vector_store_ids": ["vs-1"]}), "litellm_params.vector_store_ids"),
])
def test_deployments_that_would_pass_ark_traffic_unsized_are_config_errors(
        dep: dict[str, Any], match: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ark through another provider without `vqg_guard`, or a guarded deployment whose messages
    LiteLLM rewrites after the hook: refused per call and named at startup; `vqg_guard` decides."""
    from volc_quota_guard.proxy import calls

    monkeypatch.setenv("VOLCENGINE_API_BASE", "http://ark.local:9/api/v3")
    _router_of(monkeypatch, dep)
    with pytest.raises(GuardConfigError, match=match):
        calls.guard_of_call(_raw_call(dep["model_info"]["id"], dep["litellm_params"]["model"]))
    with pytest.raises(ConfigError, match=match):
        pools_from_model_list([dep])
    if "prompt_id" not in str(dep) and "vector" not in str(dep):
        opted = {**dep, "model_info": {**dep["model_info"], "vqg_guard": True}}
        account = opted["model_info"].get("vqg_account", "default")
        assert [p.pool for p in pools_from_model_list([opted])] == [f"{account}/ep-1"]


@pytest.mark.parametrize(("second", "match"), [
    (_dep("b", "volcengine/m-1", vqg_account="acct-b", api_key="key-a"), "share one Ark API key"),
    (_dep("b", "volcengine/m-2", vqg_account="acct_a"), "read the same Volcengine credentials"),
])
def test_one_volcengine_account_under_two_pools_is_refused(
        second: dict[str, Any], match: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """One Ark key under two accounts, or two spellings of one account's credentials, would count
    one free quota twice: both deployments are refused, and startup names them."""
    from volc_quota_guard.proxy import calls

    first = _dep("a", "volcengine/m-1", vqg_account="acct-a", api_key="key-a")
    _router_of(monkeypatch, first, second)
    for dep in (first, second):
        with pytest.raises(GuardConfigError, match=match):
            calls.guard_of_call(_raw_call(dep["model_info"]["id"], dep["litellm_params"]["model"]))
    with pytest.raises(ConfigError, match=match):
        pools_from_model_list([first, second])
    fixed = {**second, "litellm_params": {**second["litellm_params"], "api_key": "key-b"},
             "model_info": {**second["model_info"], "vqg_account": "acct-b"}}
    assert len(pools_from_model_list([first, fixed])) == 2


def test_one_access_key_copied_under_two_account_names_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """One account's AK/SK copied into two `vqg_account`s (each deployment with its own Ark key)
    would let both pools spend the whole free balance: a red-team pass billed 120,000 (stop 35)."""
    from volc_quota_guard.proxy import calls

    for name in ("ACCT_A", "TEAM_B"):
        monkeypatch.setenv(f"VOLC_ACCESSKEY_{name}", "AK-same")
        monkeypatch.setenv(f"VOLC_SECRETKEY_{name}", "SK-same")
    first = _dep("a", "volcengine/m-1", vqg_account="acct-a", api_key="key-a")
    second = _dep("b", "volcengine/m-2", vqg_account="team-b", api_key="key-b")
    _router_of(monkeypatch, first, second)
    for dep in (first, second):
        with pytest.raises(GuardConfigError, match="the same Volcengine access key"):
            calls.guard_of_call(_raw_call(dep["model_info"]["id"], dep["litellm_params"]["model"]))
    with pytest.raises(ConfigError, match="the same Volcengine access key"):
        pools_from_model_list([first, second])
    monkeypatch.setenv("VOLC_ACCESSKEY_TEAM_B", "AK-other")
    assert len(pools_from_model_list([first, second])) == 2


def test_a_litellm_credential_is_read_for_where_a_deployment_sends_and_with_which_key(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """LiteLLM fills `api_base` / `api_key` from `litellm_credential_name` after the hook: an
    `openai/` deployment whose credential points at Ark, and one credential's key under two
    accounts, are refused as if written inline."""
    from litellm.types.utils import CredentialItem

    from volc_quota_guard.proxy import calls

    monkeypatch.setattr(litellm, "credential_list", [CredentialItem(
        credential_name="ark-cred", credential_info={},
        credential_values={"api_key": "key-1", "api_base": "https://ark.cn-beijing.volces.com/api/v3"})])
    cred = {"params": {"litellm_credential_name": "ark-cred"}, "api_key": None}
    oa = _dep("oa", "openai/ep-1", **cred)
    _router_of(monkeypatch, oa)
    with pytest.raises(GuardConfigError, match="sends to Ark"):
        calls.guard_of_call(_raw_call("oa", "openai/ep-1"))
    with pytest.raises(GuardConfigError, match="goes to Ark"):  # a call the router does not know
        calls.guard_of_call(_raw_call("nope", "openai/ep-1") | {"litellm_credential_name": "ark-cred"})
    pair = [_dep(d, "volcengine/m-1", vqg_account=f"acct-{d}", **cred) for d in ("a", "b")]
    with pytest.raises(ConfigError, match="share one Ark API key"):
        pools_from_model_list(pair)


def test_a_cached_guard_sizes_exactly_as_an_uncached_one(world: Callable[..., Any],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The same request reserves the same amount on a cold and on a warm deployment cache."""
    from volc_quota_guard.proxy import calls

    _router_for(monkeypatch, {"dep-a": "acct-a"})

    async def scenario(w: World) -> None:
        w.seed(10_000_000)
        granted = []
        for _ in range(2):
            calls._guards.clear()
            for _ in range(2):  # cold, then warm
                kw = call(text="请用三句话解释一下为什么免费额度需要防护。" * 5, max_tokens=300)
                await w.guard.async_pre_call_deployment_hook(kw, "acompletion")
                res = w.guard.reservations.stashed(kw, "dep-a")
                assert res is not None
                granted.append(res.granted)
        assert len(set(granted)) == 1
    world(scenario)


def test_a_deployments_limits_follow_an_edit_of_its_model_info(world: Callable[..., Any],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-deployment Limits are reused, yet an edited `max_output_tokens` is the next cap."""
    router = _router_for(monkeypatch, {"dep-a": "acct-a"}, max_output_tokens=1_000,
                         vqg_reasoning_tokens=0)

    async def scenario(w: World) -> None:
        w.seed(10_000_000)
        caps = []
        for max_out in (1_000, 1_000, 2_000):
            entry = router.model_list[router.model_id_to_deployment_index_map["dep-a"]]
            entry["model_info"]["max_output_tokens"] = max_out
            kw = call()
            await w.guard.async_pre_call_deployment_hook(kw, "acompletion")
            caps.append(upstream_cap(kw))
        assert caps == [1_000, 1_000, 2_000]
    world(scenario)


def test_a_refusal_by_the_ceiling_bound_says_so(world: Callable[..., Any]) -> None:
    """A prompt that fits the headroom at k but not at the correction's ceiling is refused with a
    message that names the ceiling (not a bare "needs less than is left")."""
    async def scenario(w: World) -> None:
        w.seed(50_000, evict_below=0)
        with pytest.raises(QuotaRefused) as err:  # ~20k tokens: 34k held at 1.7, 60k at 3.0
            await w.guard.async_pre_call_deployment_hook(call(text="word " * 20_000, max_tokens=100),
                                                         "acompletion")
        assert "estimate correction's ceiling" in str(err.value), str(err.value)
        assert w.state()["inflight"] == 0
    world(scenario)


def test_routing_reuses_a_recent_read_of_a_routable_pool_only(
        world: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The filter's eviction read is answered from this process's read of under POOL_READ_S while
    it showed the pool routable (one round trip saved per request at load); an answer of this
    process that evicts the pool, an evicted read, and an old read all go back to the store."""
    monkeypatch.setattr(calls, "POOL_READ_S", 0.2)

    async def scenario(w: World) -> None:
        w.seed(5_000)
        gate = w.guard.gate()
        reads: list[list[str]] = []
        evicted_until = gate.evicted_until

        async def counted(pools: list[str]) -> dict[str, int]:
            reads.append(pools)
            return await evicted_until(pools)

        monkeypatch.setattr(gate, "evicted_until", counted)
        deps = [{"litellm_params": {"model": "volcengine/m-1"},
                 "model_info": {"id": "dep-a", "vqg_account": "acct-a"}}]
        for _ in range(3):
            assert len(await w.guard.async_filter_deployments("g", deps, None, {})) == 1
        assert len(reads) == 1
        # This process's reserve leaves less than evict_below (1,000): its answer evicts the pool.
        await w.guard.async_pre_call_deployment_hook(call(), "acompletion")
        for _ in range(2):  # read again, and again: an evicted pool is never answered from memory
            with pytest.raises(QuotaRefused):
                await w.guard.async_filter_deployments("g", deps, None, {})
        assert len(reads) == 3
        w.seed(100_000)  # a snapshot lifts the eviction
        assert len(await w.guard.async_filter_deployments("g", deps, None, {})) == 1
        w.seed(10)  # another process's snapshot evicts it: seen once the read is POOL_READ_S old
        assert len(await w.guard.async_filter_deployments("g", deps, None, {})) == 1
        await asyncio.sleep(0.25)
        with pytest.raises(QuotaRefused):
            await w.guard.async_filter_deployments("g", deps, None, {})
        assert len(reads) == 5
    world(scenario)


def test_a_failed_refresh_of_an_old_pool_read_leaves_no_routable_answer_behind(
        world: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The caller that refreshes an old read marks it young for the requests behind it; when its
    read fails (the store is down), that old read must not keep answering routing: fail-closed
    routes a mixed group to its unguarded deployments on every request, as without PoolReads."""
    from volc_quota_guard.errors import StoreUnavailable
    monkeypatch.setattr(calls, "POOL_READ_S", 0.05)

    async def scenario(w: World) -> None:
        w.seed(100_000)
        gate = w.guard.gate()
        guarded = {"litellm_params": {"model": "volcengine/m-1"},
                   "model_info": {"id": "dep-a", "vqg_account": "acct-a"}}
        other = {"litellm_params": {"model": "openai/gpt-x"}, "model_info": {"id": "o"}}
        assert len(await w.guard.async_filter_deployments("g", [guarded, other], None, {})) == 2

        async def down(pools: list[str]) -> dict[str, int]:
            raise StoreUnavailable("redis down")

        monkeypatch.setattr(gate, "evicted_until", down)
        for _ in range(3):
            await asyncio.sleep(0.06)
            for _ in range(3):  # the refreshing caller, then the requests behind it
                assert await w.guard.async_filter_deployments(
                    "g", [guarded, other], None, {}) == [other]
    world(scenario, fail_mode="closed")


def test_a_read_sent_before_this_processs_eviction_is_not_kept_after_it(
        world: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """A routing read in flight while this process's reserve evicts the pool must not re-install
    the routable answer the eviction forgot ('one by this process's own reserve at once')."""
    monkeypatch.setattr(calls, "POOL_READ_S", 0.05)

    async def scenario(w: World) -> None:
        w.seed(5_000)
        gate = w.guard.gate()
        deps = [{"litellm_params": {"model": "volcengine/m-1"},
                 "model_info": {"id": "dep-a", "vqg_account": "acct-a"}}]
        assert len(await w.guard.async_filter_deployments("g", deps, None, {})) == 1
        await asyncio.sleep(0.06)  # the read is old: the next filter reads again
        evicted_until = gate.evicted_until
        read_done, go_on = asyncio.Event(), asyncio.Event()

        async def slow(pools: list[str]) -> dict[str, int]:
            found = await evicted_until(pools)  # routable, read before the eviction
            read_done.set()
            await go_on.wait()  # its answer is handled after the reserve's
            return found

        monkeypatch.setattr(gate, "evicted_until", slow)
        routing = asyncio.create_task(w.guard.async_filter_deployments("g", deps, None, {}))
        await read_done.wait()
        await w.guard.async_pre_call_deployment_hook(call(), "acompletion")  # evicts the pool
        assert w.state()["evicted_until"] > 0
        go_on.set()
        assert len(await routing) == 1  # that request routed on what it read: fine
        monkeypatch.setattr(gate, "evicted_until", evicted_until)
        with pytest.raises(QuotaRefused):  # the next one must see the eviction
            await w.guard.async_filter_deployments("g", deps, None, {})
    world(scenario)


def test_a_store_clock_off_this_hosts_refuses_with_a_503_until_they_agree(
        world: Callable[..., Any], caplog: pytest.LogCaptureFixture) -> None:
    """Redis's clock decides the Beijing day: 10 minutes fast, it burned 800,000 past the cap at
    midnight (red-team, stop 37). The sync thread's check sees the skew and the hook refuses
    guarded calls with a 503 naming it; once the clocks agree, calls are admitted again."""
    async def scenario(w: World) -> None:
        w.seed(100_000)
        alarm = SkewAlarm()
        svc = SyncService(w.settings, w.sync, lambda: [], alarm=alarm)
        guard = QuotaGuard(w.settings, AsyncGate(connect_async(TEST_REDIS_URL), w.keyspace), alarm=alarm)
        with caplog.at_level(logging.WARNING, logger="volc_quota_guard"):
            svc.check_clock(host_s=lambda: time.time() - 600)  # Redis reads 600 s ahead of this host
            assert alarm.reason is not None and "+600" in alarm.reason
            with pytest.raises(QuotaStoreDown) as err:
                await guard.async_pre_call_deployment_hook(call(max_tokens=10), "acompletion")
            assert err.value.status_code == 503 and "VQG_MAX_CLOCK_SKEW_SECONDS" in str(err.value)
            assert w.state()["inflight"] == 0
            svc.check_clock()  # the real clocks: the same machine
        assert alarm.reason is None
        assert "⛔ [CLOCK]" in caplog.text and "✅ [CLOCK]" in caplog.text
        assert await guard.async_pre_call_deployment_hook(call(max_tokens=10), "acompletion") is not None
        assert w.state()["inflight"] > 0
    world(scenario)


def test_no_sync_runs_on_a_distrusted_clock_and_one_runs_once_it_is_fixed(
        world: Callable[..., Any]) -> None:
    """A sync on a wrong clock stamps its times in the store (the next sync, the snapshot's
    validity, the listing order): fixed, the clock then kept an old snapshot and refused newer
    listings (red-team, stop 37). While the alarm is set nothing syncs; a sync record from the
    future (a clock since set back) makes a sync due at once."""
    async def scenario(w: World) -> None:
        alarm = SkewAlarm()
        svc = SyncService(w.settings, w.sync, lambda: [PoolSpec(POOL)], alarm=alarm)
        synced: list[str] = []
        svc.maybe_sync = lambda account, specs: synced.append(account)  # type: ignore[method-assign]
        svc.check_clock = lambda host_s=None: None  # type: ignore[method-assign]
        alarm.reason = "the Redis server's clock is +600.0 s off this host's"
        svc.tick()
        assert synced == []
        alarm.reason = None
        svc.tick()
        assert synced == ["acct-a"]
        now = w.sync.now_ms()
        w.sync.records.write_sync_meta("acct-a", {"next_at": now + 3_600_000, "last_at": now + 600_000})
        assert svc.due("acct-a", [PoolSpec(POOL)], now) is not None
        w.sync.records.write_sync_meta("acct-a", {"last_at": now - 60_000})
        assert svc.due("acct-a", [PoolSpec(POOL)], now) is None
    world(scenario)


def test_a_call_may_not_run_past_the_longest_the_sync_plans_for(world: Callable[..., Any]) -> None:
    """The sync keeps off the wall a package expiring within a snapshot's validity plus
    VQG_MAX_CALL_SECONDS (and a TTL); a call allowed to run longer could outlive it (90-minute
    calls billed 680,500 with a TTL's lookahead, red-team stop 37): its timeout is capped there."""
    async def scenario(w: World) -> None:
        w.seed(100_000)
        guard = QuotaGuard(load_settings(max_call_seconds=600),
                           AsyncGate(connect_async(TEST_REDIS_URL), w.keyspace))
        kw = call(max_tokens=10, call_id="long-1")
        await guard.async_pre_call_deployment_hook(kw, "acompletion")  # LiteLLM's default: 6,000 s
        assert kw["timeout"] == 600
        kw = call(max_tokens=10, call_id="long-2", timeout=30)
        await guard.async_pre_call_deployment_hook(kw, "acompletion")
        assert kw["timeout"] == 30
        for i, sent in enumerate(["86400", "1e9", "nan", "soon"]):  # LiteLLM reads strings too
            kw = call(max_tokens=10, call_id=f"long-s{i}", timeout=sent)
            await guard.async_pre_call_deployment_hook(kw, "acompletion")
            assert kw["timeout"] == 600, sent
    world(scenario)


def test_a_stream_is_cut_at_the_calls_deadline(world: Callable[..., Any]) -> None:
    """LiteLLM's timeout is a per-read one: a stream whose chunks keep coming ran past
    VQG_MAX_CALL_SECONDS (105 s against a 70 s cap, red-team stop 37), past the package expiry
    the sync planned for. The hook cuts it at the deadline, even mid-wait, and closes it."""
    async def scenario(w: World) -> None:
        w.seed(100_000)
        guard = QuotaGuard(load_settings(max_call_seconds=1.5),
                           AsyncGate(connect_async(TEST_REDIS_URL), w.keyspace))
        holder = types.SimpleNamespace()
        kw = call(holder, max_tokens=100, stream=True)
        await guard.async_pre_call_deployment_hook(kw, "acompletion")
        assert kw["timeout"] == 1.5
        # a fallback LiteLLM switched to mid-stream holds its own reservation (red-team, stop 38)
        await guard.async_pre_call_deployment_hook(call(holder, model_id="dep-b", max_tokens=100,
                                                        stream=True), "acompletion")
        held, used = w.state()["inflight"], w.state()["ucum"]
        assert held > 200 and len(holder._vqg_state.live) == 2
        closed: list[bool] = []

        class Upstream:
            def __init__(self, gaps: list[float]) -> None:
                self.gaps = iter(gaps)

            def __aiter__(self) -> Upstream:
                return self

            async def __anext__(self) -> float:
                gap = next(self.gaps, None)
                if gap is None:
                    raise StopAsyncIteration
                await asyncio.sleep(gap)
                return gap

            async def aclose(self) -> None:
                closed.append(True)

        request = {"litellm_logging_obj": holder}
        got: list[float] = []
        cuts = metrics.STREAM_CUTS.labels(POOL)._value.get()
        started = time.monotonic()
        with pytest.raises(litellm.Timeout, match="VQG_MAX_CALL_SECONDS"):
            async for c in guard.async_post_call_streaming_iterator_hook(
                    None, Upstream([0.5, 0.5, 5.0, 0.1]), request):  # the third read stalls
                got.append(c)
        assert got == [0.5, 0.5] and closed == [True]
        assert metrics.STREAM_CUTS.labels(POOL)._value.get() - cuts == 2  # one per reservation
        # both settled whole, now (not at their expiry, an hour on): Ark may still run them
        assert w.state()["inflight"] == 0 and w.state()["ucum"] - used >= held
        assert not holder._vqg_state.live
        assert time.monotonic() - started < 3  # cut at the deadline, not after the stalled read
        # a client's own (per-read) timeout does not cut its stream: only the cap does
        kw = call(types.SimpleNamespace(), max_tokens=100, stream=True, timeout=0.5, call_id="own")
        await guard.async_pre_call_deployment_hook(kw, "acompletion")
        own = kw["litellm_logging_obj"]._vqg_state
        got = [c async for c in guard.async_post_call_streaming_iterator_hook(
            None, Upstream([0.4, 0.4, 0.4]), {"litellm_logging_obj": kw["litellm_logging_obj"]})]
        assert got == [0.4, 0.4, 0.4] and own.live  # ran 1.2 s on a 0.5 s timeout: not cut
        # an unguarded stream (no reservation) passes whole
        plain = [c async for c in guard.async_post_call_streaming_iterator_hook(
            None, Upstream([0.0, 0.0]), {})]
        assert plain == [0.0, 0.0]
    world(scenario)
