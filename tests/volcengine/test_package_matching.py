"""Package → pool matching on real Ark names, noise, overrides, and LiteLLM config pools."""

from __future__ import annotations

import pytest

from volc_quota_guard.errors import ConfigError
from volc_quota_guard.fake import configuration_code_for
from volc_quota_guard.proxy.deployments import pools_from_model_list
from volc_quota_guard.volcengine.billing import ResourcePackage
from volc_quota_guard.volcengine.packages import (
    PackageRule,
    PoolSpec,
    assign,
    model_key,
    package_keys,
)


def pkg(code: str, available: int = 1000, *, no: str | None = None, unit: str = "Tokens",
        status: str = "Effective", product: str = "ark_bd", product_name: str = "火山方舟",
        name: str = "") -> ResourcePackage:
    return ResourcePackage(
        instance_no=no or f"P-{code}-{available}-{status}", product=product,
        product_name=product_name, configuration_code=code, configuration_name=name,
        unit=unit, total=max(available, 1), available=available, status=status,
        effective_ms=None, expires_ms=None)


FLASH = "acct/deepseek-v4-flash-ga-260731"
CODE = "acct/doubao-seed-2-0-code-preview-260215"
PRO = "acct/doubao-seed-2-0-pro-260215"
SEED3D = "acct/doubao-seed3d-1-0-250928"
RODIN = "acct/ym-rodin-gen2"


def test_real_configuration_codes_reach_their_models() -> None:
    """Real Ark codes map to the API model ids: suffix words stripped, '.'→'-', tags and
    date forms reconciled, and 'code' kept as part of the name."""
    packages = [
        pkg("DeepSeek_V4_flash_0731_data_collaboration_resource_pack"),
        pkg("Doubao_Seed_2.0_code_pack"),
        pkg("Doubao_Seed3D_1.0_pack_free_infer"),
        pkg("ym-rodin-gen2-free"),
    ]
    result = assign(packages, [FLASH, CODE, PRO, SEED3D, RODIN])
    assert [len(result.pools[p].packages) for p in (FLASH, CODE, PRO, SEED3D, RODIN)] == \
        [1, 1, 0, 1, 1]
    assert result.unmatched == ()


def test_model_keys_normalise_both_sides() -> None:
    """The reduced keys agree: deepseek-v4-flash + 0731 from both the code and the model id."""
    assert str(model_key("deepseek-v4-flash-ga-260731")) == "deepseek-v4-flash-0731"
    (key,) = package_keys(pkg("DeepSeek_V4_flash_0731_data_collaboration_resource_pack"))
    assert str(key) == "deepseek-v4-flash-0731"
    assert str(model_key("doubao-seed-2-0-code-preview-260215")) == "doubao-seed-2-0-code-0215"


def test_noise_is_never_counted() -> None:
    """A voice package (字符), a CDN package (GB), a non-Ark token package and a used-up one
    add nothing; each unmatched package says why."""
    noise = [
        pkg("Doubao_TTS_free_pack", 14018, unit="字符", product="speech_saas_prod",
            product_name="豆包语音"),
        pkg("CDN_mainland_500GB_1m_package", 321, unit="GB", product="CDN",
            product_name="内容分发网络"),
        pkg("deepseek_v4_flash_0731_pack", 5000, product="ml_platform",
            product_name="机器学习平台"),
        pkg("Doubao_Seed_2.0_code_pack", 0, status="UsedUp"),
        pkg("Doubao_Seed3D_1.0_pack_free_infer"),
    ]
    result = assign(noise, [FLASH, CODE])
    assert result.pools[FLASH].balance == 0
    assert result.pools[CODE].balance == 0
    assert [p.status for p in result.pools[CODE].packages] == ["UsedUp"]
    reasons = {u.package.configuration_code: u.reason for u in result.unmatched}
    assert "not tokens" in reasons["Doubao_TTS_free_pack"]
    assert "not tokens" in reasons["CDN_mainland_500GB_1m_package"]
    assert "not Ark" in reasons["deepseek_v4_flash_0731_pack"]
    assert "no pool for model doubao-seed3d-1-0" in reasons["Doubao_Seed3D_1.0_pack_free_infer"]


def test_many_packages_of_one_model_are_summed_over_effective_ones() -> None:
    """Free, paid and collaboration packages of one model add up; Expired/UsedUp do not."""
    packages = [
        pkg("DeepSeek_V4_flash_0731_data_collaboration_resource_pack", 1_534_211, no="a"),
        pkg("DeepSeek_V4_flash_0731_data_collaboration_resource_pack", 2_000_000, no="b"),
        pkg("DeepSeek_V4_flash_pack_free_inference", 500_000, no="c"),
        pkg("DeepSeek_V4_flash_0731_data_collaboration_resource_pack", 77, no="d",
            status="Expired"),
        pkg("DeepSeek-V4-flash", 10, no="e", status="UsedUp"),
    ]
    result = assign(packages, [FLASH])
    assert result.pools[FLASH].balance == 1_534_211 + 2_000_000 + 500_000
    assert len(result.pools[FLASH].packages) == 5
    assert len(result.pools[FLASH].effective) == 3
    assert result.pool_of("c") == FLASH


def test_unit_match_is_case_insensitive_and_scaled_units_are_refused() -> None:
    """'token', 'Tokens' and 'TOKENS' count; '千tokens' is not read as a token count."""
    packages = [pkg("DeepSeek_V4_flash_pack", 1, unit="token", no="1"),
                pkg("DeepSeek_V4_flash_pack", 2, unit="TOKENS", no="2"),
                pkg("DeepSeek_V4_flash_pack", 3, unit="千tokens", no="3")]
    result = assign(packages, [FLASH])
    assert result.pools[FLASH].balance == 3
    assert "plain token count" in result.unmatched[0].reason


def test_a_different_date_is_a_different_model() -> None:
    """A 0731 package does not count for the 0901 release of the same model."""
    result = assign([pkg("DeepSeek_V4_flash_0731_pack")], ["acct/deepseek-v4-flash-ga-260901"])
    assert result.pools["acct/deepseek-v4-flash-ga-260901"].packages == ()
    assert "no pool" in result.unmatched[0].reason


def test_an_exact_date_wins_and_a_tie_matches_nothing() -> None:
    """With two releases routed, a dated package goes to its own release; an undated one fits
    both and is left out (counting it twice would invent quota)."""
    pools = ["acct/deepseek-v4-flash-ga-260731", "acct/deepseek-v4-flash-ga-260901"]
    result = assign([pkg("DeepSeek_V4_flash_0901_pack", no="dated"),
                     pkg("DeepSeek_V4_flash_pack_free", no="undated")], pools)
    assert result.pool_of("dated") == pools[1]
    assert result.pool_of("undated") is None
    assert "several pools" in result.unmatched[0].reason


def test_the_configuration_name_is_a_fallback() -> None:
    """When the code says nothing useful, the English prefix of ConfigurationName is used."""
    result = assign([pkg("PKG_000123", name="DeepSeek-V4-flash 数据协作资源包")], [FLASH])
    assert result.pools[FLASH].balance == 1000


def test_an_explicit_code_list_takes_exactly_those_packages() -> None:
    """A pool with listed codes gets those packages — even of another product — and the
    name matcher no longer feeds it."""
    spec = PoolSpec("acct/ep-20260801-abcde",
                    PackageRule(codes=("Custom_Endpoint_Pack", "Other_Pack")))
    flash = PoolSpec(FLASH, PackageRule(codes=("Only_This",)))
    packages = [pkg("Custom_Endpoint_Pack", 10, product="x", product_name="y"),
                pkg("Other_Pack", 20), pkg("Unrelated_pack", 30),
                pkg("DeepSeek_V4_flash_0731_data_collaboration_resource_pack", 40)]
    result = assign(packages, [spec, flash])
    assert result.pools[spec.pool].balance == 30
    assert result.pools[FLASH].balance == 0
    reasons = [u.reason for u in result.unmatched]
    assert any("lists its packages explicitly" in r for r in reasons)


def test_a_regex_rule_must_match_the_whole_code() -> None:
    """A regex rule is a full match on ConfigurationCode."""
    spec = PoolSpec(FLASH, PackageRule(pattern=r"DeepSeek_V4_flash_.*"))
    result = assign([pkg("DeepSeek_V4_flash_0731_x"), pkg("xDeepSeek_V4_flash_0731")], [spec])
    assert result.pools[FLASH].balance == 1000
    assert len(result.unmatched) == 1


def test_a_package_listed_by_two_pools_goes_to_neither() -> None:
    """Overlapping explicit rules leave the package unmatched instead of double-counting."""
    a = PoolSpec("acct/m-a", PackageRule(pattern=".*"))
    b = PoolSpec("acct/m-b", PackageRule(codes=("X",)))
    result = assign([pkg("X")], [a, b])
    assert result.pools["acct/m-a"].balance == result.pools["acct/m-b"].balance == 0
    assert "several pools" in result.unmatched[0].reason


def test_the_fakes_return_packages_match_their_pool() -> None:
    """configuration_code_for(model) is read back to the same model by the default matcher."""
    for model in ("deepseek-v4-flash-ga-260731", "doubao-seed-2-1-pro-260628",
                  "doubao-seed-2-0-code-preview-260215", "kimi-k2-250905"):
        result = assign([pkg(configuration_code_for(model))], [f"acct/{model}"])
        assert result.pools[f"acct/{model}"].balance == 1000, model


def test_assign_refuses_pools_of_two_accounts() -> None:
    """Packages belong to one account, so pools of two accounts at once are a caller bug."""
    with pytest.raises(ValueError, match="one account"):
        assign([], ["a/m", "b/m"])


def test_pools_come_from_a_litellm_model_list() -> None:
    """volcengine/ deployments define pools (account from model_info.vqg_account, default
    'default'); other providers are ignored; vqg_packages sets a rule."""
    model_list = [
        {"model_name": "fast", "litellm_params": {"model": "volcengine/deepseek-v4-flash-ga-260731"}},
        {"model_name": "fast", "litellm_params": {"model": "volcengine/deepseek-v4-flash-ga-260731"},
         "model_info": {"vqg_account": "team-b", "vqg_packages": ["A_pack", "B_pack"]}},
        {"model_name": "ep", "litellm_params": {"model": "volcengine/ep-2026-x"},
         "model_info": {"vqg_packages": {"regex": "EP_.*"}}},
        {"model_name": "gpt", "litellm_params": {"model": "openai/gpt-4o"}},
    ]
    specs = {s.pool: s for s in pools_from_model_list(model_list)}
    assert set(specs) == {"default/deepseek-v4-flash-ga-260731",
                          "team-b/deepseek-v4-flash-ga-260731", "default/ep-2026-x"}
    assert specs["team-b/deepseek-v4-flash-ga-260731"].rule == PackageRule(
        codes=("A_pack", "B_pack"))
    assert specs["default/ep-2026-x"].rule == PackageRule(pattern="EP_.*")
    assert specs["default/deepseek-v4-flash-ga-260731"].rule is None


def test_disagreeing_rules_for_one_pool_are_a_config_error() -> None:
    """Two deployments of one pool with different vqg_packages stop startup."""
    dep = {"litellm_params": {"model": "volcengine/m"}}
    with pytest.raises(ConfigError, match="disagree"):
        pools_from_model_list([dep | {"model_info": {"vqg_packages": ["A"]}},
                               dep | {"model_info": {"vqg_packages": ["B"]}}])
    with pytest.raises(ConfigError):
        PackageRule.parse({"codes": "A_pack"})


def test_a_bad_counting_method_stops_startup_and_mixed_methods_share_a_pool() -> None:
    """Each reservation carries its counting class, so deployments of one pool may count two
    ways (one pool, not two); a bad vqg_tokenizer stops startup."""
    def dep(model: str, **info: object) -> dict[str, object]:
        return {"litellm_params": {"model": f"volcengine/{model}"}, "model_info": info}

    specs = [s.pool for s in pools_from_model_list([
        dep("deepseek-v4-flash-ga-260731"), dep("doubao-seed-2-1-pro-260628"),
        dep("ep-2026-y", vqg_tokenizer="deepseek"), dep("deepseek-v3-2", vqg_account="b"),
        dep("deepseek-v3-2", vqg_account="b", vqg_tokenizer="cl100k")])]
    assert specs == ["b/deepseek-v3-2", "default/deepseek-v4-flash-ga-260731",
                     "default/doubao-seed-2-1-pro-260628", "default/ep-2026-y"]
    with pytest.raises(ConfigError, match="vqg_tokenizer"):
        pools_from_model_list([dep("deepseek-v4", vqg_tokenizer="gpt2")])
