"""The one admission rule: what a request may bill on Ark, sized from the request Ark receives.

LiteLLM sends Ark the client's fields with ``extra_body`` merged over them last (and moves
fields it does not know into ``extra_body``), so the sizing reads that merged *upstream view*,
never the client's top-level fields alone. What Ark bills (docs/gate.md):

- input: messages, tools, input items, instructions, prompt, system — tokenized; media at
  Ark's image formula (`media.py`); a stored conversation re-read through
  ``previous_response_id``; any other field Ark receives is bounded by its ASCII-escaped JSON length;
- output: ``n`` × (answer + reasoning). On chat, ``max_tokens`` caps only the answer and
  reasoning is capped only by ``max_completion_tokens`` (which may not be sent with
  ``max_tokens``), so the guard pins ``max_completion_tokens`` — per choice, answer plus a
  reasoning allowance — and removes ``max_tokens``; on the Responses API ``max_output_tokens``
  already covers both.

A billable field the guard cannot bound is an `InvalidRequest` (HTTP 400 naming the field).
`size` is pure (no I/O): the hook, the consume task and the simulator size with it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from . import counting, estimate, media
from .errors import ConfigError, InvalidRequest
from .gate.values import MAX_REQUEST, Decision

Kind = Literal["chat", "responses", "embedding", "messages"]

MAX_CHOICES = 16  # n above this is a 400: n × output is too much to hold for one request
ARK_MAX_COMPLETION_TOKENS = 65_536  # Ark's range for max_completion_tokens
MAX_OUTPUT_TOKENS = estimate.MAX_OUTPUT_TOKENS
DEFAULT_REASONING_TOKENS = 8_192  # reasoning allowance when a deployment does not say
OUTPUT_PARAMS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
TEMPLATE_TOKENS = 8  # chat-template tokens Ark adds around each message it builds from a field
EMBED_INPUT_TOKENS = 1  # what Ark may add per embedding input beyond its text
# An exact tokenizer's count is floored at k = 1.1 for version drift, which on a message of a few
# tokens is less than one token: each message also gets this many (a template that differs a bit).
EXACT_DRIFT_TOKENS = 4
# A content list's text parts are counted one by one (joined, their tokens could merge across the
# joints: 10,000 "\n" parts are 1,260 V4 tokens as one text), each joint for what Ark may put
# there (a separator, a part marker): 20,000 empty parts billed 22,127 on a 41-token reservation.
PART_JOINT_TOKENS = 2


@dataclass(frozen=True)
class Route:
    """How the guard reads and caps one LiteLLM call type."""

    kind: Kind
    cap_field: str | None  # the upstream field that bounds answer + reasoning (None: no output)
    text_fields: tuple[str, ...]  # fields the tokenizer counts


_CHAT = Route("chat", "max_completion_tokens", ("messages",))
_RESPONSES = Route("responses", "max_output_tokens", ("input", "instructions"))
_EMBEDDING = Route("embedding", None, ("input",))
_MESSAGES = Route("messages", "max_tokens", ("messages", "system"))

# LiteLLM call type -> route. A guarded deployment refuses every other call type (batches,
# generateContent, realtime and WebSocket sessions): the guard could not settle what they bill.
ROUTES: dict[str, Route] = {
    "acompletion": _CHAT, "completion": _CHAT,
    "aresponses": _RESPONSES, "responses": _RESPONSES,
    "aembedding": _EMBEDDING, "embedding": _EMBEDDING,
    "anthropic_messages": _MESSAGES,
}
# Reading or deleting a stored response bills no tokens (Ark bills generation, not storage).
FREE_CALL_TYPES = frozenset({"aget_responses", "get_responses", "adelete_responses",
                             "delete_responses", "alist_input_items", "list_input_items"})

# Fields Ark receives that carry no billable text (numbers, switches, small enums).
_UNBILLED = frozenset({
    "model", "stream", "stream_options", "temperature", "top_p", "n", "stop", "seed", "user",
    "logprobs", "top_logprobs", "thinking", "reasoning_effort", "reasoning", "frequency_penalty",
    "presence_penalty", "logit_bias", "service_tier", "parallel_tool_calls", "store",
    "truncation", "include", "encoding_format", "dimensions", "top_k", "max_retries",
    "extra_headers", "timeout", "background", "previous_response_id",
    "expire_at", "prompt_cache_key", "safety_identifier",
    *OUTPUT_PARAMS,
})
# Server-side context the guard cannot size (it never saw it being built).
_UNBOUNDED_CONTEXT = ("conversation", "context_id")
# Fields on which LiteLLM adds to the messages after the deployment hook sized them: retrieval
# (vector stores, knowledge bases), cache-control injection, a continue message between turns
# of the same role, a system prompt of its own (`completion()` applies them after the hook).
REWRITTEN_AFTER_HOOK = ("vector_store_ids", "knowledge_bases", "cache_control_injection_points",
                        "ensure_alternating_roles", "user_continue_message",
                        "assistant_continue_message", "litellm_system_prompt")
_UNBOUNDED_ITEMS = {"item_reference"}  # input items Ark expands from its own storage
_ITEM_ROLES = {"user", "assistant", "system", "developer"}
_internal: frozenset[str] | None = None


def _internal_params() -> frozenset[str]:
    """LiteLLM's own kwargs (routing, logging, credentials): never sent upstream as body fields."""
    global _internal
    if _internal is None:
        from litellm.types.utils import all_litellm_params

        _internal = frozenset(all_litellm_params) | {
            "extra_body", "litellm_parent_otel_span", "user_api_key_dict", "model_group_size",
            "litellm_trace_id", "litellm_session_id", "deployment", "request_timeout",
            "litellm_request_debug", "secret_fields", "proxy_server_request", "custom_llm_provider",
            "api_version", "headers", "client", "aresponses", "acompletion", "aembedding",
        }
    return _internal


def route_of(call_type: str) -> Route:
    """The route of a call type; a call type the guard cannot settle is the client's 400."""
    found = ROUTES.get(call_type)
    if found is None:
        raise InvalidRequest(
            "route", f"this route ({call_type or 'unknown'}) is not served for Volcengine deployments "
                     "guarded by the free-quota guard: its usage cannot be reserved and settled; "
                     "use /v1/chat/completions, /v1/responses, /v1/embeddings or /v1/messages")
    return found


def upstream_view(params: Mapping[str, Any]) -> dict[str, Any]:
    """The body fields Ark will receive: the call's own fields with ``extra_body`` merged over."""
    internal = _internal_params()
    view = {k: v for k, v in params.items() if k not in internal}
    extra = params.get("extra_body")
    if extra is not None and not isinstance(extra, Mapping):
        raise InvalidRequest("extra_body", "extra_body must be an object")
    if isinstance(extra, Mapping):
        if "model" in extra:  # the Responses path lets it pick the model Ark bills
            raise InvalidRequest("extra_body.model", "extra_body.model may not override the "
                                                     "deployment's model for guarded deployments")
        if "stream" in extra:  # Ark would stream to a call LiteLLM reads as one answer: a 5xx, retried
            raise InvalidRequest("extra_body.stream", "extra_body.stream may not be set for guarded "
                                                      "deployments; send stream at the top level")
        view.update(extra)
    return view


class ExactCounts:
    """Exact per-text counts for an "ark-api" deployment (Ark's tokenization API, text only).

    Sizing runs twice with it: first collecting (no counts: every text the count needs is noted
    in `texts` and counts 0), then with Ark's count of each of those texts. A text it was not
    given counts as its UTF-8 bytes (a token is at least a byte), never as 0.
    """

    def __init__(self, counts: Mapping[str, int] | None = None) -> None:
        self.counts = counts
        self.texts: list[str] = []

    def __call__(self, text: str) -> int:
        if not text:
            return 0
        if self.counts is None:
            self.texts.append(text)
            return 0
        found = self.counts.get(text)
        return found if found is not None else len(text.encode("utf-8", "surrogatepass"))


@dataclass(frozen=True)
class Limits:
    """What a deployment allows: from its ``model_info`` and the guard's settings."""

    model_max_output: int | None
    default_output: int
    reasoning_tokens: int  # allowance added to an answer-only cap while thinking is possible
    min_output: int
    context_window: int | None = None  # for a stored conversation the guard never saw
    media_part_tokens: int | None = None  # the operator's bound per video / audio / file part
    method: counting.Method = "cl100k"  # how prompts are counted (counting.method_for)
    # "ark-api" only: count text with Ark's tokenization API's counts (the hook's exact path)
    exact: ExactCounts | None = field(default=None, compare=False)


def limits_for(model_info: Mapping[str, Any], upstream_model: str, *, default_output: int,
               min_output: int) -> Limits:
    """A deployment's limits: ``model_info`` keys, else LiteLLM's model map, else the defaults."""
    def positive(name: str) -> int | None:
        value = model_info.get(name)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None

    reasoning = positive("vqg_reasoning_tokens")
    try:
        method = counting.method_for(upstream_model, model_info)
    except ConfigError as exc:  # a misconfigured deployment refuses (400), never passes
        raise InvalidRequest("model", f"quota guard misconfigured: {exc}") from None
    return Limits(
        model_max_output=estimate.model_max_output(model_info, upstream_model),
        default_output=default_output,
        reasoning_tokens=DEFAULT_REASONING_TOKENS if reasoning is None else reasoning,
        min_output=positive("vqg_min_output_tokens") or min_output,
        # only the operator's word: LiteLLM's map may give less than Ark's window (the chain
        # it sizes is then billed past its reservation)
        context_window=positive("max_input_tokens"),
        media_part_tokens=positive("vqg_media_part_tokens") or None,
        method=method,
    )


@dataclass(frozen=True)
class Sizing:
    """What one upstream call may bill: input, and ``choices`` × ``per_choice`` output."""

    input_tokens: int
    per_choice: int  # the output cap pinned upstream (answer + reasoning); 0 = no output
    choices: int
    least_per_choice: int  # a clamp below this is useless: refuse instead
    reasoning: int  # the allowance inside per_choice
    chain_tokens: int = 0  # the stored conversation re-read through previous_response_id

    @property
    def output(self) -> int:
        return self.per_choice * self.choices

    @property
    def least_output(self) -> int:
        return self.least_per_choice * self.choices

    def per_choice_for(self, granted_output: int) -> int:
        """The per-choice cap a grant of ``granted_output`` output tokens allows."""
        return min(self.per_choice, granted_output // self.choices) if self.choices else 0

    @property
    def wanted(self) -> int:
        """What to reserve: the input and the whole output, within the gate's per-request ceiling."""
        return min(self.input_tokens + self.output, MAX_REQUEST)

    @property
    def least(self) -> int:
        """The smallest grant worth taking: the input and the least useful output."""
        return self.input_tokens + self.least_output

    def check_fits(self) -> None:
        """A request whose least grant is over the gate's ceiling is the client's 400."""
        if self.least > MAX_REQUEST:
            raise InvalidRequest("messages", f"request too large: about {self.input_tokens:,} input tokens")

    def granted_per_choice(self, d: Decision) -> int:
        """The per-choice cap a grant allows: the grant less the input as the gate holds it (the
        pool's correction k applied), shared by the choices."""
        return self.per_choice_for(max(d.amount - d.input_reserved, 0))


def _cap(view: Mapping[str, Any], name: str) -> int | None:
    value = view.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidRequest(name, f"{name} must be a positive integer, got {value!r:.40}")
    if value > MAX_OUTPUT_TOKENS:
        raise InvalidRequest(name, f"{name}={value} is larger than any model allows "
                                   f"(at most {MAX_OUTPUT_TOKENS:,})")
    return value


def choices(view: Mapping[str, Any]) -> int:
    value = view.get("n", 1)
    if value is None:
        return 1
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_CHOICES:
        raise InvalidRequest("n", f"n must be an integer from 1 to {MAX_CHOICES} for a guarded "
                                  f"deployment (each choice bills its own output), got {value!r:.40}")
    return value


def thinking_possible(view: Mapping[str, Any]) -> bool:
    """False only when the request switches deep thinking off and nothing asks for it (Ark's
    default is model-dependent, so conflicting switches count as on)."""
    thinking = view.get("thinking")
    kind = thinking.get("type") if isinstance(thinking, Mapping) else None
    reasoning = view.get("reasoning")
    efforts = [view.get("reasoning_effort"),
               reasoning.get("effort") if isinstance(reasoning, Mapping) else None]
    if kind in ("enabled", "auto") or any(e not in (None, "minimal") for e in efforts):
        return True
    return not (kind == "disabled" or "minimal" in efforts)


def plan_output(*, answer_cap: int | None, total_cap: int | None, thinking: bool, limits: Limits,
                n: int, ceiling: int | None) -> tuple[int, int]:
    """(per-choice cap that bounds answer + reasoning, the reasoning allowance inside it).

    A total cap (``max_completion_tokens`` / ``max_output_tokens``) already bounds reasoning;
    an answer-only cap (``max_tokens``), or none, gets the allowance while thinking is possible.
    """
    allowance = limits.reasoning_tokens if thinking else 0
    if total_cap is not None:
        per, allowance = total_cap, 0
        if answer_cap is not None:
            per = min(per, answer_cap + (limits.reasoning_tokens if thinking else 0))
    else:
        # No cap from the client: Ark's own default answer cap (max_tokens 4,096), not the
        # model's maximum, so the guard neither holds nor lets Ark make more than Ark would.
        answer = answer_cap if answer_cap is not None else limits.default_output
        if limits.model_max_output:
            answer = min(answer, limits.model_max_output)
        per = answer + allowance
    if ceiling is not None:
        per = min(per, ceiling)
    return max(per, 1), allowance


# A client's own credentials or endpoint: LiteLLM lets them override the deployment's, so Ark
# would bill an account other than the pool the guard reserves in (found by a red-team pass).
CLIENT_CREDENTIALS = ("api_key", "api_base", "base_url")
AUTH_HEADERS = frozenset({"authorization", "api-key", "x-api-key"})


def validate(params: Mapping[str, Any], route: Route) -> None:
    """The cheap checks of a client's request body (before routing): credentials, caps, ``n``,
    messages. Only here: the deployment's kwargs carry the deployment's own key."""
    for name in CLIENT_CREDENTIALS:
        if params.get(name) is not None:
            raise InvalidRequest(name, f"{name}: a request may not choose the Ark account or endpoint "
                                       "of a guarded deployment (the guard reserves in the "
                                       "deployment's own account); it is refused")
    if params.get("custom_llm_provider") is not None:
        # Another provider's transformation of a guarded deployment's call: its caps and fields
        # are no longer the ones the guard sized, and a provider that errors puts the
        # deployment in cooldown for every client.
        raise InvalidRequest("custom_llm_provider", "custom_llm_provider: a request may not choose "
                                                    "the provider of a guarded deployment; it is refused")
    if params.get("stream") is not None and not isinstance(params["stream"], bool):
        # LiteLLM reads a non-boolean stream one way and sends it another (a /v1/messages call
        # answered as a stream of a non-stream reply was retried: 3 upstream calls for one).
        raise InvalidRequest("stream", "stream must be true or false")
    # LiteLLM sends both `extra_headers` and `headers` (a mapping, or a list of pairs httpx
    # accepts) with the upstream request: either can carry another account's Ark key.
    for name in ("extra_headers", "headers"):
        for key in _header_names(params.get(name), name):
            if str(key).strip().lower() in AUTH_HEADERS:
                raise InvalidRequest(f"{name}.{key}", f"{name}.{key:.40}: a request may not "
                                                      "send its own Ark credentials to a guarded "
                                                      "deployment; it is refused")
    view = upstream_view(params)
    # Only the client's body can hold one (the sizing's own `_check` need not walk it again).
    if _has_non_finite(view):  # JSON has no NaN: LiteLLM fails to send the call after the reserve
        # (a 500 the guard must keep as maybe-sent, and the router retries it: red-team, stop 44)
        where = _non_finite_path(view, "")
        raise InvalidRequest(where, f"{where}: NaN and Infinity are not JSON numbers; send a finite value")
    _check(view, params, route)


def _has_non_finite(obj: object) -> bool:
    """Whether a NaN or an infinity is anywhere in `obj` (containers walked, strings skipped)."""
    stack = [obj]
    while stack:
        value = stack.pop()
        if isinstance(value, float):
            if not math.isfinite(value):
                return True
        elif isinstance(value, Mapping):
            stack.extend(value.values())
        elif isinstance(value, list | tuple):
            stack.extend(value)
    return False


def _non_finite_path(obj: object, path: str) -> str:
    """Where the first NaN or infinity of `obj` is, as a field path (only on a refusal)."""
    if isinstance(obj, Mapping):
        items: Any = ((f"{path}.{k}" if path else str(k), v) for k, v in obj.items())
    elif isinstance(obj, list | tuple):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(obj))
    else:
        return path
    for where, value in items:
        if _has_non_finite(value):
            return _non_finite_path(value, where)
    return path


def _header_names(headers: object, field: str) -> list[object]:
    """The header names of a client's `headers` / `extra_headers` value; a shape the guard cannot
    read (that httpx might still send) is refused."""
    if headers is None:
        return []
    if isinstance(headers, Mapping):
        return list(headers)
    if isinstance(headers, list | tuple) and all(
            isinstance(pair, list | tuple) and len(pair) == 2 for pair in headers):
        return [pair[0] for pair in headers]
    raise InvalidRequest(field, f"{field} must be an object of header names and values")


def _check(view: Mapping[str, Any], params: Mapping[str, Any], route: Route) -> None:
    for key in view:  # Ark's fields are lowercase; a decoder matching names regardless of case
        # (Go's encoding/json) would read `N` as n, or a second `Max_Completion_Tokens` over the
        # pinned cap, unsized (red-team, stop 38)
        if isinstance(key, str) and key != key.lower():
            raise InvalidRequest(key, f"{key}: Ark's fields are lowercase, and a JSON decoder that "
                                      f"matches names regardless of case would read it as "
                                      f"{key.lower()!r}, which the quota guard did not size; send "
                                      f"{key.lower()!r}")
    if params.get("additional_drop_params"):  # LiteLLM drops them after the hook: the pinned cap too
        raise InvalidRequest("additional_drop_params", "additional_drop_params may remove the output "
                                                       "cap the guard pins; it is refused for guarded "
                                                       "deployments")
    for name in _UNBOUNDED_CONTEXT:
        if view.get(name) is not None:
            raise InvalidRequest(name, f"{name}: server-side context the guard cannot size; "
                                       "send the conversation in the request instead")
    if view.get("background") not in (None, False):  # the answer (and its usage) comes later
        raise InvalidRequest("background", "background: a run Ark finishes after the request "
                                           "returns is billed when the guard no longer watches it "
                                           "(past a package expiry or midnight); it is refused for "
                                           "guarded deployments")
    for name in REWRITTEN_AFTER_HOOK:
        if view.get(name) or params.get(name):
            raise InvalidRequest(name, f"{name}: LiteLLM adds to the messages after the quota guard "
                                       "sized them; it is refused for guarded deployments")
    for name in OUTPUT_PARAMS:
        _cap(view, name)
    if route.kind in ("chat", "messages"):
        choices(view)
        estimate.validate_messages(view)
    best_of = view.get("best_of")
    if best_of is not None and best_of != 1:
        raise InvalidRequest("best_of", "best_of generates output the guard would not see: only 1 "
                                        "is served for guarded deployments (use n)")
    caching = view.get("caching", params.get("caching"))  # also LiteLLM's own (bool) flag's name
    if isinstance(caching, Mapping) and caching.get("type") != "disabled":
        raise InvalidRequest("caching", "caching: Ark's context cache storage is not covered by the "
                                        "free quota; it is refused for guarded deployments")
    _check_tools(view.get("tools"))


def _check_tools(tools: object) -> None:
    """Only tools the client runs itself: a built-in tool (web search, …) makes Ark re-read a
    growing context server-side, which the guard cannot bound."""
    if not isinstance(tools, list):
        return
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, Mapping) else None
        if kind not in (None, "function", "custom"):
            raise InvalidRequest(f"tools[{i}]", f"tools[{i}] of type {kind!r:.40} runs on Ark's side, "
                                                "where the guard cannot bound what it bills; only "
                                                "function tools are served for guarded deployments")


def size(params: Mapping[str, Any], route: Route, limits: Limits,
         chain_tokens: int | None = None) -> Sizing:
    """Size one upstream call from its LiteLLM kwargs (or an SDK-style request body).

    ``chain_tokens`` is what the guard recorded for the ``previous_response_id`` the request
    names (None: not one the guard has seen).
    """
    view = upstream_view(params)
    _check(view, params, route)
    if params.get("prompt_id"):  # the proxy expands (and drops) the prompts of its own registry
        raise InvalidRequest("prompt_id", "prompt_id names no prompt of the proxy's registry, so "
                                          "LiteLLM would expand it after the quota guard sized the "
                                          "call; it is refused for guarded deployments")
    inp = count_input(view, route, limits)
    chain = 0
    if route.kind == "responses" and view.get("previous_response_id") is not None:
        chain = _chain(view["previous_response_id"], chain_tokens, limits)
    inp += chain
    if route.cap_field is None:
        return Sizing(inp, 0, 1, 0, 0, chain)
    n = choices(view) if route.kind in ("chat", "messages") else 1
    think = thinking_possible(view)
    if route.kind == "chat":
        answer, total = _cap(view, "max_tokens"), _cap(view, "max_completion_tokens")
        ceiling: int | None = ARK_MAX_COMPLETION_TOKENS
    elif route.kind == "responses":
        answer, total, ceiling = None, _cap(view, "max_output_tokens"), None
    else:  # /v1/messages: max_tokens is the answer; LiteLLM sends it on as a chat call
        answer, total, ceiling = _cap(view, "max_tokens"), None, ARK_MAX_COMPLETION_TOKENS
    return sizing(inp, answer_cap=answer, total_cap=total, thinking=think, n=n, limits=limits,
                  ceiling=ceiling, chain_tokens=chain)


def sizing(input_tokens: int, *, answer_cap: int | None, total_cap: int | None, thinking: bool,
           n: int, limits: Limits, ceiling: int | None = ARK_MAX_COMPLETION_TOKENS,
           chain_tokens: int = 0) -> Sizing:
    """The sizing of a call whose input is counted: the rule on numbers (the simulator's entry)."""
    per, allowance = plan_output(answer_cap=answer_cap, total_cap=total_cap, thinking=thinking,
                                 limits=limits, n=n, ceiling=ceiling)
    # Ark does not document `n`: the dearer reading is n inferences, each reading the prompt.
    return Sizing(input_tokens * n, per, n, min(per, limits.min_output), allowance, chain_tokens)


def _chain(response_id: object, known: int | None, limits: Limits) -> int:
    if not isinstance(response_id, str) or not response_id:
        raise InvalidRequest("previous_response_id", "previous_response_id must be a string")
    if known is not None:
        return known
    if limits.context_window:
        return limits.context_window  # a stored conversation cannot exceed the model's context
    raise InvalidRequest(
        "previous_response_id", f"previous_response_id {response_id[:64]!r} was not answered "
        "through this guard (or its record expired), and the deployment declares no context window "
        "(model_info.max_input_tokens), so the stored conversation Ark would re-read cannot be "
        "sized; resend the conversation as input, or set model_info.max_input_tokens to the "
        "model's context window on Ark")


def count_input(view: Mapping[str, Any], route: Route, limits: Limits) -> int:
    """Input tokens of the upstream view: tokenized text, media, and the rest as bytes."""
    total = 0
    if route.kind in ("chat", "messages"):
        total += _messages(list(view.get("messages") or ()), view.get("tools"), limits)
    for name in route.text_fields:
        if name == "messages":
            continue
        value = view.get(name)
        if value is not None:
            total += _text_field(name, value, limits)
            pieces = len(value) if isinstance(value, list) else 1
            # each piece becomes a templated message upstream; an embedding input is encoded on
            # its own (a boundary token, a drift rounded up per input: 20,000 one-token inputs
            # billed 40,000 on an exact count of 20,000 x 1.1)
            total += (EMBED_INPUT_TOKENS if route.kind == "embedding" else TEMPLATE_TOKENS) * pieces
    for name, value in view.items():  # anything else Ark receives: its bytes bound its tokens
        if name in route.text_fields or name in _UNBILLED or (name == "tools" and route.kind != "responses"):
            continue
        if value is None or isinstance(value, bool | int | float):
            continue
        total += _byte_bound(value)
    return max(total, 1)


def _count_chat(limits: Limits, messages: list[dict[str, Any]], tools: list[Any] | None) -> int:
    """Text-only chat messages (and tools) by the deployment's method, template included."""
    method = limits.method
    if limits.exact is not None:  # Ark's count of each text + a template allowance per message
        exact = limits.exact
        total = counting.ARK_API_MESSAGE_TOKENS * (len(messages) + (1 if tools else 0))
        for msg in messages:
            total += exact(msg.get("content") or "")
            rest = {k: v for k, v in msg.items() if k not in ("role", "content")}
            if rest:
                total += exact(json.dumps(rest, ensure_ascii=False, default=str))
        if tools:
            total += exact(json.dumps(tools, ensure_ascii=False, default=str))
        return total
    if method == "deepseek":  # exact, plus the bytes of whatever the template does not render
        return counting.count_chat(method, list[Mapping[str, Any]](messages), tools, cached=True) + \
            sum(_byte_bound(rest) for rest in map(_unrendered, messages) if rest) + \
            EXACT_DRIFT_TOKENS * len(messages)
    return counting.cl100k_chat(messages, tools)  # "ark-api" without Ark's counts too


def _unrendered(msg: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of a message the DeepSeek template leaves out (Ark may still read them)."""
    rendered = {"role", "content"}
    if msg.get("role") == "assistant":
        if isinstance(msg.get("reasoning_content"), str):
            rendered.add("reasoning_content")
        calls = msg.get("tool_calls")
        if isinstance(calls, list) and all(
                isinstance(c, Mapping) and isinstance(c.get("function"), Mapping)
                and set(c) <= {"id", "type", "function", "index"}
                and set(c["function"]) <= {"name", "arguments"} for c in calls):
            rendered.add("tool_calls")
    return {k: v for k, v in msg.items() if k not in rendered}


def _count_text(limits: Limits, text: str) -> int:
    if limits.exact is not None:
        return limits.exact(text)
    if limits.method == "deepseek":
        return counting.deepseek_tokens_cached(text)
    return counting.cl100k_tokens(text)


def _byte_bound(obj: object) -> int:
    """A bound on the tokens of `obj` however it is serialized: its ASCII-escaped JSON (a token is at
    least a byte; an escape is longer than the UTF-8 bytes it stands for, and Ark or LiteLLM may
    send either form: `"é" * 6000` in a function_call_output billed 24,995 on 13,311 reserved)."""
    return len(json.dumps(obj, default=str))


def _messages(messages: list[Any], tools: object, limits: Limits) -> int:
    plain: list[dict[str, Any]] = []
    media_tokens = 0
    for i, msg in enumerate(messages):
        text, extra = _parts(msg.get("content"), f"messages[{i}].content", limits)
        media_tokens += extra
        clean = {k: v for k, v in msg.items() if k != "content"}
        clean["content"] = text
        plain.append(clean)
    if tools is not None and not isinstance(tools, list):
        raise InvalidRequest("tools", "tools must be a list")
    try:
        counted = _count_chat(limits, plain, tools or None)
    except Exception:  # noqa: BLE001  odd message fields: their bytes bound their tokens
        counted = _byte_bound(plain) + _byte_bound(tools or [])
    return counted + media_tokens


_TEXT_PARTS = {"text", "input_text", "output_text"}
_IMAGE_PARTS = {"image_url", "input_image", "image"}
# Parts of text and structure (tool calls, tool results, thinking): bounded by their bytes.
_STRUCT_PARTS = {"tool_use", "tool_result", "thinking", "redacted_thinking", "refusal",
                 "function_call", "function_call_output"}
_MEDIA_PARTS = {"video_url", "input_video", "video", "audio_url", "input_audio", "audio", "file",
                "input_file", "file_url", "document"}


def _parts(content: object, where: str, limits: Limits) -> tuple[str, int]:
    """(the text for the tokenizer, tokens counted here) of one message's content: a string or
    one text part is the text; several text parts are counted here (PART_JOINT_TOKENS)."""
    if content is None:
        return "", 0
    if isinstance(content, str):
        return content, 0
    if not isinstance(content, list):
        raise InvalidRequest(where.split("[")[0], f"{where} must be a string or a list of parts")
    texts: list[str] = []
    tokens = 0
    for j, part in enumerate(content):
        field = f"{where}[{j}]"
        if isinstance(part, str):
            texts.append(part)
            continue
        kind = part.get("type") if isinstance(part, Mapping) else None
        if not isinstance(kind, str):
            raise InvalidRequest(field, f"{field} needs a string 'type'")
        if kind in _TEXT_PARTS and isinstance(part.get("text"), str):  # type: ignore[union-attr]
            texts.append(part["text"])  # type: ignore[index]
            # Its other keys reach Ark too (a 30,000-word `refusal` beside "hi": 46 reserved,
            # 92,579 billed; red-team, stop 44)
            residue = _residue(part, ("type", "text"))  # type: ignore[arg-type]
            if residue:
                texts.append(residue)
        elif kind in _IMAGE_PARTS:
            try:
                tokens += media.image_tokens(part)  # type: ignore[arg-type]
            except media.MediaError as exc:
                raise InvalidRequest(field, f"{field}: {exc}") from None
            residue = _residue(part, ("type", "image_url", "url", "detail", "image_pixel_limit"))
            if residue:
                texts.append(residue)
        elif kind in _MEDIA_PARTS:
            if not limits.media_part_tokens:
                raise InvalidRequest(field, f"{field} is a {kind} part: Ark bills it by content the "
                                            "guard cannot measure; the deployment must declare "
                                            "model_info.vqg_media_part_tokens to allow it")
            tokens += limits.media_part_tokens + _byte_bound(part) // 4
        elif kind in _STRUCT_PARTS:
            tokens += _byte_bound(part) + _nested_media(
                {k: v for k, v in part.items() if k != "type"}, field, limits)  # type: ignore[union-attr]
        else:
            raise InvalidRequest(field, f"{field}: content part type {kind!r:.40} cannot be sized "
                                        "by the guard")
    if len(texts) <= 1:
        return (texts[0] if texts else ""), tokens
    return "", tokens + sum(_count_text(limits, t) for t in texts) + PART_JOINT_TOKENS * (len(texts) - 1)


def _residue(part: Mapping[str, Any], known: tuple[str, ...]) -> str:
    rest = {k: v for k, v in part.items() if k not in known}
    return json.dumps(rest, ensure_ascii=False, default=str) if rest else ""


def _text_field(name: str, value: object, limits: Limits) -> int:
    """A Responses / embeddings / Anthropic text field: a string, strings, or items with content."""
    if isinstance(value, str):
        return _count_text(limits, value)
    if isinstance(value, list):
        total = 0
        for i, item in enumerate(value):
            if isinstance(item, str):
                total += _count_text(limits, item)
            elif isinstance(item, int) and not isinstance(item, bool):
                total += 1  # a token id
            elif isinstance(item, list) and all(isinstance(t, int) for t in item):
                total += len(item)  # a list of token ids
            elif isinstance(item, Mapping):
                total += _item(f"{name}[{i}]", item, limits)
            else:
                raise InvalidRequest(name, f"{name}[{i}] cannot be sized by the guard")
        return total
    raise InvalidRequest(name, f"{name} must be a string or a list")


def _item(where: str, item: Mapping[str, Any], limits: Limits) -> int:
    """A Responses input item: a message is its content (string or parts) counted, and its other
    fields' bytes (a role or type that is not the usual short word among them); any other item
    (tool call, output, reasoning, a bare content part, an unknown type) is bounded by its whole
    JSON, which Ark may read as text (a bare image part's data URL: 36 reserved, 57,000 billed),
    plus its media by Ark's formula."""
    content = item.get("content")
    kind = item.get("type")
    if kind in _UNBOUNDED_ITEMS:
        raise InvalidRequest(where, f"{where}: an {kind} makes Ark expand stored content the guard "
                                    "cannot size; send the content itself")
    if kind in (None, "message"):
        text, tokens = _parts(content, f"{where}.content", limits)
        usual_role = isinstance(item.get("role"), str) and item["role"] in _ITEM_ROLES
        rest = {k: v for k, v in item.items()
                if k not in ("content", "type") and not (k == "role" and usual_role)}
        return _count_text(limits, text) + tokens + (_byte_bound(rest) if rest else 0)
    bare_text = _parts([item], where, limits)[1] if kind in _TEXT_PARTS else 0  # validates it
    return _byte_bound(item) + bare_text + _nested_media(item, where, limits)


def _nested_media(obj: object, where: str, limits: Limits) -> int:
    """Ark's formula for every image or media part at any depth of a byte-bounded object (a tool
    output's parts, a part inside a part's output): Ark may read any of them as an image, and an
    image URL's few bytes stand for up to thousands of tokens."""
    if isinstance(obj, list):
        return sum(_nested_media(v, f"{where}[{i}]", limits) for i, v in enumerate(obj))
    if not isinstance(obj, Mapping):
        return 0
    if obj.get("type") in _IMAGE_PARTS | _MEDIA_PARTS:
        return _parts([obj], where, limits)[1]
    return sum(_nested_media(v, f"{where}.{k}", limits) for k, v in obj.items())


def pin_output(kwargs: dict[str, Any], route: Route, per_choice: int) -> None:
    """Make the upstream cap what the reservation covers: ``per_choice`` answer + reasoning.

    Chat: ``max_completion_tokens`` in ``extra_body`` (LiteLLM's volcengine provider renames a
    top-level one to ``max_tokens``, which would not cap reasoning) and no ``max_tokens`` anywhere
    (Ark refuses the two together). Other routes: their own field, set at the top level, and
    removed from ``extra_body`` so nothing overrides it.
    """
    if route.cap_field is None:
        return
    extra = kwargs.get("extra_body")
    extra = dict(extra) if isinstance(extra, Mapping) else {}
    for name in OUTPUT_PARAMS:
        extra.pop(name, None)
    if route.kind == "chat":
        for name in OUTPUT_PARAMS:
            kwargs.pop(name, None)
        extra["max_completion_tokens"] = per_choice
    else:
        kwargs[route.cap_field] = per_choice
    if extra or "extra_body" in kwargs:
        kwargs["extra_body"] = extra
