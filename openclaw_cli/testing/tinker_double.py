"""TEST DOUBLE of the Tinker service, spoken to through the same Python interface as the ``tinker`` SDK.

:class:`TinkerDouble` stands in for the service; its :meth:`~TinkerDouble.service_client` is a drop-in for
``tinker.ServiceClient`` (pass it as the Tinker backend's ``service_client_factory``). The clients it hands out
implement the methods openclaw's Tinker backend calls — ``ServiceClient.create_lora_training_client`` /
``create_training_client_from_state_with_optimizer`` / ``create_sampling_client`` / ``get_server_capabilities`` /
``close``, ``TrainingClient.forward_backward`` / ``optim_step`` / ``save_state`` / ``save_weights_for_sampler`` /
``save_weights_and_get_sampling_client`` / ``create_sampling_client``, ``SamplingClient.sample`` /
``compute_logprobs`` — with the real ``tinker.types`` classes going in and out, and every call returns a future
(a real ``tinker.APIFuture``: ``await``, ``result_async()``, ``result()``) that runs in the background, as the SDK's do.

The math is real, done by the local backend's pieces on a local model (the tiny test model): training is
:class:`openclaw_cli.backends.local.trainer.LoraTrainer` (PEFT LoRA, Tinker's summed losses from
:mod:`openclaw_cli.backends.local.losses`), sampling is :class:`openclaw_cli.backends.local.sampler.TransformersSampler`
over versioned LoRA weights (:mod:`openclaw_cli.backends.local.serving`). Each training client's calls run one at a
time in submission order, as Tinker's do; sampling clients run concurrently and each serves the weights it was
created with, forever.

For tests it records every call (:attr:`TinkerDouble.received`), can fail the next call of a method with any
exception (:meth:`fail_next`; :func:`status_error` / :func:`timeout_error` build the SDK's own exception classes),
and can hold calls of a method at a gate until released (:meth:`hold` / :meth:`release`).

Not like the real service: one local base model whatever its name (``model_name``, default the model dir); the
LoRA ``alpha`` is this double's setting (Tinker does not document its own); ``train_unembed`` is ignored (the
tiny model ties its embeddings); only the ``cross_entropy``, ``importance_sampling`` and ``ppo`` losses; sampled
logprobs are the policy's raw (temperature 1) log-probabilities, rounded to float32 as the wire carries them;
``sample`` ignores top-k/prompt-logprob extras and cannot disable EOS (``stop=[]``); checkpoints live in a temp dir
of this process. Never use it outside tests.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import shutil
import tempfile
import threading
import uuid
from collections import defaultdict, deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import tinker
from tinker import types

from openclaw_cli.backend import BackendError
from openclaw_cli.settings import DEFAULT_LORA_TARGETS, LoraSettings, Settings
from openclaw_cli.types import AdamParams, Datum, SamplingParams

T = TypeVar("T")
ATTENTION_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP_TARGETS = ("gate_proj", "up_proj", "down_proj")
GATE_TIMEOUT_S = 30.0  # a held call fails instead of hanging a test forever
_FAKE_URL = "https://tinker-double.invalid/api/v1/"
_STATUS_ERRORS: dict[int, type[tinker.APIStatusError]] = {
    400: tinker.BadRequestError,
    401: tinker.AuthenticationError,
    402: tinker.BillingError,
    403: tinker.PermissionDeniedError,
    404: tinker.NotFoundError,
    409: tinker.ConflictError,
    422: tinker.UnprocessableEntityError,
    429: tinker.RateLimitError,
}


def status_error(status: int, message: str | None = None, *, endpoint: str = "request") -> tinker.APIStatusError:
    """The exception the tinker SDK raises for an HTTP ``status`` answer (its own class for that code)."""
    request = httpx.Request("POST", _FAKE_URL + endpoint)
    text = message or f"Error code: {status}"
    response = httpx.Response(status, request=request, json={"detail": text})
    cls = _STATUS_ERRORS.get(status, tinker.InternalServerError if status >= 500 else tinker.APIStatusError)
    return cls(text, response=response, body={"detail": text})


def timeout_error(endpoint: str = "request") -> tinker.APITimeoutError:
    """The exception the tinker SDK raises when a request times out."""
    return tinker.APITimeoutError(request=httpx.Request("POST", _FAKE_URL + endpoint))


@dataclass
class ReceivedCall:
    """One SDK call the double received: the method, the client it came from and its arguments as given."""

    method: str
    client: str
    args: dict[str, Any] = field(default_factory=dict)


class DoubleFuture(tinker.APIFuture[T]):
    """A ``tinker.APIFuture`` over a ``concurrent.futures.Future`` (what the SDK's futures wrap too)."""

    def __init__(self, future: concurrent.futures.Future[T]) -> None:
        self._future = future

    async def result_async(self, timeout: float | None = None) -> T:
        return await asyncio.wait_for(asyncio.wrap_future(self._future), timeout)

    def result(self, timeout: float | None = None) -> T:
        return self._future.result(timeout)

    def future(self) -> concurrent.futures.Future[T]:
        return self._future


@dataclass
class _SavedState:
    directory: Path
    rank: int
    targets: tuple[str, ...]


class TinkerDouble:
    """The stand-in service: one local model, the clients it hands out, and the test hooks (module docstring)."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        model_name: str | None = None,
        lora_alpha: int = 32,
        seed: int = 0,
        max_concurrent: int = 4,
    ) -> None:
        from openclaw_cli.backends.local.model_loading import load_model
        from openclaw_cli.backends.local.sampler import TransformersSampler
        from openclaw_cli.backends.local.serving import PolicyVersions
        from openclaw_cli.backends.local.trainer import structural_copy

        self.model_name = model_name or str(model_dir)
        self.lora_alpha = lora_alpha
        self.seed = seed
        self.received: list[ReceivedCall] = []
        self.api_keys: list[str | None] = []  # the key each service client was made with (tests check passing)
        self._failures: dict[str, deque[BaseException]] = defaultdict(deque)
        self._gates: dict[str, threading.Event] = {}
        self._waiting: dict[str, int] = defaultdict(int)
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._states: dict[str, _SavedState] = {}
        self._sampler_paths: dict[str, int] = {}
        self._state_root = Path(tempfile.mkdtemp(prefix="tinker-double-"))

        loaded = load_model(Settings(model=str(model_dir), local={"device": "cpu", "dtype": "float32"}))
        self.tokenizer = loaded.tokenizer
        self.context_length = loaded.tokenizer.context_length
        # Trainers copy this never-wrapped tree; the served model gets the versioned LoRA wrappers below.
        self._train_base = structural_copy(loaded.model)
        self._versions = PolicyVersions(loaded.model, list(DEFAULT_LORA_TARGETS), keep=1_000_000)
        self.sampler = TransformersSampler(
            loaded.model,
            loaded.tokenizer,
            self._versions,
            max_concurrent=max_concurrent,
            context_length=loaded.tokenizer.context_length,
        )
        self._service_pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="tinker-double")
        # The SDK runs its requests on its own event loop thread; the double does the same for sampling.
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, name="tinker-double-loop", daemon=True)
        self._loop_thread.start()
        self._training_clients: list[DoubleTrainingClient] = []

    # -- test hooks ----------------------------------------------------------------------------------------------

    def service_client(self, *, base_url: str | None = None, api_key: str | None = None, **_: Any) -> Any:
        """Drop-in for ``tinker.ServiceClient(base_url=..., api_key=...)``."""
        self.api_keys.append(api_key)
        return DoubleServiceClient(self, base_url)

    def rest_client(self, *, base_url: str | None = None, api_key: str | None = None) -> Any:
        """Drop-in for ``tinker.RestClient(base_url=..., api_key=...)`` (only ``get_server_capabilities``)."""
        self.api_keys.append(api_key)
        return DoubleServiceClient(self, base_url)

    def fail_next(self, method: str, error: BaseException, times: int = 1) -> None:
        """The next ``times`` calls of ``method`` (e.g. "sample", "forward_backward") raise ``error``."""
        with self._lock:
            self._failures[method].extend([error] * times)

    def hold(self, method: str) -> None:
        """Calls of ``method`` wait (in the background, their futures pending) until :meth:`release`."""
        with self._lock:
            self._gates[method] = threading.Event()

    def release(self, method: str) -> None:
        with self._lock:
            gate = self._gates.pop(method, None)
        if gate is not None:
            gate.set()

    def waiting(self, method: str) -> int:
        """How many calls of ``method`` are waiting at its gate right now."""
        with self._lock:
            return self._waiting[method]

    def reset(self) -> None:
        """Forget recorded calls and queued failures and open every gate (between tests sharing one double)."""
        for method in list(self._gates):
            self.release(method)
        with self._lock:
            self.received.clear()
            self.api_keys.clear()
            self._failures.clear()

    def calls(self, method: str) -> list[ReceivedCall]:
        return [c for c in self.received if c.method == method]

    def close(self) -> None:
        for method in list(self._gates):
            self.release(method)
        self.sampler.close()
        self._service_pool.shutdown(wait=False, cancel_futures=True)
        for client in self._training_clients:
            client.executor.shutdown(wait=False, cancel_futures=True)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(timeout=5)
        shutil.rmtree(self._state_root, ignore_errors=True)

    # -- plumbing for the clients --------------------------------------------------------------------------------

    def submit(
        self,
        method: str,
        client: str,
        args: dict[str, Any],
        work: Callable[[], T],
        executor: concurrent.futures.Executor | None = None,
    ) -> DoubleFuture[T]:
        """Record the call and run ``work`` in the background (on ``executor``, default the shared pool)."""
        with self._lock:
            self.received.append(ReceivedCall(method, client, args))

        def run() -> T:
            self._pass_gate(method)
            self._raise_injected(method)
            return work()

        return DoubleFuture((executor or self._service_pool).submit(run))

    def submit_async(
        self, method: str, client: str, args: dict[str, Any], work: Callable[[], Coroutine[Any, Any, T]]
    ) -> DoubleFuture[T]:
        """Like :meth:`submit` for a coroutine, run on the double's own event loop."""
        with self._lock:
            self.received.append(ReceivedCall(method, client, args))

        async def run() -> T:
            await asyncio.to_thread(self._pass_gate, method)
            self._raise_injected(method)
            return await work()

        return DoubleFuture(asyncio.run_coroutine_threadsafe(run(), self._loop))

    def _pass_gate(self, method: str) -> None:
        with self._lock:
            gate = self._gates.get(method)
            if gate is None:
                return
            self._waiting[method] += 1
        try:
            if not gate.wait(GATE_TIMEOUT_S):
                raise TimeoutError(f"tinker double: {method} held at its gate for {GATE_TIMEOUT_S} s")
        finally:
            with self._lock:
                self._waiting[method] -= 1

    def _raise_injected(self, method: str) -> None:
        with self._lock:
            queue = self._failures.get(method)
            error = queue.popleft() if queue else None
        if error is not None:
            raise error

    def register_training_client(self, client: DoubleTrainingClient) -> None:
        with self._lock:
            self._training_clients.append(client)

    def new_id(self, kind: str) -> str:
        return f"double-{kind}-{next(self._ids)}-{uuid.uuid4().hex[:8]}"

    def check_model(self, base_model: str | None) -> None:
        if base_model is not None and base_model != self.model_name:
            offered = self.model_name
            raise status_error(400, f"base model {base_model!r} is not supported; this service offers {offered}")

    def new_trainer(self, rank: int, targets: tuple[str, ...]) -> Any:
        from openclaw_cli.backends.local.trainer import LoraTrainer

        lora = LoraSettings(rank=rank, alpha=self.lora_alpha, targets=list(targets))
        return LoraTrainer(self._train_base, lora, seed=self.seed)

    def publish_weights(self, trainer: Any) -> int:
        """Register the trainer's present LoRA weights as a served version; returns its number."""
        return self._versions.publish(trainer.lora_weights()).version

    def sampling_client(self, version: int, label: str) -> DoubleSamplingClient:
        return DoubleSamplingClient(self, version, label)

    def remember_state(self, path: str, state: _SavedState) -> None:
        with self._lock:
            self._states[path] = state

    def saved_state(self, path: str) -> _SavedState:
        with self._lock:
            state = self._states.get(path)
        if state is None:
            raise status_error(404, f"no checkpoint at {path}")
        return state

    def remember_sampler_path(self, path: str, version: int) -> None:
        with self._lock:
            self._sampler_paths[path] = version

    def sampler_version(self, path: str) -> int:
        with self._lock:
            version = self._sampler_paths.get(path)
        if version is None:
            raise status_error(404, f"no sampler weights at {path}")
        return version

    def state_dir(self, model_id: str, name: str) -> Path:
        return self._state_root / model_id.replace(":", "_") / name


class DoubleServiceClient:
    """Drop-in for ``tinker.ServiceClient`` (the methods openclaw uses)."""

    def __init__(self, double: TinkerDouble, base_url: str | None) -> None:
        self.double = double
        self.base_url = base_url
        self.id = double.new_id("service")
        self.closed_with: str | None = None

    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: Any = None,
    ) -> DoubleFuture[DoubleTrainingClient]:
        args = {"base_model": base_model, "rank": rank, "seed": seed, "train_mlp": train_mlp, "train_attn": train_attn}

        def work() -> DoubleTrainingClient:
            self.double.check_model(base_model)
            targets = (ATTENTION_TARGETS if train_attn else ()) + (MLP_TARGETS if train_mlp else ())
            if not targets:
                raise status_error(400, "train_attn and train_mlp are both off: nothing to train")
            return DoubleTrainingClient(self.double, base_model, self.double.new_trainer(rank, targets), rank, targets)

        return self.double.submit("create_lora_training_client", self.id, args, work)

    def create_training_client_from_state_with_optimizer(
        self, path: str, base_model: str | None = None, **_: Any
    ) -> DoubleFuture[DoubleTrainingClient]:
        def work() -> DoubleTrainingClient:
            state = self.double.saved_state(path)
            trainer = self.double.new_trainer(state.rank, state.targets)
            trainer.load(state.directory)
            return DoubleTrainingClient(self.double, self.double.model_name, trainer, state.rank, state.targets)

        return self.double.submit("create_training_client_from_state_with_optimizer", self.id, {"path": path}, work)

    def create_sampling_client(
        self, model_path: str | None = None, base_model: str | None = None, **_: Any
    ) -> DoubleFuture[DoubleSamplingClient]:
        if model_path is None and base_model is None:
            raise ValueError("Either model_path or base_model must be provided")  # as the SDK, at call time

        def work() -> DoubleSamplingClient:
            if model_path is not None:
                return self.double.sampling_client(self.double.sampler_version(model_path), model_path)
            self.double.check_model(base_model)
            return self.double.sampling_client(0, f"base:{base_model}")

        args = {"model_path": model_path, "base_model": base_model}
        return self.double.submit("create_sampling_client", self.id, args, work)

    def get_server_capabilities(self) -> DoubleFuture[types.GetServerCapabilitiesResponse]:
        def work() -> types.GetServerCapabilitiesResponse:
            model = types.SupportedModel(
                model_name=self.double.model_name,
                max_context_length=self.double.context_length,
                trainable=True,
                sampleable=True,
            )
            return types.GetServerCapabilitiesResponse(supported_models=[model])

        return self.double.submit("get_server_capabilities", self.id, {}, work)

    def close(self, status: str, detail: str | None = None) -> DoubleFuture[None]:
        def work() -> None:
            self.closed_with = status

        return self.double.submit("close", self.id, {"status": status, "detail": detail}, work)


class DoubleTrainingClient:
    """Drop-in for ``tinker.TrainingClient``; its calls run one at a time in submission order."""

    def __init__(
        self, double: TinkerDouble, base_model: str, trainer: Any, rank: int, targets: tuple[str, ...]
    ) -> None:
        self.double = double
        self.base_model = base_model
        self.model_id = double.new_id("train")
        self.trainer = trainer
        self.rank = rank
        self.targets = targets
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="tinker-double-train")
        double.register_training_client(self)

    def forward_backward(
        self, data: list[types.Datum], loss_fn: str, loss_fn_config: dict[str, float] | None = None
    ) -> DoubleFuture[types.ForwardBackwardOutput]:
        args = {"data": list(data), "loss_fn": loss_fn, "loss_fn_config": loss_fn_config}

        def work() -> types.ForwardBackwardOutput:
            datums = [_our_datum(d) for d in data]
            try:
                result = self.trainer.forward_backward(datums, loss_fn, dict(loss_fn_config or {}) or None)
            except ValueError as exc:
                raise status_error(400, str(exc), endpoint="forward_backward") from exc
            outputs = [
                {"logprobs": types.TensorData(data=np.asarray(lp, dtype=np.float32), dtype="float32", shape=[len(lp)])}
                for lp in result.logprobs
            ]
            return types.ForwardBackwardOutput(
                loss_fn_output_type="ArrayRecord", loss_fn_outputs=outputs, metrics={"loss:sum": result.loss}
            )

        return self.double.submit("forward_backward", self.model_id, args, work, self.executor)

    def optim_step(
        self, optim_params: types.AdamParams | None = None, *, adam_params: types.AdamParams | None = None
    ) -> DoubleFuture[types.OptimStepResponse]:
        params = optim_params if optim_params is not None else adam_params
        if not isinstance(params, types.AdamParams):
            raise TypeError("Expected AdamParams")  # as the SDK, at call time

        def work() -> types.OptimStepResponse:
            adam = AdamParams(
                learning_rate=params.learning_rate,
                beta1=params.beta1,
                beta2=params.beta2,
                eps=params.eps,
                weight_decay=params.weight_decay,
                grad_clip_norm=params.grad_clip_norm,
            )
            try:
                step = self.trainer.optim_step(adam)
            except (ValueError, RuntimeError) as exc:
                raise status_error(400, str(exc), endpoint="optim_step") from exc
            return types.OptimStepResponse(metrics={"grad_norm": step.metrics["grad_norm"]})

        return self.double.submit("optim_step", self.model_id, {"adam_params": params}, work, self.executor)

    def save_state(
        self, name: str, ttl_seconds: int | None = None, **_: Any
    ) -> DoubleFuture[types.SaveWeightsResponse]:
        def work() -> types.SaveWeightsResponse:
            directory = self.double.state_dir(self.model_id, name)
            self.trainer.save(directory)
            path = f"tinker://{self.model_id}/weights/{name}"
            self.double.remember_state(path, _SavedState(directory, self.rank, self.targets))
            return types.SaveWeightsResponse(path=path)

        return self.double.submit("save_state", self.model_id, {"name": name}, work, self.executor)

    def load_state_with_optimizer(self, path: str, **_: Any) -> DoubleFuture[types.LoadWeightsResponse]:
        """Weights and optimizer state of a ``save_state`` checkpoint into this client, in submission order."""

        def work() -> types.LoadWeightsResponse:
            state = self.double.saved_state(path)
            if (state.rank, state.targets) != (self.rank, self.targets):
                raise status_error(400, f"checkpoint {path} has another LoRA shape than this training run")
            self.trainer.load(state.directory)
            return types.LoadWeightsResponse(path=path)

        return self.double.submit("load_state_with_optimizer", self.model_id, {"path": path}, work, self.executor)

    def save_weights_for_sampler(
        self, name: str, ttl_seconds: int | None = None, **_: Any
    ) -> DoubleFuture[types.SaveWeightsForSamplerResponse]:
        def work() -> types.SaveWeightsForSamplerResponse:
            version = self.double.publish_weights(self.trainer)
            path = f"tinker://{self.model_id}/sampler_weights/{name}"
            self.double.remember_sampler_path(path, version)
            return types.SaveWeightsForSamplerResponse(path=path)

        return self.double.submit("save_weights_for_sampler", self.model_id, {"name": name}, work, self.executor)

    def save_weights_and_get_sampling_client(
        self, name: str | None = None, retry_config: Any = None, **_: Any
    ) -> DoubleFuture[DoubleSamplingClient]:
        def work() -> DoubleSamplingClient:
            version = self.double.publish_weights(self.trainer)
            return self.double.sampling_client(version, f"{self.model_id}/ephemeral-{version}")

        return self.double.submit("save_weights_and_get_sampling_client", self.model_id, {}, work, self.executor)

    def create_sampling_client(self, model_path: str, retry_config: Any = None, **_: Any) -> Any:
        def work() -> DoubleSamplingClient:
            return self.double.sampling_client(self.double.sampler_version(model_path), model_path)

        return self.double.submit("create_sampling_client", self.model_id, {"model_path": model_path}, work)


class DoubleSamplingClient:
    """Drop-in for ``tinker.SamplingClient``: serves the weights it was created with."""

    def __init__(self, double: TinkerDouble, version: int, label: str) -> None:
        self.double = double
        self.version = version  # the double's internal number, for tests; the SDK exposes nothing like it
        self.label = label
        self.id = double.new_id("sampler")

    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        **_: Any,
    ) -> DoubleFuture[types.SampleResponse]:
        tokens = prompt.to_ints()
        ours = _our_sampling_params(sampling_params)
        args = {"prompt": tokens, "num_samples": num_samples, "sampling_params": sampling_params}

        async def work() -> types.SampleResponse:
            sequences = []
            for i in range(num_samples):
                params = ours if ours.seed is None else SamplingParams(**{**ours.__dict__, "seed": ours.seed + i})
                sampling = self.double.sampler.sample(tokens, params, self.version)
                result = await self._bad_request_on_backend_error(sampling)
                sequences.append(
                    types.SampledSequence(
                        stop_reason=result.finish_reason,
                        sequence_id=uuid.uuid4().hex,
                        tokens_np=np.asarray(result.tokens, dtype=np.int32),
                        logprobs_np=np.asarray(result.logprobs, dtype=np.float32),
                    )
                )
            prompt_logprobs = None
            if include_prompt_logprobs:
                scored = await self._score(tokens)
                prompt_logprobs = np.asarray([np.nan if v is None else v for v in scored], dtype=np.float32)
            return types.SampleResponse(sequences=sequences, prompt_logprobs_np=prompt_logprobs)

        return self.double.submit_async("sample", self.id, args, work)

    def compute_logprobs(self, prompt: types.ModelInput, **_: Any) -> DoubleFuture[list[float | None]]:
        tokens = prompt.to_ints()
        return self.double.submit_async("compute_logprobs", self.id, {"prompt": tokens}, lambda: self._score(tokens))

    async def _score(self, tokens: list[int]) -> list[float | None]:
        values = await self._bad_request_on_backend_error(
            self.double.sampler.compute_logprobs(tokens, version=self.version)
        )
        return [None if v is None else float(np.float32(v)) for v in values]

    @staticmethod
    async def _bad_request_on_backend_error(waiting: Coroutine[Any, Any, T]) -> T:
        try:
            return await waiting
        except BackendError as exc:  # the local sampler's own errors become what the service would answer
            raise status_error(400 if exc.status_code == 400 else 500, str(exc), endpoint="asample") from exc


def _our_datum(datum: types.Datum) -> Datum:
    inputs = {key: [float(v) for v in value.tolist()] for key, value in datum.loss_fn_inputs.items()}
    return Datum(model_input=datum.model_input.to_ints(), loss_fn_inputs=inputs)


def _our_sampling_params(params: types.SamplingParams) -> SamplingParams:
    if params.max_tokens is None:
        raise status_error(400, "sampling_params.max_tokens is required by this double")
    stop = params.stop
    strings: tuple[str, ...] = ()
    ids: tuple[int, ...] = ()
    if isinstance(stop, str):
        strings = (stop,)
    elif stop is not None:
        items: list[Any] = list(stop)
        if not items:
            raise NotImplementedError("the tinker double cannot disable EOS (stop=[])")
        if all(isinstance(s, str) for s in items):
            strings = tuple(items)
        else:
            ids = tuple(int(s) for s in items)
    return SamplingParams(
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,
        stop=strings,
        stop_token_ids=ids,
        seed=params.seed,
    )
