"""The fake billing OpenAPI: ``POST /?Action=ListResourcePackages&Version=2022-01-01``.

Wire format, signing and error envelopes follow the billing API as docs/volcengine.md §1 describes it, so the
real SDK talks to it unchanged. The account is the AK in the ``Authorization`` header and
the signature is checked with that account's SK over the headers the client says it signed.
"""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, quote

from .ledger import LedgerPackage
from .state import ANONYMOUS, UNKNOWN, FakeState

ACTION = "ListResourcePackages"
VERSION = "2022-01-01"
SERVICE = "billing"
REGION = "cn-beijing"
MAX_RESULTS = 20

# Code -> (CodeN, HTTP status, message); CodeN None where no public number is known.
ERRORS: dict[str, tuple[int | None, int, str]] = {
    "MissingParameter": (100002, 400, "The parameter {} is required."),
    "InvalidParam": (None, 400, "The parameter {} is invalid."),
    "MissingAuthenticationToken": (100003, 401, "The request is missing the Authorization header."),
    "InvalidActionOrVersion": (100008, 404, "Could not find operation {}."),
    "InvalidAccessKey": (100009, 401, "The accesskey [{}] included in the request is invalid."),
    "SignatureDoesNotMatch": (100010, 401,
                              "The request signature we calculated does not match the signature "
                              "you provided."),
    "AccessDenied": (100013, 403, "User is not authorized to perform: {} on resource: *."),
    "InternalError": (100014, 500, "The request has failed due to an internal error."),
    "FlowLimitExceeded": (100018, 429, "Request was rejected because of flow control."),
    "ServiceUnavailableTemp": (100019, 503, "Service is temporarily unavailable."),
    "InvalidAuthorization": (100024, 401, "The Authorization header is malformed."),
    "InvalidCredential": (100025, 401, "The Credential in the Authorization header is invalid."),
    "AccountFlowLimitExceeded": (100027, 429,
                                 "Request was rejected because the request speed was too fast."),
}
_AUTH_RE = re.compile(
    r"^HMAC-SHA256\s+Credential=([^/,\s]+)/(\d{8})/([^/,\s]+)/([^/,\s]+)/request,\s*"
    r"SignedHeaders=([^,\s]+),\s*Signature=([0-9a-fA-F]+)\s*$"
)
_request_ids = itertools.count(1)


@dataclass(frozen=True)
class Reply:
    status: int
    body: bytes
    content_type: str = "application/json; charset=utf-8"


@dataclass(frozen=True)
class Authorization:
    access_key: str
    date: str
    region: str
    service: str
    signed_headers: tuple[str, ...]
    signature: str


def json_reply(status: int, obj: Any) -> Reply:
    return Reply(status, json.dumps(obj, ensure_ascii=False).encode())


def _metadata(request_id: str) -> dict[str, Any]:
    return {"RequestId": request_id, "Action": ACTION, "Version": VERSION,
            "Service": SERVICE, "Region": REGION}


def _request_id(now_ms: int) -> str:
    stamp = datetime.fromtimestamp(now_ms / 1000, tz=UTC).strftime("%Y%m%d%H%M%S")
    return f"{stamp}{next(_request_ids):020d}"


def error_reply(code: str, now_ms: int, *, arg: str = "", http_status: int | None = None) -> Reply:
    """The documented error envelope: ``ResponseMetadata.Error`` and no ``Result``."""
    code_n, status, message = ERRORS[code]
    error: dict[str, Any] = {"Code": code, "Message": message.format(arg)}
    if code_n is not None:
        error = {"CodeN": code_n, **error}
    meta = _metadata(_request_id(now_ms)) | {"Error": error}
    return json_reply(status if http_status is None else http_status, {"ResponseMetadata": meta})


# ---------------------------------------------------------------------- signing


def parse_authorization(value: str | None) -> Authorization | None:
    m = _AUTH_RE.match(value or "")
    if not m:
        return None
    ak, date, region, service, signed, signature = m.groups()
    return Authorization(ak, date, region, service, tuple(signed.split(";")), signature.lower())


def _canonical_query(query: str) -> str:
    pairs = [(quote(k, safe="-_.~"), quote(v, safe="-_.~"))
             for k, v in parse_qsl(query, keep_blank_values=True)]
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


def expected_signature(
    secret_key: str,
    auth: Authorization,
    method: str,
    path: str,
    query: str,
    header: Callable[[str], str | None],
    body: bytes,
) -> str:
    """The V4 signature the SDK computes (``volcenginesdkcore/signv4.py``)."""
    lines = []
    for name in auth.signed_headers:
        value = header(name) or ""
        if name == "host" and value.rsplit(":", 1)[-1] in ("80", "443"):
            value = value.rsplit(":", 1)[0]
        lines.append(f"{name}:{value}\n")
    body_hash = hashlib.sha256(body).hexdigest()
    canonical = "\n".join([method, path or "/", _canonical_query(query), "".join(lines),
                           ";".join(auth.signed_headers), body_hash])
    x_date = header("x-date") or ""
    scope = f"{auth.date}/{auth.region}/{auth.service}/request"
    to_sign = "\n".join(["HMAC-SHA256", x_date, scope,
                         hashlib.sha256(canonical.encode()).hexdigest()])
    key = secret_key.encode()
    for part in (auth.date, auth.region, auth.service, "request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()


# ---------------------------------------------------------------------- packages


def iso_utc(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render(view: LedgerPackage, account: str) -> dict[str, Any]:
    """A ledger package in the API's shape: every amount a string."""
    return {
        "OwnerID": "2100000001",
        "UserName": account,
        "PackageType": "Periodic",
        "InstanceNo": view.instance_no,
        "InstanceName": "",
        "Product": view.product,
        "ProductName": view.product_name,
        "TotalAmount": str(view.total),
        "AvailableAmount": str(view.available),
        "Unit": view.unit,
        "EffectiveTime": iso_utc(view.acquired_ms),
        "ExpiryTime": iso_utc(view.expires_ms),
        "BillTime": iso_utc(view.acquired_ms),
        "Status": view.status,
        "ConfigurationCode": view.configuration_code,
        "ConfigurationName": view.configuration_name,
        "Specification": str(view.total),
        "SpecificationUnit": view.unit,
        "RegionCode": REGION,
        "ZoneCode": "",
        "SpecCalculateFactor": "1",
        "ResetPeriod": "",
        "ResetByNaturalMonth": "false",
        "SubjectNo": "北京火山引擎科技有限公司",
    }


def noise_packages(account: str) -> list[dict[str, Any]]:
    """Packages every real account has that no pool may count: a voice package (unit 字符),
    a used-up Ark package, a CDN package, and an Ark package for a model nobody routes to."""
    base = {"OwnerID": "2100000001", "UserName": account, "PackageType": "Periodic",
            "InstanceName": "", "RegionCode": REGION, "ZoneCode": "", "SpecCalculateFactor": "1",
            "ResetPeriod": "", "ResetByNaturalMonth": "false", "SubjectNo": "北京火山引擎科技有限公司"}
    rows = [
        ("PackageProduct6900000000000000001", "speech_saas_prod", "豆包语音", "20000", "14018",
         "字符", "Effective", "Doubao_TTS_free_pack", "豆包语音合成 赠送资源包",
         "2026-01-01T00:00:00+08:00", "2027-01-01T00:00:00+08:00"),
        ("PackageProduct6900000000000000002", "ark_bd", "火山方舟", "500000", "0",
         "Tokens", "UsedUp", "Doubao_Seed_2.0_code_pack", "Doubao-Seed-2.0-code 资源包",
         "2026-05-20T16:00:00+08:00", "2026-11-20T16:00:00+08:00"),
        ("PackageProduct6900000000000000003", "CDN", "内容分发网络", "500", "321.5",
         "GB", "Effective", "CDN_mainland_500GB_1m_package", "国内CDN-500GB-1月有效期",
         "2026-01-01T00:00:00+08:00", "2027-01-01T00:00:00+08:00"),
        ("PackageProduct6900000000000000004", "ark_bd", "火山方舟", "1000000", "1000000",
         "Tokens", "Effective", "Doubao_Seed3D_1.0_pack_free_infer", "Doubao-Seed3D-1.0 免费推理包",
         "2026-01-01T00:00:00+08:00", "2027-01-01T00:00:00+08:00"),
    ]
    out = []
    for (no, product, product_name, total, available, unit, status, code, name,
         effective, expiry) in rows:
        out.append(base | {
            "InstanceNo": no, "Product": product, "ProductName": product_name,
            "TotalAmount": total, "AvailableAmount": available, "Unit": unit, "Status": status,
            "ConfigurationCode": code, "ConfigurationName": name, "EffectiveTime": effective,
            "ExpiryTime": expiry, "BillTime": effective, "Specification": total,
            "SpecificationUnit": unit,
        })
    return out


def _fault_reply(kind: str, now_ms: int) -> Reply:
    if kind == "throttle":
        return error_reply("AccountFlowLimitExceeded", now_ms)
    if kind == "throttle_200":
        return error_reply("FlowLimitExceeded", now_ms, http_status=200)
    if kind == "auth":
        return error_reply("AccessDenied", now_ms, arg=ACTION, http_status=200)
    if kind == "internal":
        return error_reply("InternalError", now_ms)
    if kind == "unavailable":
        return error_reply("ServiceUnavailableTemp", now_ms)
    if kind == "gateway":
        return Reply(502, b"<html><body><h1>502 Bad Gateway</h1></body></html>",
                     "text/html; charset=utf-8")
    if kind == "malformed":
        return Reply(200, b'{"ResponseMetadata": {"RequestId": "x", "Action": "ListResou')
    if kind == "no_metadata":
        return json_reply(200, {"message": "upstream gateway answered for the service"})
    raise ValueError(kind)


# ---------------------------------------------------------------------- handler


def handle_billing(
    state: FakeState,
    method: str,
    path: str,
    query: str,
    header: Callable[[str], str | None],
    body: bytes,
) -> Reply:
    """Answer one billing OpenAPI request."""
    now = state.now_ms()
    params = dict(parse_qsl(query, keep_blank_values=True))
    if params.get("Action") != ACTION or params.get("Version") != VERSION or method != "POST":
        return error_reply("InvalidActionOrVersion", now,
                           arg=f"{params.get('Action')} for version {params.get('Version')}")
    raw_auth = header("authorization")
    if not raw_auth:
        state.count_call(ANONYMOUS)
        return error_reply("MissingAuthenticationToken", now)
    auth = parse_authorization(raw_auth)
    if auth is None:
        state.count_call(ANONYMOUS)
        return error_reply("InvalidAuthorization", now)
    account = state.account_by_access_key(auth.access_key)
    if account is None:
        state.count_call(UNKNOWN)
        return error_reply("InvalidAccessKey", now, arg=auth.access_key)
    state.count_call(account.name)
    if auth.service != SERVICE:
        return error_reply("InvalidCredential", now)
    signature = expected_signature(account.secret_key, auth, method, path, query, header, body)
    if not hmac.compare_digest(signature, auth.signature):
        return error_reply("SignatureDoesNotMatch", now)

    fault = state.take_billing_fault(account.name)
    if fault is not None:
        return _fault_reply(fault, now)

    try:
        request = json.loads(body or b"{}")
        if not isinstance(request, dict):
            raise ValueError
    except ValueError:
        return error_reply("InvalidParam", now, arg="body")
    for name in ("ResourceType", "MaxResults"):
        if request.get(name) in (None, ""):
            return error_reply("MissingParameter", now, arg=name)
    try:
        max_results = int(str(request["MaxResults"]))
    except ValueError:
        max_results = 0
    if not 1 <= max_results <= MAX_RESULTS:
        return error_reply("InvalidParam", now, arg="MaxResults")
    return _page(state, account.name, request, max_results, now)


def _page(state: FakeState, account: str, request: dict[str, Any], max_results: int,
          now_ms: int) -> Reply:
    items: list[dict[str, Any]] = []
    if request["ResourceType"] == "Package":
        _, views = state.account_packages(account)
        items = [render(v, account) for v in views]
        if state.noise:
            items += noise_packages(account)
        items += state.raw_packages(account)
    for name in ("Status", "Product"):
        if request.get(name):
            items = [i for i in items if i.get(name) == request[name]]

    token = str(request.get("NextToken") or "")
    start = 0
    if token:
        index = next((n for n, i in enumerate(items) if i.get("InstanceNo") == token), None)
        if index is None:
            return error_reply("InvalidParam", now_ms, arg="NextToken")
        start = index + 1
        if state.pagination_quirk == "overlap":
            start -= 1  # the previous page's last package comes again
    page = items[start:start + max_results]
    # A full page always carries a token, so a listing of exactly 20·k ends on an empty page.
    next_token = page[-1]["InstanceNo"] if len(page) == max_results else ""
    if token and state.pagination_quirk == "stuck":
        next_token = token
    body = {"ResponseMetadata": _metadata(_request_id(now_ms)),
            "Result": {"List": page, "NextToken": next_token}}
    return json_reply(200, body)
