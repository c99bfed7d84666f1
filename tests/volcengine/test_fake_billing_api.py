"""The fake billing OpenAPI on the wire: envelope, signing, paging, faults, call counts."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from vc_support import ACCOUNTS, POOL_A
from volcenginesdkcore.signv4 import SignerV4

from volc_quota_guard.fake import FakeVolcengine

HTTP = httpx.Client(timeout=10)  # one client: building one per call costs ~40 ms

QUERY = {"Action": "ListResourcePackages", "Version": "2022-01-01"}


def signed_post(fake: FakeVolcengine, body: dict[str, Any], account: str = "acct-a",
                secret: str | None = None, tamper: bool = False,
                access_key: str | None = None) -> httpx.Response:
    """Sign like the SDK does (its own SignerV4) and POST with httpx."""
    ak, sk, _ = ACCOUNTS[account]
    ak = access_key or ak
    text = json.dumps(body)
    headers = {"Content-Type": "application/json", "Host": f"127.0.0.1:{fake.port}"}
    SignerV4.sign("/", "POST", headers, text, None, dict(QUERY), ak, secret or sk,
                  "cn-beijing", "billing")
    content = text.replace("20", "19") if tamper else text
    return HTTP.post(f"{fake.url}/", params=QUERY, headers=headers, content=content)


def page_body(token: str = "", **extra: Any) -> dict[str, Any]:
    return {"MaxResults": "20", "NextToken": token, "ResourceType": "Package", **extra}


def test_a_signed_request_gets_the_documented_envelope_with_string_amounts(
        fake: FakeVolcengine) -> None:
    """A correctly signed call returns ResponseMetadata + Result{List, NextToken}, amounts as
    strings, and the ledger's package next to the noise packages."""
    fake.add_package(POOL_A, 2_000_000, available=1_534_211)
    r = signed_post(fake, page_body())
    assert r.status_code == 200
    data = r.json()
    meta = data["ResponseMetadata"]
    assert (meta["Action"], meta["Version"], meta["Service"]) == (
        "ListResourcePackages", "2022-01-01", "billing")
    assert "Error" not in meta
    items = data["Result"]["List"]
    ours = [i for i in items if i["ConfigurationCode"].startswith("deepseek_v4_flash_0731")]
    assert len(ours) == 1
    assert (ours[0]["AvailableAmount"], ours[0]["TotalAmount"]) == ("1534211", "2000000")
    assert {i["Unit"] for i in items} >= {"Tokens", "字符", "GB"}
    assert any(i["Status"] == "UsedUp" for i in items)
    assert data["Result"]["NextToken"] == ""  # 5 items: one short page


def test_missing_unknown_and_wrong_credentials_are_401s_with_their_codes(
        fake: FakeVolcengine) -> None:
    """No Authorization → MissingAuthenticationToken, unknown AK → InvalidAccessKey,
    wrong SK or a changed body → SignatureDoesNotMatch; all HTTP 401."""
    bare = HTTP.post(f"{fake.url}/", params=QUERY, json=page_body())
    assert bare.status_code == 401
    assert bare.json()["ResponseMetadata"]["Error"]["Code"] == "MissingAuthenticationToken"
    r = signed_post(fake, page_body(), access_key="AKLTnobody0000000000")
    assert (r.status_code, r.json()["ResponseMetadata"]["Error"]["Code"]) == (
        401, "InvalidAccessKey")
    r = signed_post(fake, page_body(), secret="not-the-secret")
    assert (r.status_code, r.json()["ResponseMetadata"]["Error"]["Code"]) == (
        401, "SignatureDoesNotMatch")
    r = signed_post(fake, page_body(), tamper=True)
    assert r.json()["ResponseMetadata"]["Error"]["Code"] == "SignatureDoesNotMatch"


def test_max_results_above_twenty_is_invalid_param(fake: FakeVolcengine) -> None:
    """MaxResults is capped at 20 like the real API: 21 is a 400 InvalidParam."""
    r = signed_post(fake, page_body() | {"MaxResults": "21"})
    assert r.status_code == 400
    assert r.json()["ResponseMetadata"]["Error"]["Code"] == "InvalidParam"


def test_pages_chain_by_next_token_and_a_full_last_page_is_followed_by_an_empty_one(
        quiet_fake: FakeVolcengine) -> None:
    """40 packages give pages of 20 and 20 with tokens, then an empty page with no token."""
    for i in range(40):
        quiet_fake.add_package(POOL_A, 1000 + i)
    first = signed_post(quiet_fake, page_body()).json()["Result"]
    second = signed_post(quiet_fake, page_body(first["NextToken"])).json()["Result"]
    third = signed_post(quiet_fake, page_body(second["NextToken"])).json()["Result"]
    assert [len(first["List"]), len(second["List"]), len(third["List"])] == [20, 20, 0]
    assert first["NextToken"] == first["List"][-1]["InstanceNo"]
    assert third["NextToken"] == ""


def test_status_filter_applies(fake: FakeVolcengine) -> None:
    """Status=UsedUp returns only used-up packages."""
    r = signed_post(fake, page_body(Status="UsedUp"))
    items = r.json()["Result"]["List"]
    assert items and {i["Status"] for i in items} == {"UsedUp"}


def test_injected_faults_answer_in_their_documented_shapes(fake: FakeVolcengine) -> None:
    """Each fault kind yields its HTTP status and error shape once, then service resumes."""
    expected = {
        "throttle": (429, "AccountFlowLimitExceeded"),
        "throttle_200": (200, "FlowLimitExceeded"),
        "auth": (200, "AccessDenied"),
        "internal": (500, "InternalError"),
        "unavailable": (503, "ServiceUnavailableTemp"),
    }
    for kind, (status, code) in expected.items():
        fake.inject_billing_fault(kind)
        r = signed_post(fake, page_body())
        assert (r.status_code, r.json()["ResponseMetadata"]["Error"]["Code"]) == (status, code)
        assert "Result" not in r.json()
    fake.inject_billing_fault("malformed")
    r = signed_post(fake, page_body())
    assert r.status_code == 200
    with pytest.raises(ValueError):
        json.loads(r.content)
    assert signed_post(fake, page_body()).json()["Result"]["List"]


def test_faults_for_one_account_leave_the_other_alone(fake: FakeVolcengine) -> None:
    """A fault queued for acct-a does not hit acct-b."""
    fake.inject_billing_fault("throttle", account="acct-a")
    assert signed_post(fake, page_body(), account="acct-b").status_code == 200
    assert signed_post(fake, page_body(), account="acct-a").status_code == 429


def test_down_until_fails_every_call_until_the_clock_passes(fake: FakeVolcengine) -> None:
    """billing_down_until fails all calls until the fake clock reaches the given time."""
    fake.billing_down_until(fake.now_ms() + 60_000, kind="internal")
    assert signed_post(fake, page_body()).status_code == 500
    assert signed_post(fake, page_body()).status_code == 500
    fake.advance(60_000)
    assert signed_post(fake, page_body()).status_code == 200


def test_api_calls_are_counted_per_account_including_failures(fake: FakeVolcengine) -> None:
    """Each billing request naming an account counts once for it, failed or not."""
    signed_post(fake, page_body())
    fake.inject_billing_fault("throttle")
    signed_post(fake, page_body())
    signed_post(fake, page_body(), account="acct-b")
    assert fake.api_calls("acct-a") == 2
    assert fake.api_calls("acct-b") == 1
    assert HTTP.get(f"{fake.url}/_fake/billing/calls").json() == {"acct-a": 2, "acct-b": 1}
