"""Everything the fake Volcengine holds, behind one lock.

HTTP handler threads and the test thread share this object; every method takes the lock,
reads the clock inside it (so the ledger sees time in order) and returns plain values.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from .ledger import Consumption, Ledger, LedgerPackage, PoolTotals

# What an injected billing fault makes the next ListResourcePackages call return.
BILLING_FAULTS = {
    "throttle": "HTTP 429 AccountFlowLimitExceeded",
    "throttle_200": "HTTP 200 with ResponseMetadata.Error FlowLimitExceeded",
    "auth": "HTTP 200 with ResponseMetadata.Error AccessDenied",
    "internal": "HTTP 500 InternalError",
    "unavailable": "HTTP 503 ServiceUnavailableTemp",
    "gateway": "HTTP 502 with an HTML body",
    "malformed": "HTTP 200 with a body that is not JSON",
    "no_metadata": "HTTP 200 JSON without ResponseMetadata",
}
PAGINATION_QUIRKS = ("none", "overlap", "stuck")
ANONYMOUS = "<anonymous>"
UNKNOWN = "<unknown>"


class FakeClock(Protocol):
    def now_ms(self) -> int: ...

    def advance(self, ms: int) -> int: ...


@dataclass(frozen=True)
class FakeAccount:
    """A Volcengine account of the fake: billing key pair and Ark API keys."""

    name: str
    access_key: str
    secret_key: str
    api_keys: tuple[str, ...] = ()

    def __repr__(self) -> str:  # tests print these; keep the secret out
        return f"FakeAccount(name={self.name!r}, access_key={self.access_key!r})"


AccountSpec = FakeAccount | tuple[str, str] | tuple[str, str, str | Sequence[str]]


def make_account(name: str, spec: AccountSpec) -> FakeAccount:
    """Normalise ``(AK, SK)`` / ``(AK, SK, api_key(s))``; the default Ark key is ``ark-<name>``."""
    if isinstance(spec, FakeAccount):
        return spec
    if len(spec) == 2:
        return FakeAccount(name, spec[0], spec[1], (f"ark-{name}",))
    keys = spec[2]
    return FakeAccount(name, spec[0], spec[1], (keys,) if isinstance(keys, str) else tuple(keys))


@dataclass
class ChatDefaults:
    """Usage the Ark endpoint reports when a request's directive does not say."""

    completion_tokens: int = 64  # the answer, per choice
    prompt_tokens: int | None = None  # None: count the text with litellm.token_counter
    cached_tokens: int = 0
    reasoning_tokens: int = 0  # per choice, while thinking is on (Ark's default)
    media_tokens: int = 200_000  # per video / audio / file part (its content is unseen)
    count_cached: bool = True  # do cached prompt tokens consume free quota?
    delay_s: float = 0.0


@dataclass(frozen=True)
class ChatRecord:
    """One Ark data-plane request (chat, responses or embeddings) as the upstream saw it.

    ``completion_tokens`` is all output (n × (answer + reasoning)); ``prompt_tokens`` all
    billed input (text + media + a Responses chain). For Responses, ``max_completion_tokens``
    holds ``max_output_tokens`` (the same meaning: it caps answer + reasoning)."""

    seq: int
    at_ms: int
    account: str
    model: str
    pool: str
    stream: bool
    include_usage: bool
    max_tokens: int | None
    max_completion_tokens: int | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    consumed: int
    billed: int
    status: int
    usage_reported: bool
    endpoint: str = "chat"  # chat | responses | embeddings
    n: int = 1
    thinking: bool = False
    reasoning_tokens: int = 0
    media_tokens: int = 0
    chain_tokens: int = 0  # input re-read from a stored previous_response_id chain
    response_id: str | None = None
    previous_response_id: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


UPSTREAM_LOG_SIZE = 1000


@dataclass(frozen=True)
class UpstreamRequest:
    """An Ark data-plane request exactly as it arrived (what LiteLLM finally sent)."""

    method: str
    path: str
    body: Any  # the parsed JSON, or the raw text when it is not JSON


@dataclass(frozen=True)
class StoredResponse:
    """A Responses API answer kept for ``previous_response_id`` (``store`` is true)."""

    id: str
    account: str
    model: str
    input_tokens: int  # its own chain included
    output_tokens: int
    body: dict[str, Any]

    @property
    def context_tokens(self) -> int:
        """What a follow-up re-reads: this turn's whole input and its output."""
        return self.input_tokens + self.output_tokens


@dataclass
class _Faults:
    queue: deque[str] = field(default_factory=deque)
    down_until_ms: int = 0
    down_kind: str = "unavailable"


class FakeState:
    """The fake's accounts, ledger, clock, billing faults, counters and chat log."""

    def __init__(
        self,
        accounts: Mapping[str, AccountSpec],
        ledger: Ledger,
        clock: FakeClock,
        *,
        noise: bool = True,
        chat_defaults: ChatDefaults | None = None,
    ) -> None:
        self.lock = threading.RLock()
        self.accounts = {name: make_account(name, spec) for name, spec in accounts.items()}
        self.ledger = ledger
        self.clock = clock
        self.noise = noise
        self.chat_defaults = chat_defaults or ChatDefaults()
        self.pagination_quirk = "none"
        self._raw: dict[str, list[dict[str, Any]]] = {}
        self._faults: dict[str | None, _Faults] = {}
        self._calls: dict[str, int] = {}
        self._chats: list[ChatRecord] = []
        self._chat_seq = 0
        self._responses: dict[str, StoredResponse] = {}
        self._upstream: deque[UpstreamRequest] = deque(maxlen=UPSTREAM_LOG_SIZE)

    # ------------------------------------------------------------- accounts

    def account_by_access_key(self, access_key: str) -> FakeAccount | None:
        return next((a for a in self.accounts.values() if a.access_key == access_key), None)

    def account_by_api_key(self, api_key: str) -> FakeAccount | None:
        return next((a for a in self.accounts.values() if api_key in a.api_keys), None)

    # ------------------------------------------------------------- time + ledger

    def now_ms(self) -> int:
        with self.lock:
            return self.clock.now_ms()

    def advance(self, ms: int) -> int:
        with self.lock:
            return self.clock.advance(ms)

    def add_package(self, pool: str, amount: int, *, acquired_ms: int | None = None,
                    **kwargs: Any) -> str:
        """Add a package to a pool (acquired now unless told); returns its InstanceNo."""
        with self.lock:
            now = self.clock.now_ms()
            return self.ledger.add_package(
                pool, amount, now if acquired_ms is None else acquired_ms, **kwargs)

    def replace_packages(self, pool: str, packages: Sequence[Mapping[str, Any]]) -> list[str]:
        """Drop a pool's packages and add these (each: amount, acquired_ms, … as add_package)."""
        with self.lock:
            self.ledger.remove_packages(pool)
            return [self.add_package(**{"pool": pool, **dict(p)}) for p in packages]

    def set_collection(self, pool: str, day: int, tokens: int) -> None:
        with self.lock:
            self.ledger.set_collection(pool, day, tokens)

    def consume(self, pool: str, tokens: int) -> Consumption:
        """Consume now, as traffic that bypasses the proxy would."""
        with self.lock:
            return self.ledger.consume(pool, tokens, self.clock.now_ms())

    def pool_totals(self, pool: str) -> PoolTotals:
        with self.lock:
            return self.ledger.totals(pool, self.clock.now_ms())

    def api_packages(self, pool: str) -> list[LedgerPackage]:
        with self.lock:
            return self.ledger.api_view(pool, self.clock.now_ms())

    def true_packages(self, pool: str) -> list[LedgerPackage]:
        with self.lock:
            return self.ledger.true_packages(pool, self.clock.now_ms())

    def account_packages(self, account: str) -> tuple[int, list[LedgerPackage]]:
        """(now, the API view of every pool of an account) at one instant."""
        with self.lock:
            now = self.clock.now_ms()
            views: list[LedgerPackage] = []
            for pool in self.ledger.pools():
                if pool.split("/", 1)[0] == account:
                    views += self.ledger.api_view(pool, now)
            return now, views

    # ------------------------------------------------------------- raw packages

    def add_raw_package(self, account: str, package: Mapping[str, Any]) -> None:
        """A package listed verbatim (any fields, any amounts) after the ledger's ones."""
        with self.lock:
            self._raw.setdefault(account, []).append(dict(package))

    def clear_raw_packages(self, account: str | None = None) -> None:
        with self.lock:
            if account is None:
                self._raw.clear()
            else:
                self._raw.pop(account, None)

    def raw_packages(self, account: str) -> list[dict[str, Any]]:
        with self.lock:
            return [dict(p) for p in self._raw.get(account, [])]

    # ------------------------------------------------------------- billing faults

    def inject_billing_fault(self, kind: str, count: int = 1, account: str | None = None) -> None:
        """Make the next ``count`` billing calls (of ``account``, or of any) fail as ``kind``."""
        if kind not in BILLING_FAULTS:
            raise ValueError(f"unknown fault {kind!r}; one of {sorted(BILLING_FAULTS)}")
        with self.lock:
            self._faults.setdefault(account, _Faults()).queue.extend([kind] * count)

    def billing_down_until(self, until_ms: int, kind: str = "unavailable",
                           account: str | None = None) -> None:
        """Fail every billing call as ``kind`` until the fake clock reaches ``until_ms``."""
        if kind not in BILLING_FAULTS:
            raise ValueError(f"unknown fault {kind!r}; one of {sorted(BILLING_FAULTS)}")
        with self.lock:
            faults = self._faults.setdefault(account, _Faults())
            faults.down_until_ms, faults.down_kind = until_ms, kind

    def clear_billing_faults(self) -> None:
        with self.lock:
            self._faults.clear()

    def take_billing_fault(self, account: str) -> str | None:
        """The fault this call suffers, if any (an account's own faults go first)."""
        with self.lock:
            now = self.clock.now_ms()
            for key in (account, None):
                faults = self._faults.get(key)
                if faults and now < faults.down_until_ms:
                    return faults.down_kind
            for key in (account, None):
                faults = self._faults.get(key)
                if faults and faults.queue:
                    return faults.queue.popleft()
            return None

    def set_pagination_quirk(self, quirk: str) -> None:
        """``overlap``: each page repeats the previous page's last package;
        ``stuck``: from page 2 on, NextToken never advances."""
        if quirk not in PAGINATION_QUIRKS:
            raise ValueError(f"unknown quirk {quirk!r}; one of {PAGINATION_QUIRKS}")
        with self.lock:
            self.pagination_quirk = quirk

    # ------------------------------------------------------------- counters

    def count_call(self, account: str) -> None:
        with self.lock:
            self._calls[account] = self._calls.get(account, 0) + 1

    def api_calls(self, account: str) -> int:
        """Billing API calls that named this account (failed ones too)."""
        with self.lock:
            return self._calls.get(account, 0)

    def all_api_calls(self) -> dict[str, int]:
        with self.lock:
            return dict(self._calls)

    def reset_api_calls(self) -> None:
        with self.lock:
            self._calls.clear()

    # ------------------------------------------------------------- chat

    def get_chat_defaults(self) -> ChatDefaults:
        with self.lock:
            return ChatDefaults(**asdict(self.chat_defaults))

    def set_chat_defaults(self, **changes: Any) -> ChatDefaults:
        with self.lock:
            for name, value in changes.items():
                if not hasattr(self.chat_defaults, name):
                    raise ValueError(f"unknown chat default {name!r}")
                setattr(self.chat_defaults, name, value)
            return ChatDefaults(**asdict(self.chat_defaults))

    def next_chat_seq(self) -> int:
        with self.lock:
            self._chat_seq += 1
            return self._chat_seq

    def record_chat(self, record: ChatRecord) -> None:
        with self.lock:
            self._chats.append(record)

    def chat_requests(self) -> list[ChatRecord]:
        with self.lock:
            return list(self._chats)

    def clear_chat_requests(self) -> None:
        """Forget the recorded requests (the chat records and the raw upstream log)."""
        with self.lock:
            self._chats.clear()
            self._upstream.clear()

    def record_upstream(self, request: UpstreamRequest) -> None:
        with self.lock:
            self._upstream.append(request)

    def upstream_requests(self) -> list[UpstreamRequest]:
        """The last 1,000 Ark data-plane requests as received: method, path, JSON body."""
        with self.lock:
            return list(self._upstream)

    # ------------------------------------------------------------- stored responses

    def store_response(self, response: StoredResponse) -> None:
        with self.lock:
            self._responses[response.id] = response

    def stored_response(self, response_id: str) -> StoredResponse | None:
        with self.lock:
            return self._responses.get(response_id)

    def delete_response(self, response_id: str) -> bool:
        with self.lock:
            return self._responses.pop(response_id, None) is not None
