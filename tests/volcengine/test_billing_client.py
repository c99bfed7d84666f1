"""The billing client over the wire against the fake: paging, dedupe, retries, error classes,
amount parsing, credentials and secrecy."""

from __future__ import annotations

import logging
import time

import pytest
from vc_support import ACCOUNTS, POOL_A, client_for, creds
from volcenginesdkcore.rest import ApiException

from volc_quota_guard.errors import (
    BillingAuthError,
    BillingError,
    BillingMalformed,
    BillingThrottled,
    BillingTransient,
    ConfigError,
)
from volc_quota_guard.fake import FakeVolcengine
from volc_quota_guard.volcengine.accounts import env_names, load_credentials
from volc_quota_guard.volcengine.billing import BillingClient, classify_error, parse_amount


def test_pagination_reads_all_45_packages_in_three_calls(quiet_fake: FakeVolcengine) -> None:
    """45 packages come back complete, in 3 pages of ≤20, with exactly 3 API calls."""
    numbers = {quiet_fake.add_package(POOL_A, 1000 + i) for i in range(45)}
    packages = client_for(quiet_fake).list_resource_packages()
    assert {p.instance_no for p in packages} == numbers
    assert sorted(p.available for p in packages) == list(range(1000, 1045))
    assert quiet_fake.api_calls("acct-a") == 3


def test_listing_stops_on_an_empty_page(quiet_fake: FakeVolcengine) -> None:
    """With exactly 40 packages the third page is empty and the client stops there."""
    for i in range(40):
        quiet_fake.add_package(POOL_A, 1000 + i)
    assert len(client_for(quiet_fake).list_resource_packages()) == 40
    assert quiet_fake.api_calls("acct-a") == 3


def test_packages_repeated_across_pages_are_deduplicated(quiet_fake: FakeVolcengine) -> None:
    """When each page repeats the previous page's last package, every InstanceNo appears once."""
    for i in range(45):
        quiet_fake.add_package(POOL_A, 1000 + i)
    quiet_fake.set_pagination_quirk("overlap")
    packages = client_for(quiet_fake).list_resource_packages()
    assert len(packages) == 45
    assert len({p.instance_no for p in packages}) == 45


def test_a_duplicate_keeps_the_lower_balance(quiet_fake: FakeVolcengine) -> None:
    """If one InstanceNo is listed twice with different balances, the lower one is kept."""
    row = {"InstanceNo": "PackageProductDUP", "Product": "ark_bd", "Unit": "Tokens",
           "Status": "Effective", "TotalAmount": "1000", "ConfigurationCode": "X_pack"}
    quiet_fake.add_raw_package("acct-a", row | {"AvailableAmount": "900"})
    quiet_fake.add_raw_package("acct-a", row | {"AvailableAmount": "400"})
    quiet_fake.add_raw_package("acct-a", row | {"AvailableAmount": "700"})
    (pkg,) = client_for(quiet_fake).list_resource_packages()
    assert pkg.available == 400


def test_a_token_that_does_not_advance_stops_the_listing(quiet_fake: FakeVolcengine) -> None:
    """A server that hands back the same NextToken is read twice, not forever."""
    for i in range(45):
        quiet_fake.add_package(POOL_A, 1000 + i)
    quiet_fake.set_pagination_quirk("stuck")
    assert len(client_for(quiet_fake).list_resource_packages()) == 40
    assert quiet_fake.api_calls("acct-a") == 2


def test_throttling_backs_off_and_then_succeeds(fake: FakeVolcengine) -> None:
    """Two throttled answers (429) are retried with backoff; the third call succeeds."""
    fake.inject_billing_fault("throttle", count=2)
    started = time.monotonic()
    packages = client_for(fake, wait_initial=0.05, wait_max=0.1, wait_jitter=0.0) \
        .list_resource_packages()
    assert packages
    assert fake.api_calls("acct-a") == 3
    assert time.monotonic() - started >= 0.05 + 0.1  # two waits: 0.05, then 0.1


def test_throttling_in_the_http_200_shape_is_retried_too(fake: FakeVolcengine) -> None:
    """FlowLimitExceeded inside an HTTP 200 envelope is classified as throttling and retried."""
    fake.inject_billing_fault("throttle_200")
    assert client_for(fake).list_resource_packages()
    assert fake.api_calls("acct-a") == 2


def test_endless_throttling_gives_up_with_billing_throttled(fake: FakeVolcengine) -> None:
    """After its attempts the client raises BillingThrottled, having called `attempts` times."""
    fake.inject_billing_fault("throttle", count=10)
    with pytest.raises(BillingThrottled, match="AccountFlowLimitExceeded"):
        client_for(fake, attempts=3).list_resource_packages()
    assert fake.api_calls("acct-a") == 3


@pytest.mark.parametrize("kind", ["internal", "unavailable", "gateway"])
def test_server_errors_are_retried(fake: FakeVolcengine, kind: str) -> None:
    """5xx answers (JSON or an HTML gateway page) are transient: retried, then success."""
    fake.inject_billing_fault(kind, count=2)
    assert client_for(fake).list_resource_packages()
    assert fake.api_calls("acct-a") == 3


def test_a_wrong_secret_fails_loudly_and_once(fake: FakeVolcengine) -> None:
    """A bad SK is a BillingAuthError on the first call: auth failures are never retried."""
    with pytest.raises(BillingAuthError, match="SignatureDoesNotMatch"):
        client_for(fake, secret="wrong-secret").list_resource_packages()
    assert fake.api_calls("acct-a") == 1


def test_an_unknown_access_key_is_an_auth_error(fake: FakeVolcengine) -> None:
    """An AK the service does not know is a BillingAuthError (InvalidAccessKey)."""
    from pydantic import SecretStr

    from volc_quota_guard.volcengine.accounts import Credentials

    client = BillingClient(Credentials("ghost", "AKLTghost00000000000", SecretStr("x")),
                           endpoint=fake.url)
    with pytest.raises(BillingAuthError, match="InvalidAccessKey"):
        client.list_resource_packages()


def test_access_denied_in_an_http_200_envelope_is_an_auth_error(fake: FakeVolcengine) -> None:
    """The HTTP 200 + ResponseMetadata.Error shape (AccessDenied) maps to BillingAuthError."""
    fake.inject_billing_fault("auth")
    with pytest.raises(BillingAuthError, match="AccessDenied"):
        client_for(fake).list_resource_packages()
    assert fake.api_calls("acct-a") == 1


@pytest.mark.parametrize("kind", ["malformed", "no_metadata"])
def test_an_unreadable_answer_is_billing_malformed(fake: FakeVolcengine, kind: str) -> None:
    """A body that is not JSON, or JSON without ResponseMetadata, is BillingMalformed and not
    retried."""
    fake.inject_billing_fault(kind)
    with pytest.raises(BillingMalformed):
        client_for(fake).list_resource_packages()
    assert fake.api_calls("acct-a") == 1


def test_a_dead_endpoint_is_transient(fake: FakeVolcengine) -> None:
    """Connection refused is BillingTransient after the retries."""
    url = fake.url
    fake.stop()
    client = BillingClient(creds(), endpoint=url, attempts=2, wait_initial=0.01,
                           wait_max=0.01, wait_jitter=0.0, connect_timeout=0.5)
    with pytest.raises(BillingTransient):
        client.list_resource_packages()
    assert client.calls == 2


def test_amounts_are_exact_and_round_down(quiet_fake: FakeVolcengine) -> None:
    """'1999000.5' becomes 1999000 tokens, a JSON number is read exactly, times are parsed."""
    base = {"Product": "ark_bd", "Unit": "Tokens", "Status": "Effective",
            "ConfigurationCode": "X_pack", "EffectiveTime": "2026-08-01T00:00:00+08:00",
            "ExpiryTime": "2026-08-31T00:00:00Z"}
    quiet_fake.add_raw_package("acct-a", base | {"InstanceNo": "P1", "TotalAmount": "2000000",
                                                 "AvailableAmount": "1999000.5"})
    quiet_fake.add_raw_package("acct-a", base | {"InstanceNo": "P2", "TotalAmount": 5e5,
                                                 "AvailableAmount": 123456789012})
    by_no = {p.instance_no: p for p in client_for(quiet_fake).list_resource_packages()}
    assert by_no["P1"].available == 1_999_000
    assert (by_no["P2"].total, by_no["P2"].available) == (500_000, 123_456_789_012)
    assert by_no["P1"].expires_ms == 1_788_134_400_000
    assert by_no["P1"].effective_ms == 1_785_513_600_000


def test_a_bad_amount_on_a_token_package_is_malformed(quiet_fake: FakeVolcengine) -> None:
    """An unreadable token amount fails the listing; on a GB package it just reads as 0."""
    quiet_fake.add_raw_package("acct-a", {"InstanceNo": "G1", "Unit": "GB",
                                          "AvailableAmount": "lots", "TotalAmount": "1"})
    (pkg,) = client_for(quiet_fake).list_resource_packages()
    assert pkg.available == 0
    quiet_fake.add_raw_package("acct-a", {"InstanceNo": "T1", "Unit": "Tokens",
                                          "AvailableAmount": "n/a", "TotalAmount": "1"})
    with pytest.raises(BillingMalformed, match="T1"):
        client_for(quiet_fake).list_resource_packages()


@pytest.mark.parametrize("amount", ["-5000", -1, "2000000000000000"])
def test_a_token_amount_no_gate_can_hold_is_malformed(quiet_fake: FakeVolcengine, amount: object) -> None:
    """A negative balance or one beyond 10^15 fails the listing naming the package (red-team
    stop 37: it reached the gate, which refused it, and the account's other pools never synced)."""
    quiet_fake.add_raw_package("acct-a", {"InstanceNo": "T9", "Unit": "Tokens",
                                          "AvailableAmount": amount, "TotalAmount": "1000"})
    with pytest.raises(BillingMalformed, match="T9.*out of range"):
        client_for(quiet_fake).list_resource_packages()


def test_parse_amount_rounds_toward_less_balance() -> None:
    """Fractions round down (never up); non-numbers, negative balances and amounts beyond the
    gate's 10^15 are ValueErrors (a token package's make the listing BillingMalformed)."""
    assert parse_amount("10.999") == 10
    assert parse_amount("5E+5") == 500_000
    assert parse_amount("1E+15") == 10**15
    for bad in ("", "NaN", "Infinity", "1,000", "-0.5", "-5000", "2E+15"):
        with pytest.raises(ValueError):
            parse_amount(bad)


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (ApiException(status=200, reason="{'CodeN': 100013, 'Code': 'AccessDenied', "
                                          "'Message': 'no'}"), BillingAuthError),
        (ApiException(status=200, reason="{'CodeN': 100027, 'Code': "
                                          "'AccountFlowLimitExceeded', 'Message': ''}"),
         BillingThrottled),
        (ApiException(status=200, reason="{'CodeN': 100014, 'Code': 'InternalError'}"),
         BillingTransient),
        (ApiException(status=200, reason="InternalServiceError"), BillingMalformed),
        (ApiException(status=200, reason="{'Code': 'Weird'}"), BillingError),
        (ApiException(status=429, reason="Too Many Requests"), BillingThrottled),
        (ApiException(status=0, reason="SSLError"), BillingTransient),
        (ConnectionResetError("reset"), BillingTransient),
        (AttributeError("'str' object has no attribute 'get'"), BillingMalformed),
    ],
)
def test_classify_error_maps_both_sdk_shapes(exc: BaseException, kind: type) -> None:
    """One classifier turns the SDK's repr-in-reason and JSON-in-body shapes into our classes."""
    assert type(classify_error(exc)) is kind


def test_classify_error_reads_the_json_body_of_non_2xx() -> None:
    """A 403 whose body names InvalidAccessKey is auth; a 503 with any body is transient."""

    class Resp:
        def __init__(self, status: int, body: str) -> None:
            self.status, self.reason, self.data = status, "x", body

        def getheaders(self) -> dict[str, str]:
            return {}

    body = '{"ResponseMetadata": {"Error": {"CodeN": 100009, "Code": "InvalidAccessKey"}}}'
    assert type(classify_error(ApiException(http_resp=Resp(403, body)))) is BillingAuthError
    assert type(classify_error(ApiException(http_resp=Resp(503, "<html>")))) is \
        BillingTransient
    flow = '{"ResponseMetadata": {"Error": {"CodeN": 100018, "Code": "FlowLimitExceeded"}}}'
    assert type(classify_error(ApiException(http_resp=Resp(400, flow)))) is BillingThrottled


def test_credentials_come_from_the_account_env_vars() -> None:
    """'default' reads VOLC_ACCESSKEY/SECRETKEY; 'team-b.x' reads VOLC_*_TEAM_B_X."""
    assert env_names("default") == ("VOLC_ACCESSKEY", "VOLC_SECRETKEY")
    assert env_names("team-b.x") == ("VOLC_ACCESSKEY_TEAM_B_X", "VOLC_SECRETKEY_TEAM_B_X")
    env = {"VOLC_ACCESSKEY_TEAM_B": "AKLTteamb0000001", "VOLC_SECRETKEY_TEAM_B": "sk-b"}
    c = load_credentials("team-b", env)
    assert (c.access_key, c.secret_key.get_secret_value()) == ("AKLTteamb0000001", "sk-b")
    with pytest.raises(ConfigError, match="VOLC_SECRETKEY_TEAM_C"):
        load_credentials("team-c", {"VOLC_ACCESSKEY_TEAM_C": "ak"})


def test_the_secret_key_never_shows_in_repr_str_errors_or_logs(
        fake: FakeVolcengine, caplog: pytest.LogCaptureFixture) -> None:
    """Neither reprs, strs, exception messages nor any log line (SDK debug included) carry
    the SK, on success and on failure."""
    secret = ACCOUNTS["acct-a"][1]
    caplog.set_level(logging.DEBUG)
    client = client_for(fake)
    client.list_resource_packages()
    fake.inject_billing_fault("auth")
    with pytest.raises(BillingAuthError) as failure:
        client.list_resource_packages()
    c = creds()
    shown = " ".join([repr(c), str(c), repr(client), str(failure.value), caplog.text,
                      repr(load_credentials("default", {"VOLC_ACCESSKEY": "AKLTdefault0001",
                                                       "VOLC_SECRETKEY": secret}))])
    assert "billing: account=acct-a" in caplog.text  # the log did run
    assert secret not in shown


def test_for_account_takes_endpoint_and_keys_from_the_environment(
        fake: FakeVolcengine, monkeypatch: pytest.MonkeyPatch) -> None:
    """BillingClient.for_account reads VQG_BILLING_ENDPOINT and the account's key pair."""
    ak, sk, _ = ACCOUNTS["acct-b"]
    monkeypatch.setenv("VQG_BILLING_ENDPOINT", fake.url)
    monkeypatch.setenv("VOLC_ACCESSKEY_ACCT_B", ak)
    monkeypatch.setenv("VOLC_SECRETKEY_ACCT_B", sk)
    client = BillingClient.for_account("acct-b", page_interval=0)
    assert client.list_resource_packages()
    assert fake.api_calls("acct-b") == 1
