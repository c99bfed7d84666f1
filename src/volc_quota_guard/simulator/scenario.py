"""The scenario file (docs/simulator.md, format v1): a pydantic model and a line-aware loader.

Unknown keys, duplicate keys and bad values are errors whose message names the file and line,
because a typo that silently changes a scenario would silently change its verdict. The YAML is
composed into nodes (which keep their line) and converted by hand: an unquoted `10:30` stays the
string "10:30" (YAML 1.1 would read it as the base-60 integer 630) and an unquoted ISO time stays
a string, parsed here with its offset required.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from ..clock import BEIJING_OFFSET_MS, MS_PER_DAY, beijing_day
from ..errors import ConfigError

Loc = tuple[str | int, ...]


class ScenarioError(ConfigError):
    """A scenario file is unreadable or invalid; the message names the file and line."""


# ---------------------------------------------------------------------- value types


def parse_time_of_day(value: object, *, allow_24: bool = False) -> int:
    """``"HH:MM"`` or ``"HH:MM:SS"`` (Beijing time) → ms after midnight; ``"24:00"`` if allowed."""
    if not isinstance(value, str):
        raise ValueError(f"bad time of day {value!r}: expected a quoted \"HH:MM\"")
    parts = value.strip().split(":")
    ok = len(parts) in (2, 3) and all(p.isdigit() and len(p) == 2 for p in parts[1:]) \
        and parts[0].isdigit() and 1 <= len(parts[0]) <= 2
    if ok:
        h, m, s = (int(p) for p in (parts + ["0"])[:3])
        if (h < 24 and m < 60 and s < 60) or (allow_24 and (h, m, s) == (24, 0, 0)):
            return ((h * 60 + m) * 60 + s) * 1000
    raise ValueError(f"bad time of day {value!r}: expected \"HH:MM\" from 00:00 to 23:59"
                     + (" (or 24:00)" if allow_24 else ""))


def parse_instant(value: object) -> datetime:
    """ISO 8601 with an explicit offset (``2026-08-13T00:00:00+08:00``) → aware datetime."""
    if isinstance(value, datetime):
        raw = value.isoformat()
    elif isinstance(value, str):
        raw = value.strip()
    else:
        raise ValueError(f"bad time {value!r}: expected ISO 8601 like 2026-08-13T00:00:00+08:00")
    try:
        dt = datetime.fromisoformat(raw.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"bad time {value!r}: expected ISO 8601 like 2026-08-13T00:00:00+08:00") from None
    if dt.tzinfo is None:
        raise ValueError(f"time {value!r} needs an offset, e.g. +08:00")
    return dt


TimeOfDay = Annotated[int, BeforeValidator(parse_time_of_day)]
EndOfSpan = Annotated[int, BeforeValidator(lambda v: parse_time_of_day(v, allow_24=True))]
Instant = Annotated[datetime, BeforeValidator(parse_instant)]
Tokens = Annotated[int, Field(strict=True, ge=0, le=10**13)]
RequestTokens = Annotated[int, Field(strict=True, ge=0, le=50_000_000)]  # the gate takes ≤ 100M


def to_ms(dt: datetime) -> int:
    return int(dt.timestamp() * 1000)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class PackageSpec(_Strict):
    """A free package the pool holds at the start (or acquires later, if `acquired` is ahead)."""

    amount: Annotated[int, Field(strict=True, ge=1, le=10**13)]
    acquired: Instant
    expires: Instant | None = None  # default: 30 days after acquired

    @model_validator(mode="after")
    def _expires_after_acquired(self) -> PackageSpec:
        if self.expires is not None and self.expires <= self.acquired:
            raise ValueError("expires must be after acquired")
        return self


class PriorUsage(_Strict):
    """Usage on the account the guard never saw: consumed on Ark straight (the old setup) in
    the `minutes` before the run starts, spread evenly (0 = all of it just before the start)."""

    tokens: Annotated[int, Field(strict=True, ge=1, le=10**12)]
    minutes: Annotated[float, Field(strict=True, ge=0, le=1440)] = 0


class LagChange(_Strict):
    """From `at` on (Beijing time of day, day `day` of the run) the balance API settles
    `minutes` behind: an incident at Volcengine (longer) or its end (shorter). What the API
    showed already stays shown."""

    at: TimeOfDay
    day: Annotated[int, Field(strict=True, ge=1, le=400)] = 1
    minutes: Annotated[float, Field(strict=True, ge=0, le=1440)]


class TrafficLine(_Strict):
    """One stream of requests: steady (`from`/`to`/`every_seconds`) or single (`at`)."""

    from_: TimeOfDay | None = Field(default=None, alias="from")
    to: EndOfSpan | None = None
    every_seconds: Annotated[float, Field(strict=True, gt=0, le=86_400)] | None = None
    at: TimeOfDay | None = None
    concurrency: Annotated[int, Field(strict=True, ge=1, le=1000)] = 1
    prompt: RequestTokens
    completion: RequestTokens
    max_tokens: Annotated[int, Field(strict=True, ge=1, le=10_000_000)] | None = None
    estimate_ratio: Annotated[float, Field(strict=True, gt=0, le=100)] = 1.0
    duration_seconds: Annotated[float, Field(strict=True, ge=0, le=86_400)] = 20
    usage: Literal["missing"] | None = None
    day: Annotated[int, Field(strict=True, ge=1)] | None = None
    n: Annotated[int, Field(strict=True, ge=1, le=16)] = 1  # choices: each makes its own output
    reasoning: RequestTokens = 0  # per choice while thinking is on; max_tokens does not cap it
    thinking: bool = True  # False: the request switches deep thinking off
    # exact: the guard's count is an exact one (a DeepSeek deployment's tokenizer), reserved in
    # the gate's exact class; `estimate_ratio` is its drift. ark-api: a Doubao deployment's, the
    # cheap count (`estimate_ratio`) and, for a big prompt or one refused at a wall, Ark's
    # tokenization API's exact count (`exact_ratio`: its drift) reserved in the exact class.
    counting: Literal["cheap", "exact", "ark-api"] = "cheap"
    exact_ratio: Annotated[float, Field(strict=True, gt=0, le=100)] = 1.0
    # The client (or LiteLLM's timeout) gives up on each request this long after it started;
    # Ark, never told to stop, runs it for `duration_seconds` and bills it then (stop 35).
    gives_up_after_seconds: Annotated[float, Field(strict=True, gt=0, le=86_400)] | None = None

    @property
    def billed_prompt(self) -> int:
        """Prompt tokens Ark bills: each of `n` choices reads the prompt (the dearer reading)."""
        return self.prompt * self.n

    def made(self, cap: int | None, caps_total: bool) -> int:
        """Output tokens Ark produces for this line under `cap` (per choice; answer-only or total)."""
        think = self.reasoning if self.thinking else 0
        if cap is None:
            return self.n * (think + self.completion)
        if caps_total:  # max_completion_tokens: reasoning first, the answer gets the rest
            return self.n * min(think + self.completion, cap)
        return self.n * (think + min(self.completion, cap))  # max_tokens bounds the answer only

    @model_validator(mode="after")
    def _one_shape(self) -> TrafficLine:
        steady = (self.from_, self.to, self.every_seconds)
        if self.at is not None:
            if any(v is not None for v in steady):
                raise ValueError("a line has either `at` or `from`/`to`/`every_seconds`, not both")
        elif any(v is None for v in steady):
            missing = [n for n, v in zip(("from", "to", "every_seconds"), steady, strict=True) if v is None]
            raise ValueError("a steady line needs `from`, `to` and `every_seconds` "
                             f"(missing: {', '.join(missing)}); a single request needs `at`")
        if self.prompt + self.completion == 0:
            raise ValueError("a request consumes at least one token (prompt + completion > 0)")
        if "exact_ratio" in self.model_fields_set and self.counting != "ark-api":
            raise ValueError("`exact_ratio` is the tokenization API's drift: only for `counting: ark-api`")
        return self

    @property
    def single(self) -> bool:
        return self.at is not None

    def estimate(self) -> int:
        """The guard's tokenizer estimate of the prompt (`estimate_ratio` × true prompt tokens)."""
        return max(1, math.ceil(self.prompt * self.estimate_ratio - 1e-9))

    def exact_estimate(self) -> int:
        """Ark's tokenization API's count of the prompt, template allowance included (ark-api)."""
        return max(1, math.ceil(self.prompt * self.exact_ratio - 1e-9))


class Scenario(_Strict):
    """One pool's Volcengine side and traffic over whole days (docs/simulator.md, format v1)."""

    version: Literal[1]
    name: Annotated[str, Field(min_length=1, max_length=200)]
    start: Instant
    days: Annotated[int, Field(strict=True, ge=1, le=400)]
    daily_cap: Annotated[int, Field(strict=True, ge=1, le=10**12)] = 2_000_000
    settlement_lag_minutes: Annotated[float, Field(strict=True, ge=0, le=1440)] = 14
    sync_interval_minutes: Annotated[int, Field(strict=True, ge=1, le=1440)] = 30
    small_buffer: Annotated[int, Field(strict=True, ge=0, le=10**9)] = 50_000
    return_at: TimeOfDay | None = parse_time_of_day("10:30")
    yesterday_collection: Tokens = 0
    packages: list[PackageSpec] = Field(default_factory=list)
    traffic: list[TrafficLine] = Field(default_factory=list)
    # Additions to v1 (a file without them is the same scenario as before):
    prior_usage: PriorUsage | None = None
    model_reasoning_tokens: Tokens = 0  # the deployment's vqg_reasoning_tokens (0: no thinking)
    wipe_at: TimeOfDay | None = None  # the guard's store loses all its data at this time, day 1
    # The proxy process dies at this time, day 1: the calls it has in flight run on at Ark to
    # their end, never settled and no longer renewed; a new process serves what comes after.
    crash_at: TimeOfDay | None = None
    lag_changes: list[LagChange] = Field(default_factory=list)  # the API's lag moves mid-run
    # The guard's VQG_UNSEEN_DAY_TOKENS (None: its default): what the operator says may have run
    # unseen before a first start.
    unseen_day_tokens: Tokens | None = None

    @model_validator(mode="after")
    def _lines_fit_the_run(self) -> Scenario:
        for key, at in (("wipe_at", self.wipe_ms), ("crash_at", self.crash_ms)):
            if at is not None and not self.start_ms < at < self.end_ms:
                raise _LineError((key,), f"the {key[:-3]} is not inside the run (day 1, after the start)")
        for i, change in enumerate(self.lag_changes):
            if not self.start_ms <= self.request_ms(change.day, change.at) < self.end_ms:
                raise _LineError(("lag_changes", i, "at"), "this lag change is not inside the run")
        for i, line in enumerate(self.traffic):
            if line.day is not None and line.day > self.calendar_days:
                raise _LineError(("traffic", i, "day"),
                                 f"day {line.day} is after the run's last day ({self.calendar_days})")
            if line.single and self.request_ms(line.day or 1, line.at or 0) < self.start_ms:
                raise _LineError(("traffic", i, "at"), "this request is before the scenario's start")
        return self

    def lag_schedule(self) -> list[tuple[int, float]]:
        """(ms, lag minutes) of each lag change, in time order."""
        return sorted((self.request_ms(c.day, c.at), c.minutes) for c in self.lag_changes)

    @property
    def wipe_ms(self) -> int | None:
        return None if self.wipe_at is None else self.request_ms(1, self.wipe_at)

    @property
    def crash_ms(self) -> int | None:
        return None if self.crash_at is None else self.request_ms(1, self.crash_at)

    @property
    def start_ms(self) -> int:
        return to_ms(self.start)

    @property
    def end_ms(self) -> int:
        return self.start_ms + self.days * MS_PER_DAY

    @property
    def calendar_days(self) -> int:
        """Beijing days the run touches (one more than `days` when it starts after midnight)."""
        return beijing_day(self.end_ms - 1) - beijing_day(self.start_ms) + 1

    def day_start_ms(self, day: int) -> int:
        """Beijing midnight opening the 1-based scenario `day`."""
        return (beijing_day(self.start_ms) + day - 1) * MS_PER_DAY - BEIJING_OFFSET_MS

    def request_ms(self, day: int, time_of_day_ms: int) -> int:
        return self.day_start_ms(day) + time_of_day_ms


class _LineError(ValueError):
    """A scenario-level check that blames one place in the file."""

    def __init__(self, loc: Loc, message: str) -> None:
        super().__init__(message)
        self.loc = loc


# ---------------------------------------------------------------------- traffic


@dataclass(frozen=True)
class Arrival:
    """When requests of one traffic line start, and how many start together."""

    at_ms: int
    line: int  # index in Scenario.traffic
    count: int


def arrivals(s: Scenario) -> Iterator[Arrival]:
    """Every arrival of the run, in time order (lines in file order at equal times)."""
    found: list[Arrival] = []
    start, end = s.start_ms, s.end_ms
    for i, line in enumerate(s.traffic):
        # A one-off (`at`) runs on day 1 unless `day` says otherwise (SCENARIOS.md), a stream on
        # every day; either only inside the run.
        days = [line.day] if line.day is not None else [1] if line.at is not None \
            else range(1, s.calendar_days + 1)
        for day in days:
            if line.at is not None:
                if start <= (t := s.request_ms(day, line.at)) < end:
                    found.append(Arrival(t, i, line.concurrency))
                continue
            assert line.from_ is not None and line.to is not None and line.every_seconds
            t0 = s.request_ms(day, line.from_)
            stop = s.request_ms(day, line.to)
            if stop <= t0:
                stop += MS_PER_DAY  # the stream runs across midnight
            step = line.every_seconds * 1000
            k = 0
            while (t := t0 + round(k * step)) < stop:
                if start <= t < end:
                    found.append(Arrival(t, i, line.concurrency))
                k += 1
    found.sort(key=lambda a: (a.at_ms, a.line))
    yield from found


# ---------------------------------------------------------------------- loading


class _Loader(yaml.SafeLoader):
    """Composes nodes only; conversion is ours (`_convert`)."""


_RAW_TAGS = {"tag:yaml.org,2002:timestamp"}


def _convert(loader: _Loader, node: yaml.Node, loc: Loc, lines: dict[Loc, int], where: str) -> Any:
    lines.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)  # `<<` merge keys
        out: dict[str, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise ScenarioError(f"{where}:{key_node.start_mark.line + 1}: a key must be a plain name")
            key = key_node.value
            if key in out:
                raise ScenarioError(f"{where}:{key_node.start_mark.line + 1}: "
                                    f"{_dotted((*loc, key))}: duplicate key")
            lines[(*loc, key)] = key_node.start_mark.line + 1
            out[key] = _convert(loader, value_node, (*loc, key), lines, where)
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_convert(loader, item, (*loc, i), lines, where) for i, item in enumerate(node.value)]
    assert isinstance(node, yaml.ScalarNode)
    if node.tag in _RAW_TAGS or (":" in node.value and node.tag in (
            "tag:yaml.org,2002:int", "tag:yaml.org,2002:float")):
        return node.value  # times stay text; base-60 numbers (10:30) too
    return loader.construct_object(node, deep=True)


def _dotted(loc: Loc) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top)"


def _line_of(loc: Loc, lines: dict[Loc, int]) -> int:
    for n in range(len(loc), -1, -1):
        if loc[:n] in lines:
            return lines[loc[:n]]
    return 1


_MESSAGES = {
    "extra_forbidden": "unknown key",
    "missing": "required key is missing",
}


def parse_scenario(text: str, where: str = "<scenario>") -> Scenario:
    """A scenario from YAML text; ScenarioError naming `where` and the line on any problem."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = f":{mark.line + 1}" if mark else ""
        raise ScenarioError(f"{where}{line}: not valid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ScenarioError(f"{where}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    if node is None:
        raise ScenarioError(f"{where}: empty scenario")
    lines: dict[Loc, int] = {}
    data = _convert(loader, node, (), lines, where)
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}:1: a scenario is a mapping of keys (version, name, start, …)")
    try:
        return Scenario.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            loc: Loc = tuple(err["loc"])
            if isinstance(err.get("ctx", {}).get("error"), _LineError):
                loc = err["ctx"]["error"].loc
            msg = _MESSAGES.get(err["type"], err["msg"].removeprefix("Value error, "))
            problems.append(f"{where}:{_line_of(loc, lines)}: {_dotted(loc)}: {msg}")
        raise ScenarioError("\n".join(problems)) from None


def builtin_dir() -> Any:
    return resources.files("volc_quota_guard").joinpath("scenarios")


def builtin_names() -> list[str]:
    """Names of the scenarios shipped with the package (file names without `.yaml`)."""
    return sorted(p.name.removesuffix(".yaml") for p in builtin_dir().iterdir()
                  if p.name.endswith(".yaml"))


def scenario_text(ref: str) -> tuple[str, str]:
    """(YAML text, where) of a scenario file path or a shipped scenario's name."""
    path = Path(ref)
    if path.suffix in (".yaml", ".yml") or path.exists():
        try:
            return path.read_text(encoding="utf-8"), str(path)
        except OSError as exc:
            raise ScenarioError(f"cannot read scenario {ref}: {exc.strerror or exc}") from None
    found = builtin_dir().joinpath(f"{ref}.yaml")
    if not found.is_file():
        names = ", ".join(builtin_names())
        raise ScenarioError(f"no scenario file or shipped scenario named {ref!r} (shipped: {names})")
    return found.read_text(encoding="utf-8"), f"{ref}.yaml"


def load_scenario(ref: str) -> Scenario:
    """A scenario from a file path or a shipped name (`seed-0813-lag`)."""
    text, where = scenario_text(ref)
    return parse_scenario(text, where)


def description(ref: str) -> str:
    """The scenario file's leading comment block, joined into one paragraph (for docs)."""
    text, _ = scenario_text(ref)
    out = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line.startswith("#"):
            break
        out.append(line.lstrip("#").strip())
    return " ".join(w for w in out if w)
