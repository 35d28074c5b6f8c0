"""TEST DOUBLE of a vLLM server's HTTP API, as the remote sampler (``local.vllm_servers``) uses it, on loopback.

It speaks the wire format of vLLM's OpenAI-compatible server (read from vLLM 0.32's ``entrypoints``): ``/health``,
``/version``, ``/v1/models`` (the base model, and each loaded LoRA with its ``parent``), ``/tokenize`` with
``messages``, ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` (404 from the framework when runtime LoRA
loading is off, vLLM's own 404 "cannot be found" for an unknown adapter, 400 "already been loaded"), and
``/v1/completions`` with a token-id prompt, ``return_token_ids`` and ``logprobs``, whole or streamed as SSE chunks
with ``token_ids`` and ``logprobs.token_logprobs`` per delta.

No model runs: a reply is ``max_tokens`` token ids drawn from (model name, prompt, seed), each with log-probability
-0.5, and ends with finish reason "length"; asked for ``logprobs`` >= 1, each position's top log-probabilities also
name a runner-up, the next token id, at :data:`RUNNER_UP_LOGPROB` (keys ``token_id:N``).

Knobs: ``fail_next`` (the next N completions answer 503 before any token), ``die_after`` (a stream closes the
connection after that many tokens), ``runtime_lora``, ``version``, ``max_lora_rank``, ``grammars`` (False: a server
pinned to a structured-outputs backend that refuses our Lark grammars answers a request carrying one with 400; the
double never enforces a grammar), ``resolver_dir`` (vLLM's filesystem resolver: an unknown model name loads
``<dir>/<name>`` when its ``adapter_config.json`` is a LoRA naming this server's model as its base), :meth:`restart`
(a new process: our adapters are gone). Never use it outside tests.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

Render = Callable[[list[dict[str, Any]]], list[int]]
RUNNER_UP_LOGPROB = -4.0


class VllmServerDouble:
    def __init__(self, model: str, render: Render, *, runtime_lora: bool = True, version: str = "0.32.0") -> None:
        self.model, self.render = model, render
        self.runtime_lora, self.version = runtime_lora, version
        self.max_lora_rank = 16
        self.grammars = True
        self.resolver_dir: Path | None = None
        self.loras: dict[str, str] = {}  # name -> path
        self.fail_next = 0
        self.die_after: int | None = None
        self.completions: list[dict[str, Any]] = []  # every completion request's body
        self._lock = threading.Lock()
        self._server = self._make_server(0)
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread: threading.Thread | None = None

    def __enter__(self) -> VllmServerDouble:
        self._serve()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _serve(self) -> None:
        self._thread = threading.Thread(target=self._server.serve_forever, name="vllm-double", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._thread is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread = None

    def restart(self) -> None:
        """A new server process on the same port: the adapters loaded at runtime are gone."""
        self.stop()
        self.loras.clear()
        self._server = self._make_server(self.port)
        self._serve()

    # -- what the server does ------------------------------------------------------------------------------------

    def _tokens(self, model: str, prompt: list[int], seed: Any, n: int) -> list[int]:
        digest = hashlib.sha256(json.dumps([model, prompt, seed]).encode()).digest()
        return [10 + digest[i % len(digest)] % 40 for i in range(n)]

    def _route(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        if method == "GET" and path == "/health":
            return 200, {}
        if method == "GET" and path == "/version":
            return 200, {"version": self.version}
        if method == "GET" and path == "/v1/models":
            cards = [{"id": self.model, "object": "model", "root": self.model}]
            cards += [{"id": n, "object": "model", "root": p, "parent": self.model} for n, p in self.loras.items()]
            return 200, {"object": "list", "data": cards}
        if method == "POST" and path == "/tokenize":
            tokens = self.render(body["messages"])
            return 200, {"tokens": tokens, "count": len(tokens), "max_model_len": 4096}
        if method == "POST" and path in ("/v1/load_lora_adapter", "/v1/unload_lora_adapter"):
            if not self.runtime_lora:
                return 404, {"detail": "Not Found"}
            return self._lora(path, body)
        return 404, {"detail": "Not Found"}

    def _lora(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        name = body.get("lora_name", "")
        if path.endswith("unload_lora_adapter"):
            if self.loras.pop(name, None) is None:
                return 404, _error(f"The lora adapter '{name}' cannot be found.", 404)
            return 200, f"Success: LoRA adapter '{name}' removed successfully."
        if name in self.loras:
            return 400, _error(f"The lora adapter '{name}' has already been loaded.", 400)
        config = Path(body.get("lora_path", "")) / "adapter_config.json"
        if not config.is_file():
            return 404, _error(f"Loading lora {name} failed: No adapter found for {config.parent}", 404)
        rank = json.loads(config.read_text()).get("r", 0)
        if rank > self.max_lora_rank:
            return 500, _error(f"LoRA rank {rank} is greater than max_lora_rank {self.max_lora_rank}.", 500)
        self.loras[name] = str(config.parent)
        return 200, f"Success: LoRA adapter '{name}' added successfully."

    def _resolve(self, name: str) -> None:
        """vLLM's filesystem resolver, asked for an unknown model name (it needs runtime LoRA updating on too)."""
        if name == self.model or name in self.loras or self.resolver_dir is None or not self.runtime_lora:
            return
        config = self.resolver_dir / name / "adapter_config.json"
        if config.is_file():
            found = json.loads(config.read_text())
            if found.get("peft_type") == "LORA" and found.get("base_model_name_or_path") == self.model:
                self.loras[name] = str(config.parent)

    def _make_server(self, port: int) -> ThreadingHTTPServer:
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(*double._route("GET", self.path, {}))

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
                if self.path == "/v1/completions":
                    self._complete(body)
                    return
                self._answer(*double._route("POST", self.path, body))

            def _complete(self, body: dict[str, Any]) -> None:
                with double._lock:
                    double.completions.append(body)
                    failing = double.fail_next > 0
                    double.fail_next -= 1 if failing else 0
                model = body.get("model")
                double._resolve(str(model))
                if failing:
                    self._answer(503, _error("the engine is overloaded", 503))
                    return
                if model != double.model and model not in double.loras:
                    self._answer(404, _error(f"The model `{model}` does not exist.", 404))
                    return
                if (body.get("structured_outputs") or {}).get("grammar") and not double.grammars:
                    self._answer(400, _error("The provided grammar is not supported by the xgrammar backend.", 400))
                    return
                tokens = double._tokens(model, body["prompt"], body.get("seed"), int(body.get("max_tokens") or 16))
                if not body.get("stream"):
                    choice = _choice(tokens, "length", top=int(body.get("logprobs") or 0) >= 1)
                    self._answer(200, {"id": "cmpl-double", "object": "text_completion", "choices": [choice]})
                    return
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                for i, token in enumerate(tokens):
                    if double.die_after is not None and i >= double.die_after:
                        self.close_connection = True
                        return  # the process died: the connection closes without [DONE]
                    finish = "length" if i == len(tokens) - 1 else None
                    chunk = {"id": "cmpl-double", "object": "text_completion", "choices": [_choice([token], finish)]}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")

            def _answer(self, status: int, payload: Any) -> None:
                data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                return

        return ThreadingHTTPServer(("127.0.0.1", port), Handler)


def _choice(tokens: list[int], finish: str | None, *, top: bool = False) -> dict[str, Any]:
    logprobs: dict[str, Any] = {"token_logprobs": [-0.5] * len(tokens), "tokens": [f"token_id:{t}" for t in tokens]}
    if top:
        logprobs["top_logprobs"] = [{f"token_id:{t}": -0.5, f"token_id:{t + 1}": RUNNER_UP_LOGPROB} for t in tokens]
    return {
        "index": 0,
        "text": "".join(f"<{t}>" for t in tokens),
        "token_ids": tokens,
        "logprobs": logprobs,
        "finish_reason": finish,
        "stop_reason": None,
    }


def _error(message: str, code: int) -> dict[str, Any]:
    return {"error": {"message": message, "type": "BadRequestError", "param": None, "code": code}}
