"""The fake Ark Responses API: ``POST /api/v3/responses`` (and ``GET``/``DELETE …/{id}``).

LiteLLM routes ``/v1/responses`` for ``volcengine/`` deployments here natively. Billing, on
top of the chat rules in ``ark_api.py`` (directive, thinking switches, media formula):

- **Input** = the stored chain + the new turn's text + media. Text is cl100k over
  ``instructions`` (a system message), every input item's text (``input_text``,
  ``output_text``, function calls and outputs, reasoning summaries; other item types by
  their JSON) and ``tools``; ``prompt=`` replaces only this new text count.
- ``previous_response_id`` re-reads the stored conversation: the previous response's whole
  input (its own chain included) plus its output (reasoning included) — recursively, the
  whole chain. An id that is unknown, deleted, not stored (``store: false``) or another
  account's is a 400 (as OpenAI answers). Stored responses never expire in the fake (the
  expensive reading of Ark's storage period).
- **Thinking** on unless ``thinking: {"type": "disabled"}`` or ``reasoning: {"effort":
  "minimal"}`` switch it off (with nothing switching it on). ``max_output_tokens`` caps
  reasoning + answer; without it nothing caps the output.
- Usage: ``input_tokens`` (+ ``input_tokens_details.cached_tokens``), ``output_tokens``
  (+ ``output_tokens_details.reasoning_tokens``), ``total_tokens``. A capped answer has
  ``status: incomplete`` (``incomplete_details.reason: max_output_tokens``) and, streaming,
  ends with ``response.incomplete`` instead of ``response.completed``.
- Streaming (``stream: true``) sends OpenAI's event sequence (``response.created``,
  ``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``,
  ``response.output_text.delta`` …, ``….done``, then ``response.completed`` carrying the
  usage) as ``event:``/``data:`` SSE frames; ``cut=N`` breaks it after N deltas.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from typing import Any

from .ark_api import (
    Directive,
    StreamReply,
    authenticate,
    consumed_tokens,
    count_prompt_tokens,
    extra_prompt_tokens,
    int_field,
    load_body,
    openai_error,
    parse_directive_text,
    sleep_for,
    split_content,
    split_output,
    text_of,
    thinking_on,
)
from .billing_api import Reply, json_reply
from .media import IMAGE_PARTS, MEDIA_PARTS
from .state import ChatRecord, FakeState, StoredResponse

RESPONSES_PATH = "/api/v3/responses"
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}


def _item_message(item: Any, per_part: int) -> tuple[dict[str, Any], int]:
    """One input item as a chat message for counting, and its media tokens."""
    if isinstance(item, str):
        return {"role": "user", "content": item}, 0
    if not isinstance(item, dict):
        raise ValueError("each input item must be an object or a string")
    kind = item.get("type", "message")
    if kind == "message" or ("role" in item and "type" not in item):
        role = _ROLES.get(str(item.get("role")))
        if role is None:
            raise ValueError(f"unknown input role {item.get('role')!r}")
        content, media = split_content(item.get("content"), per_part)
        return {"role": role, "content": content}, media
    if kind == "function_call":
        return {"role": "assistant",
                "content": f"{item.get('name', '')} {item.get('arguments', '')}"}, 0
    # The dearer reading where Ark's is unknown: an item's JSON is text, and the images and
    # media in it (a tool output's parts, a bare part) are billed at Ark's formula on top.
    if kind == "function_call_output":
        output = item.get("output")
        return {"role": "user", "content": output if isinstance(output, str) else json.dumps(output)}, \
            _media_of(output, per_part)
    return {"role": "user", "content": json.dumps(item, ensure_ascii=False)}, _media_of([item], per_part)


def _media_of(obj: Any, per_part: int) -> int:
    """The media tokens of the image and media parts at any depth (the dearer reading: Ark may
    read a part nested in a tool output's parts as an image too)."""
    if isinstance(obj, list):
        return sum(_media_of(v, per_part) for v in obj)
    if not isinstance(obj, dict):
        return 0
    if obj.get("type") in IMAGE_PARTS | MEDIA_PARTS:
        return split_content([obj], per_part)[1]
    return sum(_media_of(v, per_part) for v in obj.values())


def _chat_tools(tools: Any) -> tuple[list[Any], list[Any]]:
    """(function tools in chat shape, other tools as text messages) for counting."""
    if tools is None:
        return [], []
    if not isinstance(tools, list):
        raise ValueError("tools must be a list")
    functions, others = [], []
    for tool in tools:
        if isinstance(tool, dict) and tool.get("type") == "function" and "name" in tool:
            functions.append({"type": "function", "function": {
                k: tool[k] for k in ("name", "description", "parameters") if k in tool}})
        else:
            others.append({"role": "system", "content": json.dumps(tool, ensure_ascii=False)})
    return functions, others


def _directive(raw: Any) -> Directive:
    if isinstance(raw, str):
        return parse_directive_text(raw)
    users = [i for i in raw if isinstance(i, str) or (isinstance(i, dict) and i.get("role") == "user")]
    if not users:
        return Directive()
    last = users[-1]
    return parse_directive_text(last if isinstance(last, str) else text_of(last.get("content")))


def handle_responses(state: FakeState, method: str, path: str,
                     header: Callable[[str], str | None], body: bytes) -> Reply | StreamReply:
    """Create (POST), read (GET) or delete (DELETE) a response."""
    account = authenticate(state, header)
    if account is None:
        return openai_error(401, "The API key in the request is missing or invalid.")
    if path.rstrip("/") != RESPONSES_PATH:
        response_id = path.removeprefix(RESPONSES_PATH + "/")
        stored = state.stored_response(response_id)
        if stored is None or stored.account != account.name or "/" in response_id:
            return openai_error(404, f"response {response_id!r} not found", code="NotFound")
        if method == "GET":
            return json_reply(200, stored.body)
        if method == "DELETE":
            state.delete_response(response_id)
            return json_reply(200, {"id": response_id, "object": "response", "deleted": True})
    if method != "POST":
        return openai_error(404, f"no route {method} {path}", code="NotFound")
    return _create(state, account.name, body)


def _create(state: FakeState, account: str, body: bytes) -> Reply | StreamReply:
    defaults = state.get_chat_defaults()
    try:
        request = load_body(body)
        raw = request.get("input")
        if isinstance(raw, str):
            items: list[Any] = [raw]
        elif isinstance(raw, list) and raw:
            items = raw
        else:
            raise ValueError("input must be a string or a non-empty list of items")
        directive = _directive(raw)
        per_part = directive.media if directive.media is not None else defaults.media_tokens
        messages, media = [], 0
        instructions = request.get("instructions")
        if instructions is not None:
            if not isinstance(instructions, str):
                raise ValueError("instructions must be a string")
            messages.append({"role": "system", "content": instructions})
        for item in items:
            message, tokens = _item_message(item, per_part)
            messages.append(message)
            media += tokens
        functions, other_tools = _chat_tools(request.get("tools"))
        text = directive.prompt if directive.prompt is not None else defaults.prompt_tokens
        if text is None:
            text = count_prompt_tokens(messages + other_tools, functions, request.get("model"), state) \
                + extra_prompt_tokens(request, messages, request.get("model"), state)
        previous_id = request.get("previous_response_id")
        chain = 0
        if previous_id is not None:
            previous = state.stored_response(previous_id) if isinstance(previous_id, str) else None
            if previous is None or previous.account != account:
                return openai_error(400, f"Previous response with id {previous_id!r} not found.",
                                    param="previous_response_id")
            chain = previous.context_tokens
        reasoning_opt = request.get("reasoning")
        if reasoning_opt is not None and not isinstance(reasoning_opt, dict):
            raise ValueError("reasoning must be an object")
        thinking = thinking_on(request.get("thinking"), (reasoning_opt or {}).get("effort"))
        cap = int_field(request, "max_output_tokens", 0, None)
        store = request.get("store", True)
        if not isinstance(store, bool):
            raise ValueError("store must be a boolean")
    except ValueError as exc:
        return openai_error(400, str(exc))

    model: str = request["model"]
    pool = f"{account}/{model}"
    stream = request.get("stream") is True
    wanted = directive.completion if directive.completion is not None \
        else defaults.completion_tokens
    reasoning = directive.reasoning if directive.reasoning is not None \
        else defaults.reasoning_tokens
    out = split_output(wanted, reasoning if thinking else 0, answer_cap=None, total_cap=cap)
    prompt = chain + text + media
    cached = min(directive.cached if directive.cached is not None else defaults.cached_tokens,
                 prompt)
    output_tokens = out.answer + out.reasoning
    consumed = consumed_tokens(state, prompt, output_tokens, cached)
    seq = state.next_chat_seq()
    rid = f"resp_fake{seq:08d}"

    def record(status: int, billed: int = 0, used: int = consumed) -> None:
        state.record_chat(ChatRecord(
            seq=seq, at_ms=state.now_ms(), account=account, model=model, pool=pool,
            stream=stream, include_usage=stream, max_tokens=None, max_completion_tokens=cap,
            prompt_tokens=prompt, completion_tokens=output_tokens, cached_tokens=cached,
            consumed=used, billed=billed, status=status,
            usage_reported=status == 200 and not directive.usage_missing and not directive.cut,
            endpoint="responses", thinking=thinking, reasoning_tokens=out.reasoning,
            media_tokens=media, chain_tokens=chain, response_id=rid if status == 200 else None,
            previous_response_id=previous_id))

    sleep_for(directive, defaults.delay_s)
    if directive.status is not None and directive.status >= 400:
        record(directive.status, used=0)
        return openai_error(directive.status, f"fake upstream error {directive.status}")

    text_out = f"Fake reply from {model}: {prompt} input + {output_tokens} output tokens."
    message_id = f"msg_fake{seq:08d}"
    output: list[dict[str, Any]] = []
    if out.reasoning:
        output.append({"type": "reasoning", "id": f"rs_fake{seq:08d}", "status": "completed",
                       "summary": [{"type": "summary_text",
                                    "text": f"Fake reasoning: {out.reasoning} tokens."}]})
    message = {"type": "message", "id": message_id, "status": "completed", "role": "assistant",
               "content": [{"type": "output_text", "text": text_out, "annotations": []}]}
    output.append(message)
    usage = {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
             "output_tokens": output_tokens,
             "output_tokens_details": {"reasoning_tokens": out.reasoning},
             "total_tokens": prompt + output_tokens}
    done = {
        "id": rid, "object": "response", "created_at": state.now_ms() // 1000, "model": model,
        "status": "incomplete" if out.truncated else "completed",
        "incomplete_details": {"reason": "max_output_tokens"} if out.truncated else None,
        "error": None, "instructions": request.get("instructions"),
        "max_output_tokens": cap, "previous_response_id": previous_id, "store": store,
        "output": output, "parallel_tool_calls": True, "tool_choice": "auto",
        "tools": request.get("tools") or [], "text": {"format": {"type": "text"}},
        "reasoning": {"effort": (reasoning_opt or {}).get("effort"), "summary": None},
        "thinking": {"type": "enabled" if thinking else "disabled"},
    }
    if not directive.usage_missing:
        done["usage"] = usage

    def charge() -> None:
        billed = state.consume(pool, consumed).billed
        if store:
            state.store_response(StoredResponse(rid, account, model, prompt, output_tokens, done))
        record(200, billed)

    if not stream:
        charge()
        return json_reply(200, done)

    def frames() -> Iterator[bytes]:
        number = 0

        def event(kind: str, **fields: Any) -> bytes:
            nonlocal number
            obj = {"type": kind, "sequence_number": number, **fields}
            number += 1
            return (f"event: {kind}\ndata: ".encode()
                    + json.dumps(obj, ensure_ascii=False).encode() + b"\n\n")

        start = done | {"status": "in_progress", "output": [], "usage": None,
                        "incomplete_details": None}
        yield event("response.created", response=start)
        yield event("response.in_progress", response=start)
        index = len(output) - 1
        for i, item in enumerate(output[:-1]):  # the reasoning item
            yield event("response.output_item.added", output_index=i, item=item)
            yield event("response.output_item.done", output_index=i, item=item)
        pending = message | {"status": "in_progress", "content": []}
        yield event("response.output_item.added", output_index=index, item=pending)
        part = {"type": "output_text", "text": "", "annotations": []}
        ids = {"item_id": message_id, "output_index": index, "content_index": 0}
        yield event("response.content_part.added", **ids, part=part)
        pieces = re.findall(r"\S+\s*", text_out)
        if directive.cut is not None:
            pieces = pieces[: directive.cut]
        for piece in pieces:
            if directive.pace > 0:
                time.sleep(directive.pace)
            yield event("response.output_text.delta", **ids, delta=piece)
        charge()
        if directive.cut is not None:
            return
        yield event("response.output_text.done", **ids, text=text_out)
        yield event("response.content_part.done", **ids, part=message["content"][0])
        yield event("response.output_item.done", output_index=index, item=message)
        kind = "response.incomplete" if out.truncated else "response.completed"
        yield event(kind, response=done)

    return StreamReply(frames(), cut=directive.cut is not None)
