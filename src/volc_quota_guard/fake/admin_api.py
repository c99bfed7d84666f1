"""The fake's admin JSON endpoints under ``/_fake/`` (no auth: it binds to localhost).

    GET    /_fake/state                  clock, accounts, per-pool totals, API call counts
    GET    /_fake/pool?pool=ACCT/MODEL   one pool: totals, true packages, API view
    POST   /_fake/packages               {pool, amount, acquired_ms?, expires_ms?, available?,
                                          configuration_code?, …} or {pool, replace: true,
                                          packages: [...]}
    POST   /_fake/raw-packages           {account, package: {...API fields...}} | {account, clear}
    POST   /_fake/collection             {pool, tokens, day? | days_ago? (default 1)}
    POST   /_fake/consume                {pool, tokens}: usage that bypasses the proxy
    GET    /_fake/defaults               chat defaults and the settlement lag
    POST   /_fake/defaults               {completion_tokens?, prompt_tokens?, cached_tokens?,
                                          reasoning_tokens?, media_tokens?, count_cached?,
                                          delay_s?, settlement_lag_minutes?}
    POST   /_fake/billing/faults         {kind, count?, account?}     DELETE: clear all faults
    POST   /_fake/billing/down           {until_ms, kind?, account?}
    POST   /_fake/billing/pagination     {quirk: none|overlap|stuck}
    GET    /_fake/billing/calls          {account: calls}             DELETE: reset
    GET    /_fake/chat/requests          [chat records]               DELETE: clear (both logs)
    GET    /_fake/upstream/requests      [{method, path, body}]: Ark requests as received
    GET    /_fake/clock                  {now_ms, now}
    POST   /_fake/clock                  {advance_ms} | {set_ms}
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any
from urllib.parse import parse_qs

from ..clock import beijing_day, to_beijing
from .billing_api import Reply, json_reply
from .state import BILLING_FAULTS, FakeState


def _clock(state: FakeState) -> dict[str, Any]:
    now = state.now_ms()
    return {"now_ms": now, "now": to_beijing(now).isoformat(), "beijing_day": beijing_day(now)}


def _pool(state: FakeState, pool: str) -> dict[str, Any]:
    return {
        "totals": asdict(state.pool_totals(pool)),
        "packages": [asdict(v) for v in state.true_packages(pool)],
        "api_packages": [asdict(v) for v in state.api_packages(pool)],
    }


def _defaults(state: FakeState) -> dict[str, Any]:
    return asdict(state.get_chat_defaults()) | {
        "settlement_lag_minutes": state.ledger.lag_ms / 60_000}


_PACKAGE_FIELDS = {"amount", "acquired_ms", "expires_ms", "available", "configuration_code",
                   "configuration_name", "product", "product_name", "unit", "instance_no"}


def _package_args(spec: dict[str, Any]) -> dict[str, Any]:
    unknown = set(spec) - _PACKAGE_FIELDS
    if unknown:
        raise ValueError(f"unknown package fields {sorted(unknown)}")
    return spec


def handle_admin(state: FakeState, method: str, path: str, query: str, body: bytes) -> Reply:
    try:
        data = json.loads(body) if body else {}
        if not isinstance(data, dict):
            raise ValueError("the body must be a JSON object")
        return _route(state, method, path.removeprefix("/_fake"), parse_qs(query), data)
    except (ValueError, KeyError, TypeError) as exc:
        return json_reply(400, {"error": f"{type(exc).__name__}: {exc}"})


def _route(state: FakeState, method: str, path: str, query: dict[str, list[str]],
           data: dict[str, Any]) -> Reply:
    route = (method, path.rstrip("/"))
    if route == ("GET", "/state"):
        with state.lock:
            pools = {p: asdict(state.pool_totals(p)) for p in state.ledger.pools()}
            return json_reply(200, _clock(state) | {
                "accounts": sorted(state.accounts), "pools": pools,
                "api_calls": state.all_api_calls(), "defaults": _defaults(state)})
    if route == ("GET", "/pool"):
        return json_reply(200, _pool(state, query["pool"][0]))
    if route == ("POST", "/packages"):
        pool = data.pop("pool")
        if data.pop("replace", False):
            specs = [_package_args(dict(p)) for p in data.pop("packages", [])]
            return json_reply(200, {"instance_nos": state.replace_packages(pool, specs)})
        args = _package_args(data)
        return json_reply(200, {"instance_no": state.add_package(pool, **args)})
    if route == ("POST", "/raw-packages"):
        if data.get("clear"):
            state.clear_raw_packages(data.get("account"))
        else:
            state.add_raw_package(data["account"], data["package"])
        return json_reply(200, {"ok": True})
    if route == ("POST", "/collection"):
        day = data.get("day")
        if day is None:
            day = beijing_day(state.now_ms()) - int(data.get("days_ago", 1))
        state.set_collection(data["pool"], int(day), int(data["tokens"]))
        return json_reply(200, {"ok": True, "day": day})
    if route == ("POST", "/consume"):
        return json_reply(200, asdict(state.consume(data["pool"], int(data["tokens"]))))
    if route == ("GET", "/defaults"):
        return json_reply(200, _defaults(state))
    if route == ("POST", "/defaults"):
        lag = data.pop("settlement_lag_minutes", None)
        with state.lock:
            if lag is not None:
                state.ledger.set_lag(float(lag), state.now_ms())
            state.set_chat_defaults(**data)
            return json_reply(200, _defaults(state))
    if route == ("POST", "/billing/faults"):
        state.inject_billing_fault(data["kind"], int(data.get("count", 1)), data.get("account"))
        return json_reply(200, {"ok": True, "kinds": BILLING_FAULTS})
    if route == ("DELETE", "/billing/faults"):
        state.clear_billing_faults()
        return json_reply(200, {"ok": True})
    if route == ("POST", "/billing/down"):
        state.billing_down_until(int(data["until_ms"]), data.get("kind", "unavailable"),
                                 data.get("account"))
        return json_reply(200, {"ok": True})
    if route == ("POST", "/billing/pagination"):
        state.set_pagination_quirk(data["quirk"])
        return json_reply(200, {"ok": True})
    if route == ("GET", "/billing/calls"):
        return json_reply(200, state.all_api_calls())
    if route == ("DELETE", "/billing/calls"):
        state.reset_api_calls()
        return json_reply(200, {"ok": True})
    if route == ("GET", "/chat/requests"):
        return json_reply(200, [r.as_dict() for r in state.chat_requests()])
    if route == ("GET", "/upstream/requests"):
        return json_reply(200, [asdict(r) for r in state.upstream_requests()])
    if route == ("DELETE", "/chat/requests"):
        state.clear_chat_requests()
        return json_reply(200, {"ok": True})
    if route == ("GET", "/clock"):
        return json_reply(200, _clock(state))
    if route == ("POST", "/clock"):
        if "set_ms" in data:
            target = int(data["set_ms"])
            with state.lock:
                now = state.now_ms()
                if target < now:
                    raise ValueError("the clock never goes back")
                state.advance(target - now)
        else:
            state.advance(int(data["advance_ms"]))
        return json_reply(200, _clock(state))
    return json_reply(404, {"error": f"no admin route {method} /_fake{path}"})
