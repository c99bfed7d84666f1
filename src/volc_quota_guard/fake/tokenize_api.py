"""The fake Ark tokenization API: ``POST /api/v3/tokenization``.

Body ``{"model": m, "text": str | [str]}``, Bearer API key of a known account; answers
``{"object": "list", "data": [{"object": "tokenization", "index": i, "total_tokens": n,
"token_ids": [...], "offset_mapping": [...]}, ...]}`` as Ark does, counting with the fake's hidden Doubao
tokenizer (``ark_api.doubao_tokens``: the DeepSeek-V4 tokenizer's count, deterministic and real;
Ark's own is not public), the one the fake bills Doubao prompts with (text only: billing adds a
template and drift this endpoint does not show).

Faults, per fake, for the client's fallback tests::

    control = tokenize_control(fake)
    control.mode = "error"     # HTTP 500
    control.mode = "hang"      # answer after `control.hang_s` seconds (past any client timeout)
    control.mode = "garbage"   # 200 with a body that is not JSON
    control.mode = "wrong"     # 200, JSON, but no total_tokens
    control.mode = "denied"    # HTTP 401, as for a key the tokenization API does not accept
    control.mode = "zero"      # 200, well formed, and 0 tokens for every text (an implausible count)
"""

from __future__ import annotations

import json
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from .ark_api import doubao_tokens, openai_error
from .billing_api import Reply, json_reply
from .state import FakeState

TOKENIZE_PATHS = ("/api/v3/tokenization",)
Mode = Literal["ok", "error", "hang", "garbage", "wrong", "denied", "zero"]


@dataclass
class TokenizeControl:
    mode: Mode = "ok"
    hang_s: float = 2.0
    calls: int = 0


_controls: weakref.WeakKeyDictionary[FakeState, TokenizeControl] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def tokenize_control(state: FakeState) -> TokenizeControl:
    """The fault switch and call counter of this fake's tokenization endpoint."""
    with _lock:
        return _controls.setdefault(state, TokenizeControl())


def handle_tokenize(state: FakeState, header: Callable[[str], str | None], body: bytes) -> Reply:
    """Answer one tokenization request."""
    control = tokenize_control(state)
    control.calls += 1
    bearer = (header("authorization") or "").removeprefix("Bearer ").strip()
    if not bearer or state.account_by_api_key(bearer) is None or control.mode == "denied":
        return openai_error(401, "The API key in the request is missing or invalid.")
    if control.mode == "error":
        return openai_error(500, "The service encountered an unexpected internal error.")
    if control.mode == "hang":
        time.sleep(control.hang_s)
    if control.mode == "garbage":
        return Reply(200, b"<html>upstream hiccup")
    try:
        request = json.loads(body or b"{}")
        texts = request.get("text") if isinstance(request, dict) else None
        if not isinstance(request.get("model"), str) or not request["model"]:
            raise ValueError("model is required")
        texts = [texts] if isinstance(texts, str) else texts
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
            raise ValueError("text must be a string or a non-empty list of strings")
    except (ValueError, AttributeError) as exc:
        return openai_error(400, str(exc))
    if control.mode == "wrong":
        return json_reply(200, {"object": "list", "data": [{"index": 0}]})
    data = []
    for i, text in enumerate(texts):
        n = 0 if control.mode == "zero" else doubao_tokens(text)  # imports counting on first use
        data.append({"object": "tokenization", "index": i, "total_tokens": n,
                     "token_ids": [], "offset_mapping": []})
    return json_reply(200, {"object": "list", "id": f"tok-{control.calls}",
                            "model": request["model"], "data": data})
