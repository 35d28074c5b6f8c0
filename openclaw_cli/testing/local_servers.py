"""Starting servers in tests, benchmarks and scripts: a free loopback port, and waiting for a child process's server
to answer (failing at once when the process dies first, so nothing waits out a timeout on a dead child)."""

from __future__ import annotations

import socket
import subprocess
import time


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on right now (tests and benchmarks only ever bind the loopback address)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until_answering(
    url: str, proc: subprocess.Popen[bytes], *, timeout_s: float, what: str, require_ok: bool = False
) -> None:
    """Poll ``url`` until it answers (any HTTP status; with ``require_ok``, a 200). Raises RuntimeError naming
    ``what`` when ``proc`` exits first or ``timeout_s`` passes."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with code {proc.returncode} before answering at {url}")
        try:
            if httpx.get(url, timeout=2).status_code == 200 or not require_ok:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{what} did not answer at {url} within {timeout_s:.0f}s")
