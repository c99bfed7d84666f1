"""The one-command demo: a compressed Volcengine day through a real LiteLLM proxy with the guard.

No credentials and no Redis server needed: the fake Volcengine (billing API + Ark chat, its clock
running `SCALE`× real time) and the embedded store (served over TCP so the proxy process shares
it) stand in. With VQG_REDIS_URL set, that Redis is used instead. The proxy runs the shipped
example config and its own billing sync; the demo only sends traffic and reads the fake's ledger.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from importlib import resources
from pathlib import Path

import httpx
import openai
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .clock import BEIJING, to_beijing
from .config import settings
from .errors import redact
from .fake import FakeVolcengine, Ledger, ScaledClock
from .gate import KeySpace, Records
from .gate.store import connect, serve_embedded

SCALE = 240  # one real second = four Volcengine minutes
MASTER_KEY = "sk-vqg-demo"
ACCOUNTS = {"acct-a": ("AKLTdemoaccta0001", "c2VjcmV0LWRlbW8tYQ==", "ark-demo-a"),
            "acct-b": ("AKLTdemoacctb0002", "c2VjcmV0LWRlbW8tYg==", "ark-demo-b")}
DS = "deepseek-v4-flash-ga-260731"
POOLS = {f"acct-a/{DS}": 300_000, f"acct-b/{DS}": 150_000, "acct-a/doubao-seed-2-1-pro-260628": 100_000}
RETURN = (f"acct-a/{DS}", 400_000)  # yesterday's collection, back at 10:30
PROMPT = "请用三句话解释一下为什么免费额度需要防护。" * 12  # ~300 tokens, Chinese, as the seed's traffic


@dataclass
class Tally:
    counts: Counter[str] = field(default_factory=Counter)
    tokens: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, what: str, tokens: int = 0) -> None:
        with self.lock:
            self.counts[what] += 1
            self.tokens += tokens


def start_fake() -> FakeVolcengine:
    today = datetime.now(BEIJING).replace(hour=8, minute=0, second=0, microsecond=0)
    start_ms = int(today.timestamp() * 1000)
    fake = FakeVolcengine(ACCOUNTS, ledger=Ledger(lag_minutes=14, return_at="10:30"),
                          clock=ScaledClock(start_ms, SCALE))
    yesterday_ms = start_ms - 86_400_000
    for pool, amount in POOLS.items():
        fake.add_package(pool, amount, acquired_ms=yesterday_ms)
    pool, amount = RETURN
    fake.set_collection(pool, day=(start_ms + 8 * 3_600_000) // 86_400_000 - 1, tokens=amount)
    return fake.start()


def proxy_env(fake: FakeVolcengine, store_url: str, prefix: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VQG_", "VOLC_", "LITELLM_"))}
    env.update({
        "LITELLM_MASTER_KEY": MASTER_KEY, "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "PYTHONUNBUFFERED": "1", "VOLCENGINE_API_BASE": fake.ark_base_url,
        "VQG_REDIS_URL": store_url, "VQG_KEY_PREFIX": prefix, "VQG_BILLING_ENDPOINT": fake.url,
        "VQG_SMALL_BUFFER": "20000",
        # A day in minutes: sync every real minute and check every second.
        "VQG_SYNC_INTERVAL_MINUTES": "1", "VQG_SYNC_LOW_INTERVAL_MINUTES": "1", "VQG_SYNC_POLL_SECONDS": "1",
        # The fake's accounts were never used before the demo: no cold-start hold and nothing
        # assumed to have run unseen (limit.md, "History start").
        "VQG_COLD_START_ADMIT_TOKENS": "1000000000", "VQG_UNSEEN_DAY_TOKENS": "0",
    })
    for account, (ak, sk, ark_key) in ACCOUNTS.items():
        suffix = account.upper().replace("-", "_")
        env |= {f"VOLC_ACCESSKEY_{suffix}": ak, f"VOLC_SECRETKEY_{suffix}": sk,
                f"ARK_API_KEY_{suffix}": ark_key}
    return env


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


EXAMPLE_CONFIG = resources.files("volc_quota_guard.resources").joinpath("litellm.example.yaml")


def _synced(log: str) -> bool:
    return re.search(r"\[Sync\] acct-b/", log) is not None  # both accounts have a snapshot


def start_proxy(env: dict[str, str], log_path: Path, console: Console, config: object = EXAMPLE_CONFIG,
                ready: Callable[[str], bool] = _synced) -> tuple[subprocess.Popen[bytes], str]:
    """`litellm --config` on a free port; returns once it answers and `ready(log)` holds."""
    litellm = shutil.which("litellm", path=str(Path(sys.executable).parent)) or shutil.which("litellm")
    if litellm is None:
        raise RuntimeError("the `litellm` command is not installed (pip install 'litellm[proxy]')")
    port = _free_port()
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [litellm, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
            env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    with console.status("starting the LiteLLM proxy with the guard…"):
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the proxy exited:\n{log_path.read_text(errors='replace')[-3000:]}")
            try:
                if httpx.get(f"{url}/health/liveliness", timeout=2).status_code == 200 and \
                        ready(log_path.read_text(errors="replace")):
                    return proc, url
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
    proc.kill()
    raise RuntimeError("the proxy did not become ready within 120 s")


def _one_request(client: openai.OpenAI, tally: Tally) -> None:
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="deepseek-v4-flash", max_tokens=2_000,
            messages=[{"role": "user", "content": f"[[fake completion=1500]] {PROMPT}"}])
        reply = raw.parse()
        used = reply.usage.total_tokens if reply.usage else 0
        tally.add("clamped" if raw.headers.get("x-vqg-clamped-max-tokens") else "served", used)
        if raw.headers.get("x-litellm-model-group") == "doubao-seed":
            tally.add("fallback")
    except openai.RateLimitError:
        tally.add("blocked")
    except openai.APIError as exc:
        tally.add(f"error {getattr(exc, 'status_code', '?')}")


def _traffic(url: str, seconds: float, fake: FakeVolcengine, console: Console) -> Tally:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=MASTER_KEY, max_retries=0, timeout=60)
    tally = Tally()
    rate = 6.0  # requests per real second (= per four Volcengine minutes)
    started = time.monotonic()
    threads: list[threading.Thread] = []
    columns = (TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[stats]}"),
               TimeElapsedColumn())
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("Volcengine 08:00", total=seconds, stats="")
        sent = 0
        while (elapsed := time.monotonic() - started) < seconds:
            while sent < elapsed * rate:
                t = threading.Thread(target=_one_request, args=(client, tally), daemon=True)
                t.start()
                threads.append(t)
                sent += 1
            c = tally.counts
            progress.update(task, completed=elapsed,
                            description=f"Volcengine {to_beijing(fake.now_ms()):%H:%M}",
                            stats=f"served {c['served'] + c['clamped']}  clamped {c['clamped']}  "
                                  f"blocked {c['blocked']}")
            time.sleep(0.1)
        for t in threads:
            t.join(timeout=60)
        progress.update(task, completed=seconds)
    return tally


def run(seconds: float = 100.0, console: Console | None = None) -> int:
    """Run the demo; 0 when nothing was billed, 1 otherwise."""
    console = console or Console()
    cfg = settings()
    embedded = None if cfg.redis_url else serve_embedded()
    store_url = cfg.redis_url or embedded.url  # type: ignore[union-attr]
    prefix = f"vqgdemo-{uuid.uuid4().hex[:8]}"
    fake = start_fake()
    workdir = Path(tempfile.mkdtemp(prefix="vqg-demo-"))
    log_path = workdir / "proxy.log"
    proc = None
    try:
        where = f"Redis {redact(store_url)}" if cfg.redis_url else "embedded"
        console.print(f"[bold]volc_quota_guard demo[/] — store: {where}, fake Volcengine at {fake.url} "
                      f"({SCALE}× time), proxy log: {log_path}")
        proc, url = start_proxy(proxy_env(fake, store_url, prefix), log_path, console)
        tally = _traffic(url, seconds, fake, console)
        time.sleep(2)  # the last settles and log lines
        return _report(tally, fake, log_path, console)
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
        fake.stop()
        Records(connect(store_url), KeySpace(prefix)).clear()
        if embedded is not None:
            embedded.stop()


def _report(tally: Tally, fake: FakeVolcengine, log_path: Path, console: Console) -> int:
    c = tally.counts
    table = Table(title="Demo summary", show_lines=False)
    table.add_column("what")
    table.add_column("value", justify="right")
    table.add_row("requests served", f"{c['served'] + c['clamped']:,}")
    table.add_row("  of which clamped (max_tokens lowered to fit)", f"{c['clamped']:,}")
    table.add_row("  of which served by the fallback model", f"{c['fallback']:,}")
    table.add_row("requests blocked (HTTP 429)", f"{c['blocked']:,}")
    for what, n in sorted(c.items()):
        if what.startswith("error"):
            table.add_row(f"other failures ({what})", f"{n:,}")
    table.add_row("tokens served", f"{tally.tokens:,}")
    billed = burned = 0
    for pool in sorted(POOLS):
        t = fake.pool_totals(pool)
        billed, burned = billed + t.billed, burned + t.burned
        table.add_row(f"{pool}: consumed / free left", f"{t.consumed:,} / {t.true_balance:,}")
    table.add_row("[bold]billed tokens (fake Volcengine ledger)[/]", f"[bold]{billed:,}[/]")
    table.add_row("burned tokens (beyond the daily cap)", f"{burned:,}")
    console.print(table)
    lines = log_path.read_text(errors="replace").splitlines()
    blocks = [ln for ln in lines if "[PRE-BLOCK]" in ln]
    console.print(f"PRE-BLOCK lines in the proxy log: {len(blocks)}")
    for ln in blocks[:3]:
        console.print("  " + ln[ln.find("🚫"):], markup=False, highlight=False, soft_wrap=True)
    for ln in [ln for ln in lines if "[Sync]" in ln and "Bal=" in ln][-3:]:
        console.print("  " + ln[ln.find("🔄"):], markup=False, highlight=False, soft_wrap=True)
    served = c["served"] + c["clamped"]
    if billed or burned or not served:
        console.print(f"[bold red]FAILED[/]: billed {billed:,}, burned {burned:,}, served {served}")
        return 1
    console.print("[bold green]OK[/]: free quota used, nothing billed.")
    return 0


