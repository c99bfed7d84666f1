"""Which resource packages belong to which pool.

The billing API has no model field: the model is only in ``ConfigurationCode`` (e.g.
``DeepSeek_V4_flash_0731_data_collaboration_resource_pack``) and ``ConfigurationName``.
The default matcher reduces both sides to a key — lower case, ``.``/``_`` → ``-``, the tags
``ga/preview/latest/beta`` dropped, package-type suffix words (``data collaboration resource
pack free inference infer``) stripped from the end (``code`` is part of a name), a trailing
date ``YYMMDD`` read as ``MMDD`` — and matches equal names whose dates agree (a side with no
date matches any date; an exact date wins). A pool may list its packages explicitly instead
(ConfigurationCodes or a regex); then the default matcher leaves that pool alone.

Money-safety: only token units count, only Effective packages add balance, a package that
could go to two pools goes to none (counting it twice would invent quota), and a package of
a non-Ark product is never matched by name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..errors import ConfigError
from ..gate.keys import validate_pool
from .billing import ResourcePackage

IGNORED_TAGS = frozenset({"ga", "preview", "latest", "beta"})
SUFFIX_WORDS = frozenset({"data", "collaboration", "resource", "pack", "package", "free",
                          "inference", "infer"})
_ARK_NAME_HINTS = ("方舟", "doubao", "豆包", "大模型")
_SCALED_UNIT_RE = re.compile(r"(千|万|百万|\bk|\bm)\s*tokens?", re.IGNORECASE)
_DATE6_RE = re.compile(r"^\d{2}(0[1-9]|1[0-2])(0[1-9]|[12]\d|3[01])$")
_DATE4_RE = re.compile(r"^(0[1-9]|1[0-2])(0[1-9]|[12]\d|3[01])$")
_NAME_PREFIX_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*")


@dataclass(frozen=True)
class ModelKey:
    """A model name reduced for matching: ``deepseek-v4-flash`` + date ``0731``."""

    base: str
    date: str | None

    def __str__(self) -> str:
        return self.base if self.date is None else f"{self.base}-{self.date}"


def _key(words: list[str]) -> ModelKey | None:
    words = [w for w in words if w and w not in IGNORED_TAGS]
    date = None
    if words and (_DATE6_RE.match(words[-1]) or _DATE4_RE.match(words[-1])):
        date = words.pop()[-4:]
    return ModelKey("-".join(words), date) if words else None


def _words(text: str) -> list[str]:
    return re.split(r"[-_.\s]+", text.strip().lower())


def model_key(model: str) -> ModelKey | None:
    """The key of an upstream model id: ``deepseek-v4-flash-ga-260731`` → deepseek-v4-flash 0731."""
    return _key(_words(model))


def package_keys(pkg: ResourcePackage) -> list[ModelKey]:
    """Candidate keys of a package: from ConfigurationCode, then ConfigurationName's prefix."""
    keys = []
    for text in (pkg.configuration_code, _name_prefix(pkg.configuration_name)):
        words = _words(text)
        while words and words[-1] in SUFFIX_WORDS | {""}:
            words.pop()
        key = _key(words)
        if key is not None and key not in keys:
            keys.append(key)
    return keys


def _name_prefix(name: str) -> str:
    m = _NAME_PREFIX_RE.match(name.strip())
    return m.group(0) if m else ""


def is_ark_product(pkg: ResourcePackage) -> bool:
    name = pkg.product_name.lower()
    return "ark" in pkg.product.lower() or any(h in name for h in _ARK_NAME_HINTS)


@dataclass(frozen=True)
class PackageRule:
    """An explicit per-pool package list: exact ConfigurationCodes and/or a regex that must
    match a whole ConfigurationCode."""

    codes: tuple[str, ...] = ()
    pattern: str | None = None

    def __post_init__(self) -> None:
        if not self.codes and not self.pattern:
            raise ConfigError("a package rule needs codes or a regex")
        if self.pattern:
            try:
                re.compile(self.pattern)
            except re.error as exc:
                raise ConfigError(f"bad package regex {self.pattern!r}: {exc}") from None

    def matches(self, pkg: ResourcePackage) -> bool:
        code = pkg.configuration_code
        return code in self.codes or bool(self.pattern and re.fullmatch(self.pattern, code))

    @classmethod
    def parse(cls, value: Any) -> PackageRule:
        """From config: a list of codes, a regex string, or ``{codes: [...], regex: "..."}``."""
        if isinstance(value, str):
            return cls(pattern=value)
        if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
            return cls(codes=tuple(value))
        if isinstance(value, Mapping) and set(value) <= {"codes", "regex"}:
            codes = value.get("codes") or ()
            if isinstance(codes, str) or not all(isinstance(c, str) for c in codes):
                raise ConfigError("vqg_packages.codes must be a list of strings")
            return cls(codes=tuple(codes), pattern=value.get("regex"))
        raise ConfigError(
            f"vqg_packages must be a list of ConfigurationCodes, a regex, or "
            f"{{codes, regex}}; got {value!r}")


@dataclass(frozen=True)
class PoolSpec:
    """A pool to match packages against, with its optional explicit rule."""

    pool: str
    rule: PackageRule | None = None

    def __post_init__(self) -> None:
        validate_pool(self.pool)

    @property
    def account(self) -> str:
        return self.pool.split("/", 1)[0]

    @property
    def model(self) -> str:
        return self.pool.split("/", 1)[1]


@dataclass(frozen=True)
class PoolAssignment:
    pool: str
    packages: tuple[ResourcePackage, ...]  # every matched token package, any status
    balance: int  # sum of AvailableAmount over the Effective ones

    @property
    def effective(self) -> tuple[ResourcePackage, ...]:
        return tuple(p for p in self.packages if p.is_effective)


@dataclass(frozen=True)
class Unmatched:
    package: ResourcePackage
    reason: str


@dataclass(frozen=True)
class Assignment:
    pools: dict[str, PoolAssignment]  # every requested pool, matched or not
    unmatched: tuple[Unmatched, ...] = field(default=())

    def pool_of(self, instance_no: str) -> str | None:
        for a in self.pools.values():
            if any(p.instance_no == instance_no for p in a.packages):
                return a.pool
        return None


def _default_match(pkg: ResourcePackage, specs: list[PoolSpec],
                   ruled: list[PoolSpec]) -> tuple[PoolSpec | None, str]:
    keys = package_keys(pkg)
    if not keys:
        return None, "no model name in ConfigurationCode/ConfigurationName"
    for key in keys:
        fits = []
        for spec in specs:
            mkey = model_key(spec.model)
            if mkey is None or mkey.base != key.base:
                continue
            if key.date is None or mkey.date is None or key.date == mkey.date:
                fits.append((spec, key.date is not None and key.date == mkey.date))
        exact = [s for s, same_date in fits if same_date]
        chosen = exact if exact else [s for s, _ in fits]
        if len(chosen) == 1:
            return chosen[0], ""
        if len(chosen) > 1:
            names = ", ".join(s.pool for s in chosen)
            return None, f"model {key} fits several pools ({names}); list packages explicitly"
    shadow = [s.pool for s in ruled if (k := model_key(s.model)) is not None
              and any(k.base == key.base for key in keys)]
    if shadow:
        return None, f"model {keys[0]} is {', '.join(shadow)}, which lists its packages explicitly"
    return None, f"no pool for model {keys[0]}"


def assign(packages: Iterable[ResourcePackage],
           pools: Iterable[PoolSpec | str]) -> Assignment:
    """Assign one account's packages to that account's pools."""
    specs = [p if isinstance(p, PoolSpec) else PoolSpec(p) for p in pools]
    if len({s.account for s in specs}) > 1:
        raise ValueError("assign() takes the pools of one account at a time")
    ruled = [s for s in specs if s.rule is not None]
    by_name = [s for s in specs if s.rule is None]
    matched: dict[str, list[ResourcePackage]] = {s.pool: [] for s in specs}
    unmatched: list[Unmatched] = []
    for pkg in packages:
        if not pkg.is_token_unit:
            unmatched.append(Unmatched(pkg, f"unit {pkg.unit!r} is not tokens"))
            continue
        if _SCALED_UNIT_RE.search(pkg.unit):
            unmatched.append(Unmatched(pkg, f"unit {pkg.unit!r} is not a plain token count"))
            continue
        explicit = [s for s in ruled if s.rule is not None and s.rule.matches(pkg)]
        if len(explicit) > 1:
            names = ", ".join(s.pool for s in explicit)
            unmatched.append(Unmatched(pkg, f"listed by several pools ({names})"))
            continue
        if explicit:
            matched[explicit[0].pool].append(pkg)
            continue
        if not is_ark_product(pkg):
            unmatched.append(Unmatched(pkg, f"product {pkg.product!r} is not Ark"))
            continue
        spec, reason = _default_match(pkg, by_name, ruled)
        if spec is None:
            unmatched.append(Unmatched(pkg, reason))
        else:
            matched[spec.pool].append(pkg)
    return Assignment(
        pools={
            pool: PoolAssignment(
                pool=pool,
                packages=tuple(pkgs),
                balance=sum(p.available for p in pkgs if p.is_effective),
            )
            for pool, pkgs in matched.items()
        },
        unmatched=tuple(unmatched),
    )
