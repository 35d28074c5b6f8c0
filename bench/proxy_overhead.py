"""How much latency and throughput the openclaw proxy costs, against calling the upstream directly and against
LiteLLM's proxy in front of the same upstream, in one run.

    python bench/proxy_overhead.py [--requests 400] [--concurrency 8] [--litellm PATH_TO_litellm_EXECUTABLE]

Setup (every server in its own process, all on 127.0.0.1):
- upstream: a fast fake model server. ``POST /v1/chat/completions`` answers a fixed OpenAI reply (what "direct" and
  LiteLLM call); ``POST /v1/tokens`` answers the same reply as token ids (what the openclaw backend calls).
- openclaw: this repo's proxy with a thin HTTP backend that asks the upstream for token ids, so the proxy does
  its real work per request — validation, chat-template rendering, the backend round trip, reply parsing, the
  response, and capture (once into memory, once into the real SQLite store when it is importable). The thin
  backend calls the upstream with aiohttp, the client LiteLLM's proxy uses for its own upstream calls; the servers
  run as ``openclaw serve`` runs them (uvicorn, on uvloop + httptools when installed).
- litellm: ``litellm --model openai/fake --api_base <upstream>/v1`` when the executable is found (``--litellm``,
  else ``litellm`` on PATH); otherwise the row says it is not installed.

The client sends non-streamed chat requests with ``concurrency`` in flight and reports p50/p99 latency and
requests per second per target. Numbers depend heavily on the machine (and on anything else running on it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from openclaw_cli.testing.local_servers import free_port, wait_until_answering

REPLY = "Hello! How can I help you today?"
# LiteLLM refuses to start without a master key; every target gets the same bearer token (the others ignore it).
BENCH_KEY = "sk-bench-6f1c0d2a9e8b47c3a5d4e2f1b0c9d8e7"
MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant."},
    {"role": "user", "content": "Please answer briefly and politely. What is the capital of France?"},
]


# -- server processes ------------------------------------------------------------------------------------------


def _tiny_tokenizer() -> Any:
    from openclaw_cli.testing.tiny_model import build_tiny_tokenizer
    from openclaw_cli.tokenizer import HFChatTokenizer

    return HFChatTokenizer(build_tiny_tokenizer())


def upstream_app() -> Any:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    tokenizer = _tiny_tokenizer()
    reply_ids = [*tokenizer.encode(REPLY), tokenizer.eos_token_ids[0]]

    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        return JSONResponse(
            {
                "id": "chatcmpl-upstream",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model", "fake"),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": REPLY}, "finish_reason": "stop"}],
                "usage": {
                    "prompt_tokens": 20,
                    "completion_tokens": len(reply_ids),
                    "total_tokens": 20 + len(reply_ids),
                },
            }
        )

    async def tokens(request: Request) -> JSONResponse:
        await request.json()
        return JSONResponse({"tokens": reply_ids, "text": REPLY})

    return Starlette(
        routes=[Route("/v1/chat/completions", chat, methods=["POST"]), Route("/v1/tokens", tokens, methods=["POST"])]
    )


class UpstreamTokenBackend:
    """Serving-only backend that gets completion token ids from the fake upstream over HTTP (bench use only)."""

    name = "http-upstream"

    def __init__(self, base_url: str) -> None:
        from openclaw_cli.types import PolicyVersion

        self._tokenizer = _tiny_tokenizer()
        self._base_url = base_url
        self._session: Any = None
        self._version = PolicyVersion(0, "base")

    def tokenizer(self) -> Any:
        return self._tokenizer

    def current_version(self) -> Any:
        return self._version

    async def sample(self, prompt_tokens: list[int], params: Any, version: int | None = None) -> Any:
        import aiohttp

        from openclaw_cli.types import SampleResult

        if self._session is None:  # created on the serving loop
            self._session = aiohttp.ClientSession(self._base_url, timeout=aiohttp.ClientTimeout(total=30))
        started = time.time()
        async with self._session.post(
            "/v1/tokens", json={"prompt_tokens": prompt_tokens, "max_tokens": params.max_tokens}
        ) as resp:
            data = await resp.json()
        done = time.time()
        return SampleResult(
            tokens=data["tokens"],
            logprobs=[-0.1] * len(data["tokens"]),
            finish_reason="stop",
            version=0,
            text=data["text"],
            prompt_tokens=len(prompt_tokens),
            started_at=started,
            first_token_at=done,
            finished_at=done,
        )

    async def stream(self, prompt_tokens: list[int], params: Any, version: int | None = None) -> AsyncIterator[Any]:
        yield await self.sample(prompt_tokens, params, version)


def proxy_app(upstream: str, store_path: str | None) -> Any:
    from openclaw_cli.proxy import create_app
    from openclaw_cli.settings import Settings
    from openclaw_cli.testing.fake_backend import MemorySink

    settings = Settings()
    sink: Any = MemorySink()
    if store_path:
        from openclaw_cli.capture.sessions import SessionCapture
        from openclaw_cli.store import Store

        sink = SessionCapture(Store(Path(store_path)), settings)
    return create_app(UpstreamTokenBackend(upstream), sink, settings)  # type: ignore[arg-type]


def serve_forever(kind: str, port: int, upstream: str, store_path: str | None) -> None:
    import uvicorn

    app = upstream_app() if kind == "upstream" else proxy_app(upstream, store_path)
    # uvicorn's defaults pick uvloop + httptools when installed, as ``openclaw serve`` does.
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="error", access_log=False)


# -- orchestration ---------------------------------------------------------------------------------------------


def start_own(kind: str, upstream: str = "", store_path: str | None = None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, __file__, "--serve", kind, "--port", str(port), "--upstream", upstream]
    if store_path:
        cmd += ["--store", store_path]
    proc = subprocess.Popen(cmd, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    base = f"http://127.0.0.1:{port}"
    wait_until_answering(base + "/", proc, timeout_s=90, what=f"the {kind} server")
    return proc, base


def start_litellm(executable: str, upstream: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [
        executable,
        "--model",
        "openai/fake",
        "--api_base",
        upstream + "/v1",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
    ]
    env = {
        **os.environ,
        "OPENAI_API_KEY": "sk-fake",
        "LITELLM_MASTER_KEY": BENCH_KEY,
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "LITELLM_LOG": "ERROR",
    }
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    wait_until_answering(base + "/health/liveliness", proc, timeout_s=180, what="the LiteLLM proxy")
    return proc, base


async def load(url: str, model: str, requests: int, concurrency: int) -> dict[str, float]:
    import httpx

    latencies: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(requests):
        queue.put_nowait(i)
    body = {"model": model, "messages": MESSAGES, "max_tokens": 32, "temperature": 0}
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as client:
        for _ in range(min(20, requests)):  # warm-up: connections, caches, lazy imports
            (await client.post(url, json=body, headers={"authorization": f"Bearer {BENCH_KEY}"})).raise_for_status()

        async def worker() -> None:
            while True:
                try:
                    queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                start = time.perf_counter()
                resp = await client.post(url, json=body, headers={"authorization": f"Bearer {BENCH_KEY}"})
                resp.raise_for_status()
                latencies.append(time.perf_counter() - start)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - began
    latencies.sort()
    return {
        "p50_ms": 1000 * statistics.median(latencies),
        "p99_ms": 1000 * latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))],
        "rps": len(latencies) / elapsed,
    }


def cpu_seconds(proc: subprocess.Popen[bytes]) -> float | None:
    """User + system CPU time of a server process so far (Linux /proc; None elsewhere). On a busy machine latency
    mostly measures the neighbours; CPU time per request measures the server."""
    try:
        fields = Path(f"/proc/{proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(url: str, model: str, proc: subprocess.Popen[bytes], requests: int, concurrency: int) -> dict[str, float]:
    before = cpu_seconds(proc)
    result = asyncio.run(load(url, model, requests, concurrency))
    after = cpu_seconds(proc)
    if before is not None and after is not None:
        result["cpu_ms"] = 1000 * (after - before) / (requests + min(20, requests))  # warm-up requests count too
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--litellm", help="path to the litellm executable (default: litellm on PATH)")
    parser.add_argument("--no-litellm", action="store_true", help="skip the LiteLLM row")
    parser.add_argument("--serve", choices=["upstream", "proxy"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--upstream", default="", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve_forever(args.serve, args.port, args.upstream, args.store)
        return

    procs: list[subprocess.Popen[bytes]] = []
    rows: list[tuple[str, dict[str, float] | str]] = []
    workdir = Path(tempfile.mkdtemp(prefix="openclaw-bench-"))
    try:
        upstream_proc, upstream = start_own("upstream")
        procs.append(upstream_proc)
        targets: list[tuple[str, str, str, subprocess.Popen[bytes]]] = [
            ("direct (upstream)", upstream + "/v1/chat/completions", "fake", upstream_proc)
        ]
        proxy_proc, proxy = start_own("proxy", upstream)
        procs.append(proxy_proc)
        targets.append(("openclaw (memory capture)", proxy + "/v1/chat/completions", "openclaw", proxy_proc))
        try:
            import openclaw_cli.capture.sessions
            import openclaw_cli.store  # noqa: F401

            stored_proc, stored = start_own("proxy", upstream, str(workdir / "store.sqlite3"))
            procs.append(stored_proc)
            targets.append(("openclaw (SQLite capture)", stored + "/v1/chat/completions", "openclaw", stored_proc))
        except ImportError:
            rows.append(("openclaw (SQLite capture)", "store not available in this checkout"))
        executable = None if args.no_litellm else args.litellm or shutil.which("litellm")
        if args.no_litellm:
            rows.append(("litellm proxy", "skipped (--no-litellm)"))
        elif executable:
            lite_proc, lite = start_litellm(executable, upstream)
            procs.append(lite_proc)
            targets.append(("litellm proxy", lite + "/v1/chat/completions", "openai/fake", lite_proc))
        else:
            rows.append(("litellm proxy", "not installed (pip install 'litellm[proxy]' or pass --litellm PATH)"))
        measured = [
            (label, measure(url, model, proc, args.requests, args.concurrency)) for label, url, model, proc in targets
        ]
        rows = [*measured, *rows]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"\n{args.requests} non-streamed chat requests, {args.concurrency} in flight, {os.cpu_count()} CPUs\n")
    print(f"{'target':<28} {'p50 ms':>8} {'p99 ms':>8} {'req/s':>8} {'server CPU ms/req':>18}")
    for label, result in rows:
        if isinstance(result, str):
            print(f"{label:<28} {result}")
        else:
            cpu = f"{result['cpu_ms']:>18.2f}" if "cpu_ms" in result else f"{'n/a':>18}"
            print(f"{label:<28} {result['p50_ms']:>8.2f} {result['p99_ms']:>8.2f} {result['rps']:>8.1f} {cpu}")


if __name__ == "__main__":
    main()
