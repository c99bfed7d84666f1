"""Showing simulation results: JSON (docs/simulator.md), a rich table, a Markdown table, a plot."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from ..clock import to_beijing
from .engine import RunResult
from .scenario import Scenario, ScenarioError


def to_json(results: Sequence[RunResult]) -> str:
    """One object for one strategy, a list for several (docs/simulator.md, "Output")."""
    objs = [r.as_json() for r in results]
    return json.dumps(objs[0] if len(objs) == 1 else objs, ensure_ascii=False, indent=2)


def _n(v: int) -> str:
    return f"{v:,}"


def summary(s: Scenario) -> str:
    """One line of what the pool starts with and how the API behaves."""
    start = to_beijing(s.start_ms)
    free = sum(p.amount for p in s.packages)
    bits = [f"{start:%Y-%m-%d %H:%M} Beijing, {s.days} day{'s' if s.days > 1 else ''}",
            f"packages {free:,}", f"cap {s.daily_cap:,}/day",
            f"API lag {s.settlement_lag_minutes:g} min", f"sync every {s.sync_interval_minutes} min",
            f"SMALL_BUFFER {s.small_buffer:,}"]
    if s.return_at is not None and s.yesterday_collection:
        bits.append(f"{s.yesterday_collection:,} returns at {s.return_at // 3_600_000:02d}:"
                    f"{s.return_at // 60_000 % 60:02d}")
    return " · ".join(bits)


def print_table(console: Console, s: Scenario, results: Sequence[RunResult]) -> None:
    table = Table(title=f"{s.name}", caption=summary(s), title_justify="left",
                  caption_justify="left")
    table.add_column("strategy")
    for col in ("billed", "burned", "expired", "served req", "blocked", "clamped",
                "served tokens", "refused while free", "stranded", "syncs", "time"):
        table.add_column(col, justify="right")
    for r in results:
        billed = f"[bold red]{_n(r.billed_tokens)}[/]" if r.billed_tokens else "[green]0[/]"
        burned = f"[bold yellow]{_n(r.burned_tokens)}[/]" if r.burned_tokens else "[green]0[/]"
        table.add_row(f"[bold]{r.strategy}[/]" if r.strategy == "guard" else r.strategy,
                      billed, burned, _n(r.expired_tokens), _n(r.served_requests),
                      _n(r.blocked_requests), _n(r.clamped_requests), _n(r.served_tokens),
                      _n(r.refused_while_free_tokens), _n(r.stranded_tokens), _n(r.syncs),
                      f"{r.elapsed_s:.1f}s")
    console.print(table)
    console.print("[dim]billed: paid beyond the true free balance · burned: collected past the "
                  "daily cap · refused while free: tokens of refused requests that fit the true "
                  "balance and the cap · stranded: free quota beyond SMALL_BUFFER left at the end "
                  "of days with refusals[/]")


def markdown_table(rows: Sequence[tuple[str, Sequence[RunResult]]], strategies: Sequence[str]) -> str:
    """scenario × strategy → `billed / burned / expired / refused-while-free` (tokens)."""
    head = "| scenario | " + " | ".join(strategies) + " |"
    rule = "|---|" + "---:|" * len(strategies)
    lines = [head, rule]
    for name, results in rows:
        by = {r.strategy: r for r in results}
        cells = []
        for st in strategies:
            r = by[st]
            cell = (f"{_n(r.billed_tokens)} / {_n(r.burned_tokens)} / {_n(r.expired_tokens)} / "
                    f"{_n(r.refused_while_free_tokens)}")
            cells.append(f"**{cell}**" if r.billed_tokens else cell)
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def require_matplotlib() -> Any:
    """matplotlib (Agg), or a clear error: it is an optional dependency of `--plot`."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ScenarioError("--plot needs matplotlib, which is not installed: "
                            "pip install matplotlib") from None
    return plt


def plot(s: Scenario, results: Sequence[RunResult], path: str | Path) -> None:
    """Per strategy: the true and the API's free balance, then today's usage against the
    strategy's limit and the cap, with refused requests (ticks) and billed tokens (red)."""
    plt = require_matplotlib()
    import matplotlib.dates as mdates

    from ..clock import BEIJING

    rows = [r for r in results if r.series is not None]
    fig, axes = plt.subplots(len(rows), 2, figsize=(15, 3.2 * len(rows) + 0.6), squeeze=False,
                             sharex=True)
    for (ax_bal, ax_day), r in zip(axes, rows, strict=True):
        ser = r.series
        assert ser is not None
        t = [to_beijing(ms) for ms in ser.t]
        ax_bal.plot(t, ser.true_balance, color="tab:green", label="true free balance")
        ax_bal.plot(t, ser.api_balance, color="tab:green", linestyle="--", alpha=0.7,
                    label="API balance (lagged)")
        ax_bal.set_title(f"{r.strategy}: free balance", loc="left", fontsize=10)
        ax_day.plot(t, ser.usage_today, color="tab:blue", label="usage today")
        ax_day.step(t, ser.limit_today, where="post", color="tab:orange", label=f"{r.strategy} limit")
        ax_day.axhline(ser.daily_cap, color="grey", linestyle=":", label="daily cap")
        if ser.blocked_at:
            ax_day.plot([to_beijing(ms) for ms in ser.blocked_at], [0] * len(ser.blocked_at), "|",
                        color="tab:red", markersize=8, alpha=0.4, label="refused")
        ax_day.set_title(f"{r.strategy}: today (Beijing day)", loc="left", fontsize=10)
        billed = ax_day.twinx()
        billed.plot(t, ser.billed, color="tab:red", label="billed (cumulative)")
        billed.set_ylim(bottom=0, top=max(max(ser.billed, default=0) * 1.2, 1))
        billed.tick_params(axis="y", colors="tab:red")
        for ax in (ax_bal, ax_day):
            ax.yaxis.set_major_formatter(lambda v, _pos: f"{v / 1e6:.2f}M")
            ax.grid(alpha=0.3)
            ax.xaxis.set_major_formatter(mdates.DateFormatter("%m-%d %H:%M", tz=BEIJING))  # type: ignore[no-untyped-call]
        handles, labels = ax_day.get_legend_handles_labels()
        h2, l2 = billed.get_legend_handles_labels()
        ax_day.legend(handles + h2, labels + l2, fontsize=7, loc="upper left")
        ax_bal.legend(fontsize=7, loc="upper right")
    fig.suptitle(f"{s.name} — {summary(s)}", fontsize=10)
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
