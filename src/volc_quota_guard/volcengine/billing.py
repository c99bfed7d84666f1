"""The Volcengine billing client: ``ListResourcePackages`` through the official SDK.

The SDK's own retries are off (``auto_retry=False``); ours are ``stamina`` retries on
``BillingThrottled`` / ``BillingTransient`` only. Every SDK failure is translated in one
place, ``classify_error``, into the ``BillingError`` tree. Amounts are parsed as Decimal and
rounded down, so a fractional token never adds balance we do not have.
"""

from __future__ import annotations

import ast
import json
import logging
import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_FLOOR, Decimal, InvalidOperation
from typing import Any

import stamina
import urllib3
import volcenginesdkbilling
import volcenginesdkcore
from volcenginesdkcore.rest import ApiException

from ..clock import BEIJING
from ..config import Settings, settings
from ..errors import (
    BillingAuthError,
    BillingError,
    BillingMalformed,
    BillingThrottled,
    BillingTransient,
)
from .accounts import Credentials, load_credentials, mask

log = logging.getLogger(__name__)

MAX_RESULTS = 20  # the API's ceiling per page

AUTH_CODES = frozenset({
    "InvalidAccessKey", "SignatureDoesNotMatch", "InvalidAuthorization", "InvalidCredential",
    "InvalidSecretToken", "MissingSignature", "MissingAuthenticationToken", "AccessDenied",
    "LackPolicy",
})
THROTTLE_CODES = frozenset({"FlowLimitExceeded", "AccountFlowLimitExceeded"})
THROTTLE_CODE_NS = frozenset({100018, 100027})
TRANSIENT_CODES = frozenset({
    "InternalError", "InternalServiceTimeout", "ServiceUnavailableTemp", "InternalServiceError",
    "ServiceUnavailable",
})
_CODE_IN_REPR = re.compile(r"""['"]Code['"]\s*:\s*['"](\w[\w.]*)['"]""")


@dataclass(frozen=True)
class ResourcePackage:
    """One resource package as the billing API lists it. Amounts are in ``unit``."""

    instance_no: str
    product: str
    product_name: str
    configuration_code: str
    configuration_name: str
    unit: str
    total: int
    available: int
    status: str  # NotEffective | Effective | FailedToCreate | UsedUp | Expired | Refunded
    effective_ms: int | None
    expires_ms: int | None

    @property
    def is_token_unit(self) -> bool:
        return "token" in self.unit.lower()

    @property
    def is_effective(self) -> bool:
        return self.status.lower() == "effective"


# ---------------------------------------------------------------------- errors


def _error_fields(exc: ApiException) -> tuple[str | None, int | None, str]:
    """(Code, CodeN, Message) from either failure shape of the SDK."""
    err: Any = None
    if exc.body:  # non-2xx: the raw JSON envelope
        try:
            err = json.loads(exc.body).get("ResponseMetadata", {}).get("Error")
        except (ValueError, AttributeError):
            err = None
    elif isinstance(exc.reason, str) and exc.reason.startswith("{"):
        # HTTP 200 + ResponseMetadata.Error: the SDK puts str(dict) in `reason`.
        try:
            err = ast.literal_eval(exc.reason)
        except (ValueError, SyntaxError):
            m = _CODE_IN_REPR.search(exc.reason)
            err = {"Code": m.group(1)} if m else None
    if not isinstance(err, dict):
        return None, None, ""
    code_n = err.get("CodeN")
    try:
        code_n = int(code_n) if code_n is not None else None
    except (TypeError, ValueError):
        code_n = None
    code = err.get("Code")
    return (str(code) if code else None), code_n, str(err.get("Message") or "")


def classify_error(exc: BaseException, account: str = "?") -> BillingError:
    """Translate anything the SDK raised into the BillingError tree (the only place that does)."""
    if isinstance(exc, BillingError):
        return exc
    if isinstance(exc, ApiException):
        status = int(exc.status or 0)
        code, code_n, message = _error_fields(exc)
        what = f"ListResourcePackages for account {account!r}: HTTP {status}"
        if code:
            what += f" {code}"
        if message:
            what += f": {message}"
        if status == 200 and code is None:
            return BillingMalformed(f"{what}: answer without ResponseMetadata")
        if code in AUTH_CODES:
            return BillingAuthError(what)
        if code in THROTTLE_CODES or code_n in THROTTLE_CODE_NS or status == 429:
            return BillingThrottled(what)
        if code in TRANSIENT_CODES or status == 0 or status >= 500:
            return BillingTransient(what)
        if status in (401, 403):
            return BillingAuthError(what)
        if code == "InvalidTimestamp":
            return BillingError(f"{what} (is this host's clock right?)")
        return BillingError(what)
    if isinstance(exc, urllib3.exceptions.HTTPError | OSError | TimeoutError):
        return BillingTransient(f"ListResourcePackages for account {account!r}: "
                                f"{type(exc).__name__}: {exc}")
    if isinstance(exc, ValueError | AttributeError | TypeError | KeyError):
        # The SDK's deserializer fails this way on a body that is not JSON.
        return BillingMalformed(f"ListResourcePackages for account {account!r}: "
                                f"unreadable answer ({type(exc).__name__}: {exc})")
    return BillingError(f"ListResourcePackages for account {account!r}: {exc!r}")


# ---------------------------------------------------------------------- parsing


MAX_TOKENS = 10**15  # the gate's bound on any amount; a package beyond it is not a real one


def parse_amount(text: object) -> int:
    """A decimal string → whole tokens, rounded down. ValueError when it is not a number or not
    within 0..10^15 (a negative balance or an absurd one is no reading to spend by)."""
    try:
        value = Decimal(str(text).strip())
    except InvalidOperation:
        raise ValueError(f"not a number: {text!r}") from None
    if not value.is_finite():
        raise ValueError(f"not a finite number: {text!r}")
    tokens = int(value.to_integral_value(rounding=ROUND_FLOOR))
    if not 0 <= tokens <= MAX_TOKENS:
        raise ValueError(f"out of range 0..{MAX_TOKENS:.0e}: {text!r}")
    return tokens


def parse_time_ms(text: str | None) -> int | None:
    """ISO 8601 (``Z`` or an offset; naive means Beijing) → epoch ms; empty → None."""
    if not text or not str(text).strip():
        return None
    raw = str(text).strip().replace(" ", "T", 1)
    if raw.endswith("Z"):
        raw = raw[:-1] + "+00:00"
    try:
        dt = datetime.fromisoformat(raw)
    except ValueError:
        raise ValueError(f"not a time: {text!r}") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=BEIJING)
    return math.floor(dt.timestamp() * 1000)


def _field(item: Any, attr: str, parse: Any, strict: bool, instance_no: str) -> Any:
    raw = getattr(item, attr, None)
    try:
        if raw is None or str(raw).strip() == "":
            if strict and attr.endswith("_amount"):
                raise ValueError(f"{attr} is missing")
            return None
        return parse(raw)
    except ValueError as exc:
        if strict:
            raise BillingMalformed(f"package {instance_no}: {exc}") from None
        return None


def to_package(item: Any) -> ResourcePackage:
    """An SDK ``ListForListResourcePackagesOutput`` → ResourcePackage.

    A token package with an unreadable amount or time is BillingMalformed (its numbers
    decide what we may spend); any other package's unreadable numbers become 0 / None.
    """
    instance_no = getattr(item, "instance_no", None)
    if not instance_no:
        raise BillingMalformed(f"package without InstanceNo: {item!r}")
    instance_no = str(instance_no)
    unit = str(getattr(item, "unit", None) or "")
    strict = "token" in unit.lower()
    return ResourcePackage(
        instance_no=instance_no,
        product=str(getattr(item, "product", None) or ""),
        product_name=str(getattr(item, "product_name", None) or ""),
        configuration_code=str(getattr(item, "configuration_code", None) or ""),
        configuration_name=str(getattr(item, "configuration_name", None) or ""),
        unit=unit,
        total=_field(item, "total_amount", parse_amount, strict, instance_no) or 0,
        available=_field(item, "available_amount", parse_amount, strict, instance_no) or 0,
        status=str(getattr(item, "status", None) or ""),
        effective_ms=_field(item, "effective_time", parse_time_ms, strict, instance_no),
        expires_ms=_field(item, "expiry_time", parse_time_ms, strict, instance_no),
    )


# ---------------------------------------------------------------------- client


def _configure(cfg: Any, endpoint: str | None) -> None:
    if not endpoint:
        return  # the SDK's default host for the region
    endpoint = endpoint.rstrip("/")
    if endpoint.startswith(("http://", "https://")):
        cfg.host = endpoint  # the SDK takes the scheme from the prefix
        cfg.scheme = endpoint.split("://", 1)[0]
    else:
        cfg.host = endpoint
        cfg.scheme = "https"


class BillingClient:
    """Lists one account's resource packages, paginated, deduplicated, retried."""

    def __init__(
        self,
        credentials: Credentials,
        *,
        endpoint: str | None = None,
        region: str = "cn-beijing",
        connect_timeout: float = 5.0,
        read_timeout: float = 15.0,
        attempts: int = 5,
        retry_timeout: float = 60.0,
        wait_initial: float = 0.5,
        wait_max: float = 10.0,
        wait_jitter: float = 0.5,
        page_interval: float = 0.125,
        status: str | None = None,
        max_pages: int = 500,
    ) -> None:
        if attempts < 1 or max_pages < 1:
            raise ValueError("attempts and max_pages must be >= 1")
        self.account = credentials.account
        self.endpoint = endpoint
        self.status = status
        self.attempts = attempts
        self.retry_timeout = retry_timeout
        self.wait_initial = wait_initial
        self.wait_max = wait_max
        self.wait_jitter = wait_jitter
        # The API allows 10 QPS per account; spacing pages keeps a long listing under it.
        self.page_interval = page_interval
        self.max_pages = max_pages
        self.calls = 0  # HTTP attempts made, for logs and tests
        self._key_hint = mask(credentials.access_key)
        cfg = volcenginesdkcore.Configuration()
        cfg.ak = credentials.access_key
        cfg.sk = credentials.secret_key.get_secret_value()
        cfg.region = region
        cfg.auto_retry = False  # retries are ours (stamina), with our error classes
        cfg.connect_timeout = connect_timeout
        cfg.read_timeout = read_timeout
        _configure(cfg, endpoint)
        self._api = volcenginesdkbilling.BILLINGApi(volcenginesdkcore.ApiClient(cfg))

    def __repr__(self) -> str:
        return f"BillingClient(account={self.account!r}, endpoint={self.endpoint!r})"

    @classmethod
    def for_account(
        cls,
        account: str,
        *,
        config: Settings | None = None,
        env: Mapping[str, str] | None = None,
        **kwargs: Any,
    ) -> BillingClient:
        """A client for a named account: credentials from env, endpoint/region from Settings."""
        config = config or settings()
        kwargs.setdefault("endpoint", config.billing_endpoint)
        kwargs.setdefault("region", config.billing_region)
        return cls(load_credentials(account, env), **kwargs)

    def fetch_page(self, token: str = "") -> tuple[list[ResourcePackage], str]:
        """One page (with retries): its packages and the NextToken ("" when none)."""
        request = volcenginesdkbilling.ListResourcePackagesRequest(
            resource_type="Package",
            max_results=str(MAX_RESULTS),
            next_token=token,
            status=self.status,
        )
        for attempt in stamina.retry_context(
            on=(BillingThrottled, BillingTransient),
            attempts=self.attempts,
            timeout=self.retry_timeout,
            wait_initial=self.wait_initial,
            wait_max=self.wait_max,
            wait_jitter=self.wait_jitter,
        ):
            with attempt:
                self.calls += 1
                try:
                    resp = self._api.list_resource_packages(request)
                except Exception as exc:  # translated in one place
                    err = classify_error(exc, self.account)
                    log.warning("billing: %s (attempt %d)", err, attempt.num)
                    raise err from exc
        if resp is None:
            raise BillingMalformed(
                f"ListResourcePackages for account {self.account!r}: empty Result")
        items = getattr(resp, "list", None) or []
        return [to_package(item) for item in items], str(getattr(resp, "next_token", "") or "")

    def list_resource_packages(self) -> list[ResourcePackage]:
        """Every package of the account: all pages, deduplicated by InstanceNo.

        Stops on an empty page, an empty NextToken, or a token seen before. When the same
        package shows up twice (it can, across pages) the lower balance is kept.
        """
        started = time.monotonic()
        by_instance: dict[str, ResourcePackage] = {}
        seen = {""}
        token = ""
        for page_no in range(1, self.max_pages + 1):
            if page_no > 1 and self.page_interval > 0:
                time.sleep(self.page_interval)
            page, nxt = self.fetch_page(token)
            for pkg in page:
                old = by_instance.get(pkg.instance_no)
                if old is None or pkg.available < old.available:
                    by_instance[pkg.instance_no] = pkg
            if not page or not nxt or nxt in seen:
                break
            seen.add(nxt)
            token = nxt
        else:
            raise BillingMalformed(
                f"ListResourcePackages for account {self.account!r}: more than "
                f"{self.max_pages} pages")
        log.info("billing: account=%s key=%s listed %d packages in %d pages (%.2fs)",
                 self.account, self._key_hint,
                 len(by_instance), page_no, time.monotonic() - started)
        return list(by_instance.values())
