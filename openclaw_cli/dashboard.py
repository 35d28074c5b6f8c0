"""What `openclaw launch` shows while it runs: a rich Live panel, or one plain log line at a time with --no-ui.

Both read a :class:`Snapshot` the runtime assembles every refresh, so what a user sees in the terminal and in the
logs is the same set of numbers: is it serving, are turns being captured, judged and trained, is the reward moving.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

log = logging.getLogger("openclaw.launch")

_SPARK = "▁▂▃▄▅▆▇█"


@dataclass
class Snapshot:
    url: str
    backend: str
    backend_ok: bool
    policy_version: int
    requests_total: int = 0
    in_flight: int = 0
    sessions_open: int = 0
    sessions_total: int = 0
    turns_pending: int = 0  # main turns waiting for their next state
    turns_ready: int = 0  # main turns with a next state (or an ended session): judgeable
    judged: int = 0
    trained: int = 0
    steps: int = 0
    batch_size: int = 0
    method: str = "rl"
    rewards: list[float] = field(default_factory=list)  # mean reward per step, oldest first
    last_loss: float | None = None
    errors: list[str] = field(default_factory=list)
    uptime_s: float = 0.0
    lessons_active: list[str] = field(default_factory=list)  # the active lessons' texts, oldest first
    lessons_by_status: dict[str, int] = field(default_factory=dict)
    # lora.scope = owner: each owner's adapter (owner id or group name, never a key) with its version and steps
    adapters: list[dict[str, Any]] = field(default_factory=list)
    # local.vllm_servers: each server's url, health, requests in flight and last error (LocalBackend.serving_status)
    servers: list[dict[str, Any]] = field(default_factory=list)


def sparkline(values: list[float], low: float = -1.0, high: float = 1.0, width: int = 24) -> str:
    """Rewards in [low, high] as block characters, newest on the right."""
    shown = values[-width:]
    span = high - low
    out = []
    for value in shown:
        clamped = min(high, max(low, value))
        out.append(_SPARK[min(len(_SPARK) - 1, int((clamped - low) / span * len(_SPARK)))])
    return "".join(out)


def _fmt_reward(values: list[float]) -> str:
    if not values:
        return "no step yet"
    recent = values[-5:]
    return f"{values[-1]:+.2f} (last 5 mean {sum(recent) / len(recent):+.2f}) {sparkline(values)}"


def render(snapshot: Snapshot) -> Panel:
    """The Live panel."""
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold cyan", justify="right")
    table.add_column()
    health = Text("ok", style="green") if snapshot.backend_ok else Text("unhealthy", style="bold red")
    table.add_row("serving", f"{snapshot.url} ({snapshot.backend} backend)")
    table.add_row("backend", health)
    table.add_row("policy", f"version {snapshot.policy_version}, {snapshot.steps} step(s), method {snapshot.method}")
    owners = [row for row in snapshot.adapters if row.get("adapter") != "shared"]
    if owners:
        latest = ", ".join(f"{row['adapter']} v{row['version']} ({row['steps']} steps)" for row in owners[:3])
        more = f" and {len(owners) - 3} more" if len(owners) > 3 else ""
        table.add_row("owners", f"{len(owners)} adapter(s): {latest}{more}")
    if snapshot.servers:
        table.add_row("vLLM servers", _servers_line(snapshot.servers))
        for server in snapshot.servers:
            if not server.get("healthy"):
                table.add_row("", Text(f"• {server['url']} out: {server.get('last_error') or 'starting'}", style="red"))
    table.add_row("requests", f"{snapshot.requests_total} total, {snapshot.in_flight} in flight")
    table.add_row("sessions", f"{snapshot.sessions_open} open / {snapshot.sessions_total} total")
    table.add_row(
        "turns",
        f"{snapshot.turns_pending} waiting for a next state, {snapshot.turns_ready} ready, "
        f"{snapshot.judged} judged, {snapshot.trained} trained (batch {snapshot.batch_size})",
    )
    table.add_row("reward", _fmt_reward(snapshot.rewards))
    if snapshot.last_loss is not None:
        table.add_row("loss", f"{snapshot.last_loss:.4f}")
    if snapshot.lessons_by_status:
        counts = ", ".join(f"{n} {status}" for status, n in sorted(snapshot.lessons_by_status.items()))
        table.add_row("lessons", counts)
        for text in snapshot.lessons_active[-3:]:
            table.add_row("", Text(f"• {text}", style="green"))
    parts: list[Table | Text] = [table]
    for error in snapshot.errors[-3:]:
        parts.append(Text(error, style="red"))
    return Panel(Group(*parts), title="openclaw launch", subtitle=f"up {snapshot.uptime_s:.0f}s  Ctrl-C stops")


def _servers_line(servers: list[dict[str, Any]]) -> str:
    up = sum(1 for server in servers if server.get("healthy"))
    return f"{up}/{len(servers)} up, {sum(int(s.get('in_flight', 0)) for s in servers)} requests in flight"


def log_line(snapshot: Snapshot) -> str:
    """The --no-ui status line."""
    reward = f"{snapshot.rewards[-1]:+.2f}" if snapshot.rewards else "n/a"
    servers = f"vLLM servers {_servers_line(snapshot.servers)} | " if snapshot.servers else ""
    return (
        f"version {snapshot.policy_version} step {snapshot.steps} | requests {snapshot.requests_total} "
        f"(in flight {snapshot.in_flight}) | sessions {snapshot.sessions_open} open | turns ready "
        f"{snapshot.turns_ready}, judged {snapshot.judged}, trained {snapshot.trained} | reward {reward} | "
        f"lessons {snapshot.lessons_by_status.get('active', 0)} active | {servers}"
        f"backend {'ok' if snapshot.backend_ok else 'UNHEALTHY'}"
    )
