"""What the guard reads from, and writes into, one LiteLLM call.

LiteLLM hands each hook a different view of the same call (router kwargs, the logging
object's details, the proxy's request data). These helpers find the deployment, the metadata
and the per-request state in each of them, in one place.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import admission
from ..errors import GuardConfigError
from .deployments import (
    AFTER_HOOK_PARAMS,
    PROVIDER,
    GuardedDeployment,
    api_base_of,
    api_key_of,
    conflicts,
    flag,
    guard_for,
    guard_for_deployment,
    is_ark_base,
    split_provider,
)

STASH_KEY = "vqg_reservations"  # model_id -> reservation id, in the call's metadata
POOL_READ_S = 1.0  # a pool read as routable this recently is not read again for routing


@dataclass
class Reservation:
    """One admitted reservation of one deployment attempt."""

    rid: str
    pool: str
    model_id: str
    upstream_model: str
    model_group: str
    call_id: str
    input_tokens: int
    output_cap: int  # per choice, answer + reasoning: what the upstream is capped at
    granted: int
    clamped_to: int | None  # the lowered per-choice cap, when the headroom was short
    created: float = field(default_factory=time.monotonic)
    choices: int = 1
    state: RequestState | None = field(default=None, repr=False)
    sent: bool = False  # LiteLLM announced the HTTP request to the upstream
    route: str = ""  # the route kind it was sized for ("messages": its chat half may ride it)
    handed_over: bool = False  # a /v1/messages reservation its chat half already rode
    keep_until: float = 0.0  # monotonic: kept (and its deadline renewed) until then (`remember`)
    call_until: float = math.inf  # monotonic: a stream still running then is cut (the call's deadline)


@dataclass
class RequestState:
    """Per-request guard state, hung on LiteLLM's logging object (the client cannot touch it)."""

    live: dict[str, Reservation] = field(default_factory=dict)  # model_id -> reservation
    refused: set[str] = field(default_factory=set)  # model ids that refused this request
    clamped_to: int | None = None
    stream: object = None  # the proxy's stream of this request, to read its raw chunks
    # A Responses stream's terminal event: did its usage come from the upstream? (None: not seen.)
    # LiteLLM fills a missing one in with a local estimate of the input and the streamed text.
    responses_usage: bool | None = None


def request_state(holder: Mapping[str, Any] | None) -> RequestState:
    logging_obj = (holder or {}).get("litellm_logging_obj")
    if logging_obj is None:
        return RequestState()
    state = getattr(logging_obj, "_vqg_state", None)
    if not isinstance(state, RequestState):
        state = RequestState()
        try:
            logging_obj._vqg_state = state
        except AttributeError:  # a slotted object: per-call state only
            pass
    return state


def metadata_key(kwargs: Mapping[str, Any]) -> str:
    # /v1/messages and /v1/responses keep LiteLLM's metadata in `litellm_metadata`;
    # their `metadata` is the provider's own parameter and must not be touched.
    return "litellm_metadata" if "litellm_metadata" in kwargs else "metadata"


def metadatas(kwargs: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    found: list[Mapping[str, Any]] = []
    params = kwargs.get("litellm_params")
    for holder in (kwargs, params if isinstance(params, Mapping) else {}):
        for key in ("litellm_metadata", "metadata"):
            md = holder.get(key)
            if isinstance(md, Mapping):
                found.append(md)
    return found


def model_info_of(kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
    """The router-set `model_info` of the deployment serving this call."""
    params = kwargs.get("litellm_params")
    for md in metadatas(kwargs):
        info = md.get("model_info")
        if isinstance(info, Mapping) and info.get("id"):
            return info
    for holder in (params if isinstance(params, Mapping) else {}, kwargs):
        info = holder.get("model_info")
        if isinstance(info, Mapping) and info.get("id"):
            return info
    return {}


def model_group_of(kwargs: Mapping[str, Any]) -> str:
    for md in metadatas(kwargs):
        group = md.get("model_group")
        if isinstance(group, str) and group:
            return group
    return str(kwargs.get("model") or "?")


def llm_router() -> Any:
    proxy_server = sys.modules.get("litellm.proxy.proxy_server")
    return getattr(proxy_server, "llm_router", None) if proxy_server else None


def guard_of_call(kwargs: Mapping[str, Any]) -> GuardedDeployment | None:
    """The guard of the deployment this call was routed to.

    The router's own copy of the deployment is authoritative; the call's fields are used only
    when the router does not know the id (SDK use, client-side-credential deployments).
    Raises GuardConfigError for a deployment that cannot be guarded as configured, one whose
    pool would count an account twice (`deployments.conflicts`), and a call that reaches Ark
    through a deployment the guard passes without being told to (a `*` wildcard, say).
    """
    info = model_info_of(kwargs)
    model_id = info.get("id")
    router = llm_router()
    if router is not None and not isinstance(model_id, str):
        model_id = built_from(router, kwargs)
    if router is not None and isinstance(model_id, str):
        raw = _router_entry(router, model_id)
        hit = _guards.get(model_id) if raw is not None else None
        if hit is not None and hit[0] is raw and hit[1] == _fingerprint(raw):
            return _checked(hit[2], kwargs, raw.get("model_info") or {})  # the operator's, not the call's
        try:
            dep = router.get_deployment(model_id=model_id)
        except Exception:  # noqa: BLE001
            dep = None
        if dep is not None:
            found: GuardedDeployment | None | GuardConfigError
            try:
                found = guard_for_deployment(dep.model_dump(exclude_none=True))
                why = conflicts(router.model_list).get(model_id) if found is not None else None
                if why is not None:
                    found = GuardConfigError(f"deployment {model_id!r}: {why}")
            except GuardConfigError as exc:
                found = exc
            if raw is not None:
                if len(_guards) >= GUARD_CACHE_SIZE:
                    _guards.clear()
                _guards[model_id] = (raw, _fingerprint(raw), found)
            return _checked(found, kwargs, dep.model_info.model_dump() if dep.model_info else {})
    return _checked(guard_for(kwargs.get("model"), kwargs.get("custom_llm_provider"), info), kwargs, info)


def built_from(router: Any, kwargs: Mapping[str, Any]) -> str | None:
    """The id of the router deployment a call without one was made from: LiteLLM's health checks
    call `acompletion` with a deployment's `litellm_params` and no `model_info`, and Ark bills
    them to that deployment's account (the first with the same model, key and endpoint)."""
    model = kwargs.get("model")
    if not isinstance(model, str):
        return None
    key, base = api_key_of(kwargs), api_base_of(kwargs)
    for dep in getattr(router, "model_list", None) or ():
        params = dep.get("litellm_params") if isinstance(dep, Mapping) else None
        if isinstance(params, Mapping) and params.get("model") == model \
                and api_key_of(params) == key and api_base_of(params) == base:
            found = (dep.get("model_info") or {}).get("id")
            return found if isinstance(found, str) else None
    return None


def deployment_id_of(kwargs: Mapping[str, Any]) -> str:
    """The id of the deployment serving this call (its `model_info`, else the one it was built
    from: `built_from`), or "" (SDK use)."""
    found = model_info_of(kwargs).get("id")
    if not isinstance(found, str):
        router = llm_router()
        found = built_from(router, kwargs) if router is not None else None
    return found or ""


def foreign_credentials(kwargs: Mapping[str, Any]) -> str | None:
    """The field that sends this call with credentials or to an endpoint its deployment was not
    configured with, or None. The proxy's pre-call check refuses a client's `api_key`, `api_base`
    and auth headers for the group the client named; a client-side fallback (`fallbacks`,
    `context_window_fallbacks`, …) from a group with no guarded deployment carries them to a
    guarded one past that check, and LiteLLM lets them override the deployment's own."""
    router = llm_router()
    info = model_info_of(kwargs)
    model_id = info.get("id")
    raw = _router_entry(router, model_id) if router is not None and isinstance(model_id, str) else None
    if raw is None:
        # LiteLLM builds a per-request deployment for a call with a client's api_key / api_base
        # (`Router._handle_clientside_credential`): its id is new, `original_model_id` names ours.
        original = info.get("original_model_id")
        if router is not None and isinstance(original, str) and _router_entry(router, original) is not None:
            return next((n for n in admission.CLIENT_CREDENTIALS if kwargs.get(n) is not None), "api_key")
        return None  # SDK use: the caller's kwargs are the deployment
    params = raw.get("litellm_params")
    params = params if isinstance(params, Mapping) else {}
    for name in admission.CLIENT_CREDENTIALS:
        value = kwargs.get(name)
        if value is not None and value != params.get(name):
            return name
    for header_field in ("headers", "extra_headers"):
        value = kwargs.get(header_field)
        own = params.get(header_field)
        own = {str(k).lower(): v for k, v in own.items()} if isinstance(own, Mapping) else {}
        pairs = list(value.items()) if isinstance(value, Mapping) else (
            [tuple(p) for p in value if isinstance(p, list | tuple) and len(p) == 2]
            if isinstance(value, list | tuple) else [])
        for key, header in pairs:
            name = str(key).strip().lower()
            if name in admission.AUTH_HEADERS and own.get(name) != header:
                return f"{header_field}.{key}"
    return None


def _checked(found: GuardedDeployment | None | GuardConfigError, kwargs: Mapping[str, Any],
             info: Mapping[str, Any]) -> GuardedDeployment | None:
    if isinstance(found, GuardConfigError):
        raise found
    if found is None and flag(info.get("vqg_guard")) is not False:
        # Not guarded, and not opted out: the call itself must not be bound for Ark.
        model, provider = kwargs.get("model"), kwargs.get("custom_llm_provider")
        upstream, resolved = split_provider(str(model or ""), provider if isinstance(provider, str) else None)
        if resolved == PROVIDER or is_ark_base(api_base_of(kwargs)):
            raise GuardConfigError(
                f"this call goes to Ark ({resolved}/{upstream}) through deployment "
                f"{info.get('id') or model!r}, which the quota guard does not guard (a wildcard or "
                "another provider?): add a volcengine deployment for the model, or set "
                "model_info.vqg_guard: false on that deployment to pass it unguarded")
    return found


# model id -> (the router's deployment dict, its fingerprint, its guard or why it has none):
# `guard_of_call` per request rebuilt a pydantic Deployment and dumped it again for a value
# that only changes when the router's model list does. An entry holds only while the router
# still has that very dict for the id with the same fields the guard is read from (a reload,
# an added, removed or edited deployment is a miss; a miss re-reads the whole list's conflicts).
GUARD_CACHE_SIZE = 4096
_guards: dict[str, tuple[Mapping[str, Any], tuple[object, ...],
                         GuardedDeployment | None | GuardConfigError]] = {}


def _router_entry(router: Any, model_id: str) -> Mapping[str, Any] | None:
    """The router's own dict for a deployment id (what `Router.get_deployment` reads), or None."""
    try:
        found = router.model_list[router.model_id_to_deployment_index_map[model_id]]
    except (AttributeError, KeyError, IndexError, TypeError):
        return None
    return found if isinstance(found, dict) else None


def _fingerprint(raw: Mapping[str, Any]) -> tuple[object, ...]:
    """What `guard_for_deployment` and `conflicts` read from a deployment, as a value to compare."""
    params = raw.get("litellm_params")
    params = params if isinstance(params, Mapping) else {}
    info = raw.get("model_info")
    read = ("model", "custom_llm_provider", "api_base", "base_url", "api_key", "litellm_credential_name",
            "additional_drop_params",
            *AFTER_HOOK_PARAMS)
    return (*(repr(params.get(k)) for k in read), dict(info) if isinstance(info, Mapping) else info)


def call_type_name(call_type: object) -> str:
    value = getattr(call_type, "value", call_type)
    return str(value) if value is not None else ""


def upstream_sent_usage(state: RequestState | None) -> bool:
    """False only when we saw the raw chunks of a stream and none carried usage.

    LiteLLM synthesizes a usage chunk by local counting when the upstream sent none, so the
    client-facing stream cannot tell; its raw chunk list can.
    """
    if state is not None and state.responses_usage is not None:
        return state.responses_usage
    chunks = getattr(state.stream, "chunks", None) if state is not None else None
    if not isinstance(chunks, list):
        return True  # not watched (SDK use): trust the reported usage
    return any(carries_usage(c) for c in chunks)


RESPONSES_TERMINAL_EVENTS = ("response.completed", "response.incomplete")


def upstream_responses_usage(usage: object) -> bool:
    """Whether a Responses terminal event's usage is the upstream's. Ark reports
    `input_tokens_details` / `output_tokens_details` (ARK.md §2); LiteLLM's stand-in for a
    missing usage (`responses/streaming_iterator.py: _estimate_usage_from_text`) carries neither,
    and counts neither reasoning nor a stored chain: without them the usage counts as estimated."""
    if usage is None:
        return False
    details = [usage.get(k) if isinstance(usage, dict) else getattr(usage, k, None)
               for k in ("input_tokens_details", "output_tokens_details")]
    return any(d is not None for d in details)


def carries_usage(chunk: object) -> bool:
    usage = chunk.get("usage") if isinstance(chunk, dict) else getattr(chunk, "usage", None)
    if usage is None:
        return False
    total = usage.get("total_tokens") if isinstance(usage, dict) else getattr(usage, "total_tokens", 0)
    return isinstance(total, int) and total > 0


def group_size(kwargs: Mapping[str, Any]) -> int | None:
    for md in metadatas(kwargs):
        size = md.get("model_group_size")
        if isinstance(size, int):
            return size
    return None


def upstream_response_id(response_id: object) -> str | None:
    """The upstream's id of a Responses API response, whether LiteLLM encoded it or not.

    The proxy hands clients ids that carry routing information and decodes a
    ``previous_response_id`` before sending it on; records are kept under the upstream's id.
    """
    if not isinstance(response_id, str) or not response_id:
        return None
    try:
        from litellm.responses.utils import ResponsesAPIRequestUtils

        decoded = ResponsesAPIRequestUtils.decode_responses_api_response_id(response_id)
        found = decoded.get("response_id") if isinstance(decoded, Mapping) else getattr(
            decoded, "response_id", None)
        return str(found) if found else response_id
    except Exception:  # noqa: BLE001  not an encoded id
        return response_id


def _own_metadata(kwargs: dict[str, Any]) -> dict[str, Any]:
    key = metadata_key(kwargs)
    md = kwargs.get(key)
    if not isinstance(md, dict):
        md = {}
        kwargs[key] = md
    return md


class Reservations:
    """This process's live reservations by id; a call's metadata only names one (the client
    can write metadata, so a stash counts only when it points in here)."""

    def __init__(self) -> None:
        self._by_rid: dict[str, Reservation] = {}

    def __contains__(self, rid: object) -> bool:
        return rid in self._by_rid

    def values(self) -> list[Reservation]:
        return list(self._by_rid.values())

    def remember(self, res: Reservation, keep_s: float) -> None:
        """Keep `res` for `keep_s` seconds (as long as its request may run, and well past the
        store's deadline): its deadline is renewed meanwhile, and a request that outlives it
        still settles under its own id. Pruning goes in creation order and stops at the first
        entry still kept."""
        now = time.monotonic()
        res.keep_until = now + keep_s
        while self._by_rid:
            rid, old = next(iter(self._by_rid.items()))
            if old.keep_until > now:
                break
            del self._by_rid[rid]  # its callback was lost; the store counted it at expiry
        self._by_rid[res.rid] = res

    def stashed(self, kwargs: Mapping[str, Any], model_id: str) -> Reservation | None:
        """Our reservation for this deployment, if the stash in the call's metadata is genuine."""
        for md in metadatas(kwargs):
            stash = md.get(STASH_KEY)
            rid = stash.get(model_id) if isinstance(stash, Mapping) else None
            res = self._by_rid.get(rid) if isinstance(rid, str) else None
            if res is not None and res.model_id == model_id:
                return res
        return None

    def all_stashed(self, kwargs: Mapping[str, Any]) -> list[Reservation]:
        """Every reservation of ours the call's metadata names (any deployment) still unsettled."""
        found: dict[str, Reservation] = {}
        for md in metadatas(kwargs):
            stash = md.get(STASH_KEY)
            for model_id, rid in (stash.items() if isinstance(stash, Mapping) else ()):
                res = self._by_rid.get(rid) if isinstance(rid, str) else None
                if res is not None and res.model_id == model_id:
                    found[res.rid] = res
        return list(found.values())

    def forget(self, res: Reservation, state: RequestState | None = None) -> None:
        self._by_rid.pop(res.rid, None)
        if state is not None and state.live.get(res.model_id) is res:
            del state.live[res.model_id]


def stamp(kwargs: dict[str, Any], route: admission.Route, res: Reservation) -> dict[str, Any]:
    """Write an admitted reservation into the call: the output cap it was sized for (or clamped
    to), usage on a chat stream, and the reservation's id in the stash."""
    admission.pin_output(kwargs, route, res.output_cap if res.clamped_to is None else res.clamped_to)
    if kwargs.get("stream") is True and route.kind == "chat":
        options = kwargs.get("stream_options")
        options = dict(options) if isinstance(options, Mapping) else {}
        options["include_usage"] = True  # without it a stream reports 0/0 usage
        kwargs["stream_options"] = options
    md = _own_metadata(kwargs)
    stash = md.get(STASH_KEY)
    stash = dict(stash) if isinstance(stash, Mapping) else {}
    stash[res.model_id] = res.rid
    md[STASH_KEY] = stash
    return kwargs


class PoolReads:
    """This process's last eviction read of each pool, for routing only: a pool read as routable
    less than POOL_READ_S ago is not read again (most requests skip a round trip at load); one
    read as evicted always is. The reserve stays the only authority: a pool evicted meanwhile by
    another process refuses at its reserve, and this process's own answers that evict a pool
    forget its read at once."""

    def __init__(self) -> None:
        self._reads: dict[str, tuple[int, float]] = {}  # pool -> (evicted until, host ms; read at)
        self._forgets = 0  # forget() calls so far
        self._forgot: dict[str, int] = {}  # pool -> self._forgets at its last forget

    def find(self, pools: list[str]) -> dict[str, int] | None:
        now, wall_ms = time.monotonic(), time.time() * 1000
        found, old = {}, False
        for pool in pools:
            read = self._reads.get(pool)
            if read is None or read[0] > wall_ms:
                return None  # never read, or evicted: read it
            found[pool] = read[0]
            old = old or now - read[1] >= POOL_READ_S
        if old:  # this caller reads; the requests behind it route on the last read meanwhile
            self.keep(found)
            return None
        return found

    def mark(self) -> int:
        """Taken before a read: `keep(read, since=mark)` skips pools forgotten meanwhile (a read
        sent before this process's answer evicted the pool must not bring its routable read back)."""
        return self._forgets

    def keep(self, read: Mapping[str, int], since: int | None = None) -> None:
        now = time.monotonic()
        for pool, until in read.items():
            if since is None or self._forgot.get(pool, 0) <= since:
                self._reads[pool] = (until, now)

    def forget(self, pool: str) -> None:
        self._forgets += 1
        self._forgot[pool] = self._forgets
        self._reads.pop(pool, None)


def guards_of_group(router: Any, model: str, data: Mapping[str, Any]
                    ) -> tuple[list[GuardedDeployment], bool]:
    """The guarded deployments of a model group, and whether every deployment is guarded."""
    try:
        _, found = router._common_checks_available_deployment(model=model, request_kwargs=data)
    except Exception:  # noqa: BLE001  unknown model: the router answers it
        return [], False
    deployments = [found] if isinstance(found, dict) else list(found or [])
    guards = []
    for dep in deployments:
        try:
            guards.append(guard_for_deployment(dep))
        except GuardConfigError:
            guards.append(None)  # refused at the deployment gate with a clear message
    guarded = [g for g in guards if g is not None]
    return guarded, len(guarded) == len(deployments)
