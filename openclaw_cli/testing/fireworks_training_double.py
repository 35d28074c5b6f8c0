"""TEST DOUBLE of Fireworks' step-wise training service (serverless), spoken over HTTP to the real SDK.

This is not Fireworks. It answers the endpoints ``fireworks.training.sdk`` (``FiretitanServiceClient`` and the
``FiretitanSamplingClient`` s it builds) calls for serverless LoRA training, with request and response shapes taken
from that SDK's source, so tests drive the real SDK end to end on loopback:

- control plane: ``GET /v1/accounts`` (the SDK resolves the account from the key) and
  ``DELETE /v1/accounts/<a>/trainingSessions/<ts>`` (releasing a session);
- under ``/training/v1/serverless/api/v1``: ``client/config``, ``create_session``, ``session_heartbeat``,
  ``telemetry``, ``create_model``, ``forward_backward``, ``optim_step``, ``save_weights_for_sampler``,
  ``save_weights`` (save_state), ``load_weights`` (load_state), ``unload_model``, ``create_sampling_route`` and the
  long-poll ``retrieve_future``, which answers ``{"type": "try_again"}`` to the first ``try_again_polls`` polls of
  every future, so the SDK's poll loop really runs;
- ``/training/v1/serverless/inference/v1/completions``: streaming (SSE) completions from token-id prompts with
  ``raw_output`` token ids, raw (``logprob``) and behaviour (``sampling_logprob``) log-probabilities, and ``echo``
  for prompt log-probabilities. Model names are the SDK's routes: ``accounts/<a>/trainingSessions/<ts>`` (the
  session's base weights), ``.../trainingSessions/<ts>/checkpoints/<path>`` (a saved sampler checkpoint),
  ``accounts/<a>/trainingSamplers/<base model>`` and ``.../trainingSamplers/checkpoints/<path>`` (standalone).

The Fireworks SDK samples only through the completions endpoint; Tinker's ``create_sampling_session`` / ``asample``
are never called by it and are not served here.

The math is real: each created model is the local backend's pieces on the tiny test model (PEFT LoRA trainer with
its losses, versioned-LoRA serving and the token-by-token sampler from :mod:`openclaw_cli.backends.local`). A sampler
checkpoint is a published LoRA version; a state checkpoint is the trainer's own save directory.

Simplifications (what a test must not read as Fireworks behaviour): every created model and the standalone base
sampler load their own copy of the model; training jobs run one at a time in arrival order; per-token
log-probabilities of a completion arrive in the stream's last chunk (text deltas arrive token by token); ``echo``
sends 0.0 as the first token's placeholder log-probability; ``load_weights`` always restores the optimizer too and
rejects ``optimizer=false``; only the local trainer's losses exist (``cross_entropy``, ``importance_sampling``,
``ppo``). Tests steer it with :meth:`~FireworksTrainingDouble.fail` (an HTTP error at a path),
:meth:`~FireworksTrainingDouble.fail_next_job` (a failed future) and
:meth:`~FireworksTrainingDouble.hold_next_completion` (a request kept running), and read what it received with
:meth:`~FireworksTrainingDouble.bodies` and :meth:`~FireworksTrainingDouble.futures`.

Use it as a context manager; it binds 127.0.0.1 on a free port and stops when the block ends::

    with FireworksTrainingDouble(model_dir) as double:
        client = FiretitanServiceClient(api_key=double.api_key, base_url=double.training_base_url)
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import tempfile
import threading
import time
import uuid
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from openclaw_cli.testing.served_double import ServedDouble
from openclaw_cli.types import AdamParams, Datum, SampleResult, SamplingParams, TokenChunk

SERVERLESS_PREFIX = "/training/v1/serverless"
DEFAULT_API_KEY = "fw-double-test-key"
DEFAULT_ACCOUNT = "double-account"
_ATTN_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj"]
_MLP_TARGETS = ["gate_proj", "up_proj", "down_proj"]
_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


class UserError(ValueError):
    """A request the service rejects as the caller's mistake (a failed future with category ``user``)."""


@dataclass
class Fault:
    """An HTTP error the double answers instead of handling a request."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class RecordedCall:
    """One request the double received: its path (below the serverless prefix for training calls) and JSON body."""

    method: str
    path: str
    body: Any
    headers: dict[str, str]


@dataclass
class FutureRecord:
    """One submitted request and how often its future was polled (``try_again`` answers included)."""

    path: str
    request_id: str
    future: Future[dict[str, Any]]
    polls: int = 0
    try_again: int = 0


class _Host:
    """The tiny model served by versioned LoRA with the local token-by-token sampler (version 0 = base)."""

    def __init__(
        self, model_dir: Path, make_trainer: Callable[[Any], Any] | None = None, targets: list[str] | None = None
    ) -> None:
        from openclaw_cli.backends.local.model_loading import load_model
        from openclaw_cli.backends.local.sampler import TransformersSampler
        from openclaw_cli.backends.local.serving import PolicyVersions
        from openclaw_cli.settings import LocalSettings, Settings

        settings = Settings(
            model=str(model_dir), local=LocalSettings(device="cpu", dtype="float32", sampler="transformers")
        )
        loaded = load_model(settings)
        self.tokenizer = loaded.tokenizer
        # The trainer copies the module tree before the serving wrappers go in (as the local backend does).
        self.trainer = make_trainer(loaded.model) if make_trainer is not None else None
        self.versions = PolicyVersions(loaded.model, targets or _ATTN_TARGETS + _MLP_TARGETS, keep=64)
        self.sampler = TransformersSampler(
            loaded.model,
            loaded.tokenizer,
            self.versions,
            max_concurrent=4,
            context_length=loaded.tokenizer.context_length,
        )
        self.sampler_paths: dict[str, int] = {}  # sampler checkpoint path -> served version

    def close(self) -> None:
        self.sampler.close()


class _Run(_Host):
    """One created LoRA model (a training run): a PEFT trainer plus its published sampler versions."""

    def __init__(
        self, model_dir: Path, session_id: str, run_id: str, seq: int, lora: dict[str, Any], state_root: Path
    ) -> None:
        from openclaw_cli.backends.local.trainer import LoraTrainer
        from openclaw_cli.settings import LoraSettings

        targets = (_ATTN_TARGETS if lora.get("train_attn", True) else []) + (
            _MLP_TARGETS if lora.get("train_mlp", True) else []
        )
        if not targets:
            raise UserError("lora_config trains neither attention nor MLP layers")
        rank = int(lora.get("rank") or 0)
        if rank < 1:
            raise UserError("this double trains LoRA only: lora_config.rank must be >= 1")
        self.lora_settings = LoraSettings(rank=rank, alpha=int(lora.get("alpha") or 2 * rank), targets=targets)
        seed = int(lora.get("seed") or 0)
        super().__init__(model_dir, lambda model: LoraTrainer(model, self.lora_settings, seed=seed), targets)
        self.session_id = session_id
        self.run_id = run_id
        self.model_id = f"{run_id}:train:{seq}"
        self.state_root = state_root

    @property
    def lora_trainer(self) -> Any:
        """The run's PEFT trainer (a _Run always has one)."""
        assert self.trainer is not None
        return self.trainer


class FireworksTrainingDouble(ServedDouble):
    """The double's state and HTTP app; see the module docstring for what it covers and what it simplifies."""

    def __init__(
        self,
        model_dir: Path,
        *,
        base_model: str | None = None,
        api_key: str = DEFAULT_API_KEY,
        account: str = DEFAULT_ACCOUNT,
        try_again_polls: int = 2,
        long_poll_s: float = 5.0,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.base_model = base_model or str(model_dir)
        self.api_key = api_key
        self.account = account
        self.try_again_polls = try_again_polls
        self.long_poll_s = long_poll_s
        self.calls: list[RecordedCall] = []
        self.try_again_answers = 0
        self._lock = threading.Lock()
        self._faults: dict[str, deque[Fault]] = {}
        self._job_faults: dict[str, deque[tuple[str, str]]] = {}
        self._jobs: dict[str, FutureRecord] = {}
        self._sessions: set[str] = set()
        self._runs: dict[str, _Run] = {}  # model_id -> run
        self._saved_states: dict[str, Path] = {}  # state path -> trainer save dir
        self._model_seq = 0
        self._base_host: _Host | None = None  # standalone base-model sampling (no training run needed)
        self._base_lock = threading.Lock()
        self.deleted_sessions: list[str] = []
        self._completion_gates: deque[threading.Event] = deque()
        self._state_root = Path(tempfile.mkdtemp(prefix="fw-training-double-"))
        # Training work runs one job at a time, in the order requests arrive (the SDK sends them in sequence order).
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="fw-double-trainer")
        self.app = self._build_app()

    # -- lifecycle --------------------------------------------------------------------------------------------

    @property
    def training_base_url(self) -> str:
        """What ``FiretitanServiceClient(base_url=...)`` takes for serverless training on this double."""
        return self.url + SERVERLESS_PREFIX

    def release(self) -> None:
        self._worker.shutdown(wait=True, cancel_futures=True)
        for run in list(self._runs.values()):
            run.close()
        self._runs.clear()
        if self._base_host is not None:
            self._base_host.close()
            self._base_host = None
        shutil.rmtree(self._state_root, ignore_errors=True)

    # -- test controls ----------------------------------------------------------------------------------------

    def fail(
        self, path: str, status: int, message: str = "injected failure", *, times: int = 1, **headers: str
    ) -> None:
        """Answer the next ``times`` requests to ``path`` (e.g. ``/api/v1/forward_backward``) with an HTTP error.

        Header keyword names use ``_`` for ``-`` (``x_should_retry="false"``).
        """
        body = {"error": {"message": message, "code": status}}
        fault = Fault(status, body, {k.replace("_", "-"): v for k, v in headers.items()})
        with self._lock:
            self._faults.setdefault(path, deque()).extend([fault] * times)

    def fail_next_job(self, path: str, message: str, *, category: str = "user") -> None:
        """Make the future of the next request to ``path`` fail with ``{"error": message, "category": ...}``."""
        with self._lock:
            self._job_faults.setdefault(path, deque()).append((message, category))

    def hold_next_completion(self) -> threading.Event:
        """Hold the next completion's final chunk back until the returned event is set (a request that is still
        running while something else happens, e.g. a publish)."""
        gate = threading.Event()
        with self._lock:
            self._completion_gates.append(gate)
        return gate

    def futures(self, path: str) -> list[FutureRecord]:
        """The futures of requests made to ``path``, oldest first."""
        with self._lock:
            return [job for job in self._jobs.values() if job.path == path]

    def bodies(self, path: str) -> list[Any]:
        """JSON bodies received at ``path``, oldest first."""
        with self._lock:
            return [c.body for c in self.calls if c.path == path]

    def run(self, model_id: str | None = None) -> _Run:
        """The created model (the only one when ``model_id`` is None), for tests that inspect trainer state."""
        with self._lock:
            if model_id is not None:
                return self._runs[model_id]
            if len(self._runs) != 1:
                raise LookupError(f"{len(self._runs)} models exist; name one")
            return next(iter(self._runs.values()))

    def served_version(self, sampler_path: str) -> int:
        """The version a sampler checkpoint path serves."""
        for run in list(self._runs.values()):
            if sampler_path in run.sampler_paths:
                return run.sampler_paths[sampler_path]
        raise KeyError(sampler_path)

    # -- app --------------------------------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        app = FastAPI(title="Fireworks training TEST DOUBLE")

        app.middleware("http")(self._record_auth_and_faults)

        @app.get("/v1/accounts")
        async def accounts() -> dict[str, Any]:
            return {"accounts": [{"name": f"accounts/{self.account}"}], "nextPageToken": ""}

        @app.delete("/v1/accounts/{account}/trainingSessions/{session_id}")
        async def delete_session(account: str, session_id: str) -> Response:
            with self._lock:
                known = account == self.account and session_id in self._sessions
                self._sessions.discard(session_id)
                if known:
                    self.deleted_sessions.append(session_id)
            return JSONResponse({}) if known else JSONResponse({"error": {"message": "not found"}}, status_code=404)

        p = SERVERLESS_PREFIX + "/api/v1"

        @app.post(p + "/create_sampling_route")
        async def create_sampling_route(request: Request) -> Response:
            body = await request.json()
            if "base_model" in body and body["base_model"] != self.base_model:
                message = f"base model {body['base_model']!r} is not available"
                return JSONResponse({"error": {"message": message}}, status_code=404)
            return JSONResponse({})

        @app.post(p + "/client/config")
        async def client_config() -> dict[str, Any]:
            return {}

        @app.post(p + "/create_session")
        async def create_session() -> dict[str, Any]:
            session_id = "ts-" + uuid.uuid4().hex[:16]
            with self._lock:
                self._sessions.add(session_id)
            return {"type": "create_session", "session_id": session_id}

        @app.post(p + "/session_heartbeat")
        async def session_heartbeat() -> dict[str, Any]:
            return {"type": "session_heartbeat"}

        @app.post(p + "/telemetry")
        async def telemetry() -> dict[str, Any]:
            return {"status": "accepted"}

        # The training calls the SDK polls as futures: each runs on the worker, in arrival order.
        futures: dict[str, tuple[Callable[[dict[str, Any]], dict[str, Any]], bool]] = {
            "create_model": (self._create_model, False),  # (the work, whether a planned fault sees the body)
            "forward_backward": (self._forward_backward, True),
            "optim_step": (self._optim_step, True),
            "save_weights_for_sampler": (self._save_for_sampler, True),
            "save_weights": (self._save_state, True),
            "load_weights": (self._load_state, True),
            "unload_model": (self._unload, True),
        }
        for name, (work, with_body) in futures.items():
            app.add_api_route(f"{p}/{name}", self._future_route(name, work, with_body), methods=["POST"])

        @app.post(p + "/retrieve_future")
        async def retrieve_future(request: Request) -> Response:
            body = await request.json()
            return await self._retrieve(str(body.get("request_id")))

        @app.post(SERVERLESS_PREFIX + "/inference/v1/completions")
        async def completions(request: Request) -> Response:
            return await self._completions(await request.json())

        return app

    async def _record_auth_and_faults(self, request: Request, call_next: Callable[[Request], Any]) -> Response:
        """Every call recorded; a wrong key answered 401; a planned fault answered instead of the route."""
        path = request.url.path
        short = path[len(SERVERLESS_PREFIX) :] if path.startswith(SERVERLESS_PREFIX) else path
        raw = await request.body()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        with self._lock:
            self.calls.append(RecordedCall(request.method, short, body, dict(request.headers)))
            faults = self._faults.get(short)
            fault = faults.popleft() if faults else None
        if not self._authorised(request):
            return JSONResponse({"error": {"message": "invalid API key", "code": "UNAUTHENTICATED"}}, status_code=401)
        if fault is not None:
            return JSONResponse(fault.body, status_code=fault.status, headers=fault.headers)
        return await call_next(request)

    def _future_route(
        self, name: str, work: Callable[[dict[str, Any]], dict[str, Any]], with_body: bool
    ) -> Callable[[Request], Awaitable[dict[str, Any]]]:
        async def route(request: Request) -> dict[str, Any]:
            body = await request.json()
            return self._submit(f"/api/v1/{name}", lambda: work(body), body if with_body else None)

        return route

    def _authorised(self, request: Request) -> bool:
        key = request.headers.get("x-api-key")
        bearer = request.headers.get("authorization", "")
        if bearer.lower().startswith("bearer "):
            key = key or bearer[7:]
        return key == self.api_key

    # -- futures ----------------------------------------------------------------------------------------------

    def _submit(self, path: str, work: Callable[[], dict[str, Any]], body: Any = None) -> dict[str, Any]:
        request_id = uuid.uuid4().hex
        with self._lock:
            planned = self._job_faults.get(path)
            injected = planned.popleft() if planned else None

        def run() -> dict[str, Any]:
            if injected is not None:
                message, category = injected
                raise (UserError(message) if category == "user" else RuntimeError(message))
            return work()

        future = self._worker.submit(run)
        with self._lock:
            self._jobs[request_id] = FutureRecord(path, request_id, future)
        answer: dict[str, Any] = {"request_id": request_id}
        if isinstance(body, dict) and body.get("model_id"):
            answer["model_id"] = body["model_id"]
        return answer

    async def _retrieve(self, request_id: str) -> Response:
        with self._lock:
            job = self._jobs.get(request_id)
            if job is not None:
                job.polls += 1
        if job is None:
            return JSONResponse({"error": {"message": f"unknown request_id {request_id}"}}, status_code=404)
        try_again = {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        if job.polls <= self.try_again_polls:
            with self._lock:
                self.try_again_answers += 1
                job.try_again += 1
            return JSONResponse(try_again)
        try:
            result = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job.future)), self.long_poll_s)
        except TimeoutError:
            with self._lock:
                job.try_again += 1
            return JSONResponse(try_again)
        except UserError as exc:
            return JSONResponse({"error": str(exc), "category": "user"})
        except Exception as exc:  # the double's own failure or an injected server error
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}", "category": "server"})
        return JSONResponse(result)

    # -- training jobs (run on the worker thread) -------------------------------------------------------------

    def _create_model(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("session_id") not in self._sessions:
            raise UserError(f"unknown session {body.get('session_id')!r}")
        if body.get("base_model") != self.base_model:
            raise UserError(
                f"base model {body.get('base_model')!r} is not available; this double serves {self.base_model!r}"
            )
        with self._lock:
            self._model_seq += 1
            seq = self._model_seq
        run_id = "run-" + uuid.uuid4().hex
        lora = body.get("lora_config") or {}
        run = _Run(self.model_dir, body["session_id"], run_id, seq, lora, self._state_root / run_id)
        with self._lock:
            self._runs[run.model_id] = run
        return {"type": "create_model", "model_id": run.model_id, "comms": "v1"}

    def _model(self, body: dict[str, Any]) -> _Run:
        run = self._runs.get(str(body.get("model_id")))
        if run is None:
            raise UserError(f"unknown model_id {body.get('model_id')!r}")
        return run

    def _forward_backward(self, body: dict[str, Any]) -> dict[str, Any]:
        run = self._model(body)
        spec = body["forward_backward_input"]
        datums = [_datum_from_wire(d) for d in spec["data"]]
        loss = spec["loss_fn"]
        config = spec.get("loss_fn_config") or None
        if loss not in ("cross_entropy", "importance_sampling", "ppo"):
            raise UserError(f"loss_fn {loss!r} is not supported by this double")
        try:
            result = run.lora_trainer.forward_backward(datums, loss, config)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
        return {
            "loss_fn_output_type": "ArrayRecord",
            "loss_fn_outputs": [
                {"logprobs": {"data": lps, "dtype": "float32", "shape": [len(lps)]}} for lps in result.logprobs
            ],
            "metrics": _wire_metrics(result.metrics),
        }

    def _optim_step(self, body: dict[str, Any]) -> dict[str, Any]:
        run = self._model(body)
        wire = body["adam_params"]
        adam = AdamParams(
            learning_rate=float(wire["learning_rate"]),
            beta1=float(wire["beta1"]),
            beta2=float(wire["beta2"]),
            eps=float(wire["eps"]),
            weight_decay=float(wire.get("weight_decay", 0.0)),
            grad_clip_norm=float(wire.get("grad_clip_norm", 0.0)),
        )
        try:
            step = run.lora_trainer.optim_step(adam)
        except (ValueError, RuntimeError) as exc:
            raise UserError(str(exc)) from exc
        return {"metrics": {"step": float(step.step), **step.metrics}}

    def _save_for_sampler(self, body: dict[str, Any]) -> dict[str, Any]:
        run = self._model(body)
        name = str(body.get("path") or "")
        if not _DNS_LABEL.match(name):
            raise UserError(f"sampler checkpoint name {name!r} must be a DNS label (a-z, 0-9, '-')")
        info = run.versions.publish(run.lora_trainer.lora_weights(), name)
        path = f"{self.account}/{run.run_id}/{name}"
        run.sampler_paths[path] = info.version
        return {"type": "save_weights_for_sampler", "path": path}

    def _save_state(self, body: dict[str, Any]) -> dict[str, Any]:
        run = self._model(body)
        name = str(body.get("path") or "")
        if not _DNS_LABEL.match(name):
            raise UserError(f"checkpoint name {name!r} must be a DNS label (a-z, 0-9, '-')")
        path = f"{self.account}/{run.run_id}/{name}"
        directory = run.state_root / name
        run.lora_trainer.save(directory)
        with self._lock:
            self._saved_states[path] = directory
        return {"type": "save_weights", "path": path}

    def _load_state(self, body: dict[str, Any]) -> dict[str, Any]:
        run = self._model(body)
        path = str(body.get("path"))
        if not body.get("optimizer"):
            raise UserError("this double restores weights together with the optimizer only (optimizer=true)")
        directory = self._saved_states.get(path)
        if directory is None:
            raise UserError(f"no checkpoint at {path!r}")
        try:
            run.lora_trainer.load(directory)
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot load {path!r}: {exc}") from exc
        return {"type": "load_weights", "path": path}

    def _unload(self, body: dict[str, Any]) -> dict[str, Any]:
        run = self._model(body)
        with self._lock:
            self._runs.pop(run.model_id, None)
        run.close()
        return {"type": "unload_model"}

    # -- sampling ---------------------------------------------------------------------------------------------

    def _resolve_sampling_model(self, model: str) -> tuple[_Host, int]:
        """The host and version a sampling model name selects: a session route (``.../trainingSessions/<ts>`` =
        base weights of the session's newest run, ``.../checkpoints/<path>`` = a saved sampler checkpoint) or a
        standalone route (``.../trainingSamplers/<base model>`` or ``.../trainingSamplers/checkpoints/<path>``)."""
        prefix = f"accounts/{self.account}/"
        if not model.startswith(prefix):
            raise UserError(f"unknown model {model!r}")
        rest = model[len(prefix) :]
        if rest.startswith("trainingSamplers/"):
            target = rest[len("trainingSamplers/") :]
            if target.startswith("checkpoints/"):
                return self._checkpoint_host(target[len("checkpoints/") :], None)
            if target != self.base_model:
                raise UserError(f"base model {target!r} is not available")
            return self._standalone_base(), 0
        match = re.fullmatch(r"trainingSessions/(ts-[a-z0-9]+)(?:/checkpoints/(.+))?", rest)
        if match is None or match.group(1) not in self._sessions:
            raise UserError(f"unknown model {model!r}")
        session, checkpoint = match.group(1), match.group(2)
        if checkpoint is not None:
            return self._checkpoint_host(checkpoint, session)
        runs = [run for run in self._runs.values() if run.session_id == session]
        if not runs:
            raise UserError("the session has no model, so no rollout route")
        return runs[-1], 0

    def _checkpoint_host(self, checkpoint: str, session: str | None) -> tuple[_Host, int]:
        for run in list(self._runs.values()):
            if checkpoint in run.sampler_paths and session in (None, run.session_id):
                return run, run.sampler_paths[checkpoint]
        raise UserError(f"unknown sampler checkpoint {checkpoint!r}")

    def _standalone_base(self) -> _Host:
        with self._base_lock:
            if self._base_host is None:
                self._base_host = _Host(self.model_dir)
            return self._base_host

    async def _completions(self, payload: dict[str, Any]) -> Response:
        try:
            # Off the event loop: the first standalone base request loads a model.
            run, version = await asyncio.to_thread(self._resolve_sampling_model, str(payload.get("model")))
            prompt = [int(t) for t in payload["prompt"]]
            top_k = int(payload.get("top_k") or 0)
            params = SamplingParams(
                max_tokens=int(payload.get("max_tokens") or 16),
                temperature=float(payload.get("temperature", 1.0)),
                top_p=float(payload.get("top_p") or 1.0),
                top_k=top_k if top_k > 0 else -1,
                stop=tuple(payload.get("stop") or ()),
                seed=payload.get("seed"),
            )
        except (UserError, KeyError, TypeError, ValueError) as exc:
            return JSONResponse({"error": {"message": str(exc), "code": 400}}, status_code=400)
        if int(payload.get("n") or 1) != 1:
            return JSONResponse({"error": {"message": "this double samples n=1 per request"}}, status_code=400)
        with self._lock:
            gate = self._completion_gates.popleft() if self._completion_gates else None
        if payload.get("echo"):
            events = self._echo_events(run, version, prompt, params)
        else:
            events = self._stream_events(run, version, prompt, params, gate)
        return StreamingResponse(events, media_type="text/event-stream")

    async def _stream_events(
        self, run: _Host, version: int, prompt: list[int], params: SamplingParams, gate: threading.Event | None = None
    ) -> AsyncIterator[bytes]:
        completion_id = "cmpl-" + uuid.uuid4().hex[:12]
        try:
            async for event in run.sampler.stream(prompt, params, version):
                if isinstance(event, TokenChunk):
                    yield _sse(
                        {
                            "id": completion_id,
                            "object": "text_completion",
                            "choices": [{"index": 0, "text": event.text, "finish_reason": None}],
                        }
                    )
                elif isinstance(event, SampleResult):
                    while gate is not None and not gate.is_set():
                        await asyncio.sleep(0.01)
                    yield _sse(self._final_chunk(completion_id, run, prompt, event, echo_logprobs=None))
        except Exception as exc:  # the stream has started: report the failure in-band, as the service does
            yield _sse({"error": {"message": f"{type(exc).__name__}: {exc}", "code": 500}}, event="error")
            return
        yield b"data: [DONE]\n\n"

    async def _echo_events(
        self, run: _Host, version: int, prompt: list[int], params: SamplingParams
    ) -> AsyncIterator[bytes]:
        completion_id = "cmpl-" + uuid.uuid4().hex[:12]
        try:
            prompt_logprobs = await run.sampler.compute_logprobs(prompt, version=version)
            result = await run.sampler.sample(prompt, params, version)
        except Exception as exc:
            yield _sse({"error": {"message": f"{type(exc).__name__}: {exc}", "code": 500}}, event="error")
            return
        yield _sse(self._final_chunk(completion_id, run, prompt, result, echo_logprobs=prompt_logprobs))
        yield b"data: [DONE]\n\n"

    def _final_chunk(
        self,
        completion_id: str,
        run: _Host,
        prompt: list[int],
        result: SampleResult,
        *,
        echo_logprobs: list[float | None] | None,
    ) -> dict[str, Any]:
        tokenizer = run.tokenizer
        content = []
        if echo_logprobs is not None:
            # Echo: one row per prompt token too. The first token has no context; the service sends a placeholder
            # number there (the SDK drops that row), and prompt rows carry no sampling log-probability.
            for i, token in enumerate(prompt):
                lp = echo_logprobs[i]
                content.append(
                    {
                        "token": tokenizer.decode([token]),
                        "token_id": token,
                        "logprob": 0.0 if lp is None else lp,
                        "sampling_logprob": None,
                    }
                )
        sampling = result.sampling_logprobs or result.logprobs
        for token, lp, slp in zip(result.tokens, result.logprobs, sampling, strict=True):
            content.append(
                {"token": tokenizer.decode([token]), "token_id": token, "logprob": lp, "sampling_logprob": slp}
            )
        completion_ids = (list(prompt) if echo_logprobs is not None else []) + list(result.tokens)
        return {
            "id": completion_id,
            "object": "text_completion",
            "created": int(time.time()),
            "choices": [
                {
                    "index": 0,
                    "text": "" if echo_logprobs is None else result.text,
                    "finish_reason": result.finish_reason,
                    "logprobs": {"content": content},
                    "raw_output": {"prompt_token_ids": list(prompt), "completion_token_ids": completion_ids},
                }
            ],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(result.tokens),
                "total_tokens": len(prompt) + len(result.tokens),
            },
        }


def _wire_metrics(metrics: dict[str, float]) -> dict[str, float]:
    """Tinker's metric names carry their reduction over chunks after a colon (``loss:sum``, ``kl:mean``)."""
    out = {}
    for key, value in metrics.items():
        if ":" not in key:
            key += ":sum" if key.startswith("n_") else ":mean"
        out[key] = float(value)
    return out


def _sse(data: dict[str, Any], *, event: str | None = None) -> bytes:
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def _tensor_values(tensor: dict[str, Any]) -> list[float]:
    if tensor.get("sparse_crow_indices") is not None:
        raise UserError("sparse tensors are not supported by this double")
    return list(tensor["data"])


def _datum_from_wire(wire: dict[str, Any]) -> Datum:
    tokens: list[int] = []
    for chunk in wire["model_input"]["chunks"]:
        if chunk.get("type") != "encoded_text":
            raise UserError(f"model_input chunk type {chunk.get('type')!r} is not supported by this double")
        tokens.extend(int(t) for t in chunk["tokens"])
    inputs = {key: _tensor_values(value) for key, value in wire.get("loss_fn_inputs", {}).items()}
    inputs["target_tokens"] = [int(t) for t in inputs.get("target_tokens", [])]
    try:
        return Datum(model_input=tokens, loss_fn_inputs=inputs)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
