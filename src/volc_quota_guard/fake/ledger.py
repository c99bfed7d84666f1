"""The Volcengine free-quota rules (docs/volcengine.md §4) as a pure, deterministic ledger.

No I/O and no clock: every call takes ``now_ms``. Time may only move forward (a ValueError
says who went back). The ledger advances lazily: a call first applies, in time order, the
events due up to ``now_ms`` of the pool it touches (return packages arriving, packages
expiring), then does its own work. A pool's next event time is cached, so a call with nothing
due costs a comparison — the simulator makes tens of thousands of them.

Rules, per pool (``"account/model"``):

- Packages are drawn FIFO by acquisition time. A package is usable while
  ``acquired_ms <= now < expires_ms``; at ``expires_ms`` its remainder is *expired*.
- A consumption beyond the true free balance is *billed*.
- Every consumed token (billed ones too) counts toward the Beijing day's collection, up to
  ``daily_cap``; the part past the cap is *burned*.
- At ``return_at`` (Beijing time) on the next day, a day's collection arrives as a new package
  that expires ``expiry_days`` later.
- The API view lags: consumption at ``t`` shows in ``api_view`` only once
  ``t <= now - lag``. Arrivals and expiries show at once, so during the lag window
  ``api available = true available + unsettled draws`` for each live package.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

from ..clock import BEIJING_OFFSET_MS, MS_PER_DAY, beijing_day

_DATE6_RE = re.compile(r"^\d{2}(\d{4})$")
_IGNORED_TAGS = frozenset({"ga", "preview", "latest", "beta"})

ARK_PRODUCT = "ark_bd"
ARK_PRODUCT_NAME = "火山方舟"


@dataclass(frozen=True)
class LedgerPackage:
    """One package as a reader sees it (true state or the lagged API view)."""

    pool: str
    instance_no: str
    configuration_code: str
    configuration_name: str
    product: str
    product_name: str
    unit: str
    total: int
    available: int
    acquired_ms: int
    expires_ms: int
    status: str  # Effective | UsedUp | Expired


@dataclass(frozen=True)
class Consumption:
    """What one ``consume`` did."""

    tokens: int
    free: int  # drawn from packages
    billed: int
    burned: int
    day: int  # Beijing day index


@dataclass(frozen=True)
class PoolTotals:
    pool: str
    now_ms: int
    true_balance: int
    api_balance: int
    consumed: int  # lifetime
    billed: int
    burned: int
    expired: int
    collected_today: int
    collected: dict[int, int]  # Beijing day index -> collected (<= cap)


@dataclass
class _Package:
    instance_no: str
    seq: int
    total: int
    available: int
    acquired_ms: int
    expires_ms: int
    configuration_code: str
    configuration_name: str
    product: str
    product_name: str
    unit: str
    expired: bool = False


@dataclass
class _Pool:
    name: str
    configuration_code: str
    configuration_name: str
    packages: list[_Package] = field(default_factory=list)  # kept sorted FIFO
    collected: dict[int, int] = field(default_factory=dict)
    returned_days: set[int] = field(default_factory=set)
    unsettled: deque[tuple[int, str, int]] = field(default_factory=deque)  # (t, instance, n)
    unsettled_by_pkg: dict[str, int] = field(default_factory=dict)
    consumed: int = 0
    billed: int = 0
    burned: int = 0
    expired: int = 0
    next_event_ms: int | None = None


def configuration_code_for(model: str) -> str:
    """A ConfigurationCode in Ark's style for an upstream model id.

    ``deepseek-v4-flash-ga-260731`` → ``deepseek_v4_flash_0731_data_collaboration_resource_pack``,
    which the default matcher in ``packages.py`` maps back to the model.
    """
    parts = [p for p in re.split(r"[-_.\s]+", model.lower()) if p and p not in _IGNORED_TAGS]
    if parts and (m := _DATE6_RE.match(parts[-1])):
        parts[-1] = m.group(1)
    return "_".join(parts + ["data", "collaboration", "resource", "pack"])


def parse_time_of_day(text: str) -> int:
    """``"HH:MM"`` → milliseconds after midnight."""
    m = re.fullmatch(r"(\d{1,2}):(\d{2})", text.strip())
    if not m or int(m.group(1)) > 23 or int(m.group(2)) > 59:
        raise ValueError(f"bad time of day {text!r}: expected HH:MM")
    return (int(m.group(1)) * 60 + int(m.group(2))) * 60_000


class Ledger:
    """Free token packages, consumption, collection and billing for any number of pools."""

    def __init__(
        self,
        *,
        daily_cap: int = 2_000_000,
        return_at: str | None = "10:30",
        lag_minutes: float = 14,
        expiry_days: int = 30,
        first_instance: int = 7_500_000_000_000_000_000,
    ) -> None:
        if daily_cap < 0 or expiry_days < 1 or lag_minutes < 0:
            raise ValueError("daily_cap >= 0, expiry_days >= 1 and lag_minutes >= 0 are required")
        self.daily_cap = daily_cap
        self.return_offset_ms = None if return_at is None else parse_time_of_day(return_at)
        self.lag_ms = int(lag_minutes * 60_000)
        self.expiry_ms = expiry_days * MS_PER_DAY
        self._pools: dict[str, _Pool] = {}
        self._next_instance = first_instance
        self._seq = 0
        self._now = -(2**62)

    # ------------------------------------------------------------------ setup

    def ensure_pool(
        self,
        pool: str,
        *,
        configuration_code: str | None = None,
        configuration_name: str | None = None,
    ) -> None:
        """Create a pool (no packages) unless it exists; set its return packages' names."""
        state = self._pools.get(pool)
        if state is None:
            model = pool.split("/", 1)[-1]
            state = _Pool(
                name=pool,
                configuration_code=configuration_code or configuration_code_for(model),
                configuration_name=configuration_name or f"{model} 数据协作资源包",
            )
            self._pools[pool] = state
        else:
            state.configuration_code = configuration_code or state.configuration_code
            state.configuration_name = configuration_name or state.configuration_name

    def pools(self) -> list[str]:
        return sorted(self._pools)

    def add_package(
        self,
        pool: str,
        amount: int,
        acquired_ms: int,
        *,
        expires_ms: int | None = None,
        available: int | None = None,
        configuration_code: str | None = None,
        configuration_name: str | None = None,
        product: str = ARK_PRODUCT,
        product_name: str = ARK_PRODUCT_NAME,
        unit: str = "Tokens",
        instance_no: str | None = None,
    ) -> str:
        """Add a package; it is usable from ``acquired_ms`` (the past or the future) on.

        Returns its InstanceNo. ``expires_ms`` defaults to ``expiry_days`` after acquisition.
        """
        self.ensure_pool(pool)
        state = self._pools[pool]
        available = amount if available is None else available
        if amount < 0 or not 0 <= available <= amount:
            raise ValueError("need 0 <= available <= amount")
        if instance_no is None:
            instance_no = f"PackageProduct{self._next_instance}"
            self._next_instance += 1
        elif any(p.instance_no == instance_no for s in self._pools.values() for p in s.packages):
            raise ValueError(f"duplicate InstanceNo {instance_no}")
        self._seq += 1
        pkg = _Package(
            instance_no=instance_no,
            seq=self._seq,
            total=amount,
            available=available,
            acquired_ms=acquired_ms,
            expires_ms=acquired_ms + self.expiry_ms if expires_ms is None else expires_ms,
            configuration_code=configuration_code or state.configuration_code,
            configuration_name=configuration_name or state.configuration_name,
            product=product,
            product_name=product_name,
            unit=unit,
        )
        state.packages.append(pkg)
        state.packages.sort(key=lambda p: (p.acquired_ms, p.seq))
        self._reschedule(state)
        return instance_no

    def remove_packages(self, pool: str) -> None:
        """Drop every package of a pool (counters stay); for "replace packages"."""
        self.ensure_pool(pool)
        state = self._pools[pool]
        state.packages.clear()
        state.unsettled.clear()
        state.unsettled_by_pkg.clear()
        self._reschedule(state)

    def set_collection(self, pool: str, day: int, tokens: int) -> None:
        """Record ``tokens`` (capped) as collected on Beijing ``day`` — e.g. yesterday's
        collection at the start of a scenario; it returns at ``return_at`` on ``day + 1``."""
        self.ensure_pool(pool)
        state = self._pools[pool]
        state.collected[day] = min(max(tokens, 0), self.daily_cap)
        state.returned_days.discard(day)
        self._reschedule(state)

    def set_lag(self, lag_minutes: float, now_ms: int | None = None) -> None:
        """Change the settlement lag. Draws already settled under the old lag stay settled
        (as of ``now_ms``, when given: the API never takes back what it has shown)."""
        if lag_minutes < 0:
            raise ValueError("lag_minutes >= 0 is required")
        if now_ms is not None:
            for state in self._pools.values():
                self._settle(state, now_ms)
        self.lag_ms = int(lag_minutes * 60_000)

    def return_time_ms(self, day: int) -> int | None:
        """When the collection of Beijing ``day`` arrives (None when returns are off)."""
        if self.return_offset_ms is None:
            return None
        return (day + 1) * MS_PER_DAY - BEIJING_OFFSET_MS + self.return_offset_ms

    # ------------------------------------------------------------------ traffic

    def consume(self, pool: str, tokens: int, now_ms: int) -> Consumption:
        """Consume ``tokens`` at ``now_ms``: FIFO from live packages, the rest billed."""
        if tokens < 0:
            raise ValueError("tokens must be >= 0")
        state = self._advance(pool, now_ms)
        self._settle(state, now_ms)  # keeps the unsettled log as short as the lag window
        need = tokens
        for pkg in state.packages:
            if need == 0:
                break
            if pkg.expired or pkg.available == 0 or pkg.acquired_ms > now_ms:
                continue
            take = min(need, pkg.available)
            pkg.available -= take
            need -= take
            if self.lag_ms > 0:
                state.unsettled.append((now_ms, pkg.instance_no, take))
                state.unsettled_by_pkg[pkg.instance_no] = (
                    state.unsettled_by_pkg.get(pkg.instance_no, 0) + take
                )
        day = beijing_day(now_ms)
        before = state.collected.get(day, 0)
        kept = min(tokens, self.daily_cap - before)
        if kept > 0:
            state.collected[day] = before + kept
            at = self.return_time_ms(day)
            if before == 0 and at is not None:  # a new return is due: maybe the next event
                nxt = state.next_event_ms
                state.next_event_ms = at if nxt is None else min(nxt, at)
        burned = tokens - max(kept, 0)
        state.consumed += tokens
        state.billed += need
        state.burned += burned
        return Consumption(tokens=tokens, free=tokens - need, billed=need, burned=burned, day=day)

    # ------------------------------------------------------------------ reading

    def true_packages(self, pool: str, now_ms: int) -> list[LedgerPackage]:
        """Every package acquired by ``now_ms`` with its true balance, FIFO order."""
        state = self._advance(pool, now_ms)
        return [self._view(state, p, p.available) for p in state.packages
                if p.acquired_ms <= now_ms]

    def api_view(self, pool: str, now_ms: int) -> list[LedgerPackage]:
        """The packages as ListResourcePackages shows them at ``now_ms`` (settlement lag)."""
        state = self._advance(pool, now_ms)
        self._settle(state, now_ms)
        return [
            self._view(state, p, p.available + (0 if p.expired else
                                                  state.unsettled_by_pkg.get(p.instance_no, 0)))
            for p in state.packages
            if p.acquired_ms <= now_ms
        ]

    def true_balance(self, pool: str, now_ms: int) -> int:
        return sum(v.available for v in self.true_packages(pool, now_ms) if v.status == "Effective")

    def api_balance(self, pool: str, now_ms: int) -> int:
        return sum(v.available for v in self.api_view(pool, now_ms) if v.status == "Effective")

    def totals(self, pool: str, now_ms: int) -> PoolTotals:
        true_balance = self.true_balance(pool, now_ms)
        api_balance = self.api_balance(pool, now_ms)
        state = self._pools[pool]
        return PoolTotals(
            pool=pool,
            now_ms=now_ms,
            true_balance=true_balance,
            api_balance=api_balance,
            consumed=state.consumed,
            billed=state.billed,
            burned=state.burned,
            expired=state.expired,
            collected_today=state.collected.get(beijing_day(now_ms), 0),
            collected=dict(sorted(state.collected.items())),
        )

    # ------------------------------------------------------------------ internals

    def _view(self, state: _Pool, p: _Package, available: int) -> LedgerPackage:
        if p.expired:
            status = "Expired"
        else:
            status = "Effective" if available > 0 else "UsedUp"
        return LedgerPackage(
            pool=state.name,
            instance_no=p.instance_no,
            configuration_code=p.configuration_code,
            configuration_name=p.configuration_name,
            product=p.product,
            product_name=p.product_name,
            unit=p.unit,
            total=p.total,
            available=available,
            acquired_ms=p.acquired_ms,
            expires_ms=p.expires_ms,
            status=status,
        )

    def _advance(self, pool: str, now_ms: int) -> _Pool:
        if now_ms < self._now:
            raise ValueError(f"time went back: {now_ms} < {self._now}")
        self._now = now_ms
        self.ensure_pool(pool)
        state = self._pools[pool]
        while state.next_event_ms is not None and state.next_event_ms <= now_ms:
            self._apply_next_event(state)
            self._reschedule(state)
        return state

    def _pending_returns(self, state: _Pool) -> list[tuple[int, int]]:
        """(arrival_ms, day) of collected days not yet returned."""
        out = []
        for day, amount in state.collected.items():
            if amount > 0 and day not in state.returned_days:
                at = self.return_time_ms(day)
                if at is not None:
                    out.append((at, day))
        return out

    def _reschedule(self, state: _Pool) -> None:
        times = [p.expires_ms for p in state.packages if not p.expired]
        times += [at for at, _ in self._pending_returns(state)]
        state.next_event_ms = min(times) if times else None

    def _apply_next_event(self, state: _Pool) -> None:
        # At equal times an expiry goes first; the two never touch the same package.
        live = [p for p in state.packages if not p.expired]
        expiry = min(live, key=lambda p: p.expires_ms, default=None)
        ret = min(self._pending_returns(state), default=None)
        if expiry is not None and (ret is None or expiry.expires_ms <= ret[0]):
            expiry.expired = True
            state.expired += expiry.available
            return
        assert ret is not None
        at, day = ret
        state.returned_days.add(day)
        self._seq += 1
        state.packages.append(
            _Package(
                instance_no=f"PackageProduct{self._next_instance}",
                seq=self._seq,
                total=state.collected[day],
                available=state.collected[day],
                acquired_ms=at,
                expires_ms=at + self.expiry_ms,
                configuration_code=state.configuration_code,
                configuration_name=state.configuration_name,
                product=ARK_PRODUCT,
                product_name=ARK_PRODUCT_NAME,
                unit="Tokens",
            )
        )
        self._next_instance += 1
        state.packages.sort(key=lambda p: (p.acquired_ms, p.seq))

    def _settle(self, state: _Pool, now_ms: int) -> None:
        cutoff = now_ms - self.lag_ms
        while state.unsettled and state.unsettled[0][0] <= cutoff:
            _, instance_no, n = state.unsettled.popleft()
            left = state.unsettled_by_pkg[instance_no] - n
            if left:
                state.unsettled_by_pkg[instance_no] = left
            else:
                del state.unsettled_by_pkg[instance_no]
