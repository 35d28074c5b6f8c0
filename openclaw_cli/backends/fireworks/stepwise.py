"""Fireworks step-wise training: the policy trains through ``fireworks.training.sdk`` and serves from its samplers.

``FireworksBackend`` delegates here when ``fireworks.mode = "stepwise"``. Fireworks' training SDK speaks Tinker's
protocol, so this is a binding of the shared core :class:`openclaw_cli.backends.tinker_shaped.TinkerShapedBackend`
(which holds serving, version swaps, training calls and checkpoint records; read its docstring). What is
Fireworks-specific lives here:

- **connection**: ``FiretitanServiceClient(api_key, base_url)`` on the serverless endpoint
  (``fireworks.training_base_url``, else ``{fireworks.base_url or https://api.fireworks.ai}/training/v1/serverless``);
  key from ``fireworks.api_key`` or ``FIREWORKS_API_KEY``; the base model is ``fireworks.base_model`` (a Fireworks
  name) and the chat tokenizer comes from ``fireworks.tokenizer`` or ``model`` (an HF id or path);
- **publish**: ``save_weights_for_sampler(name)`` then ``create_sampling_client(model_path)`` (the SDK has no
  combined call); the core swaps serving to the new sampler only once it exists, and running requests finish on
  the sampler they started with;
- **sampling**: token-id prompts through the sampling client's own ``DeploymentSampler`` (the request
  ``FiretitanSamplingClient.sample`` sends), because ``sample`` hands back only the behaviour-policy
  log-probabilities, while training needs the raw ones (``logprob``), which the same response carries; prompt
  log-probabilities (the OPD teacher) come from the same endpoint with ``echo``;
- **resume**: a new LoRA run with *our* rank and alpha, then ``load_state_with_optimizer(path)``. (The SDK's
  ``create_training_client_from_state_with_optimizer`` re-creates the run from checkpoint metadata that carries no
  alpha, so it would silently train with alpha 32.)

Several SDK calls block (session and run creation, ``save_weights_for_sampler``, opening samplers); the adapters
below run those in worker threads so serving never stalls behind them. Requests that order training work
(``forward_backward``, ``optim_step``, ``save_state``) are submitted on the caller's thread, which fixes their
order on the service, and only their results are awaited.
"""

from __future__ import annotations

import asyncio
import logging
import re
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from openclaw_cli.backend import BackendError, Check
from openclaw_cli.backends.tinker_shaped import TinkerShapedBackend, TinkerShapedSdk
from openclaw_cli.settings import env_secret

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings
    from openclaw_cli.tokenizer import HFChatTokenizer

log = logging.getLogger("openclaw.fireworks.stepwise")

DEFAULT_API_ROOT = "https://api.fireworks.ai"
SERVERLESS_SUFFIX = "/training/v1/serverless"
KEY_ENV = "FIREWORKS_API_KEY"
INSTALL_HINT = "pip install 'fireworks-ai[training-sdk]'"
_ATTN = frozenset({"q_proj", "k_proj", "v_proj", "o_proj"})
_MLP = frozenset({"gate_proj", "up_proj", "down_proj"})
_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
NOT_ENABLED_HINT = (
    "step-wise training (fireworks.training.sdk) is a private preview that this Fireworks account or key cannot "
    'use; ask Fireworks for access, or set fireworks.mode = "batch" to train with batch jobs instead'
)

ServiceClientFactory = Callable[[str, str], Any]
"""``(api_key, training_base_url) -> FiretitanServiceClient``-like; called in a worker thread (it opens a session)."""


def default_service_client(api_key: str, base_url: str) -> Any:
    from fireworks.training.sdk import FiretitanServiceClient

    return FiretitanServiceClient(api_key=api_key, base_url=base_url)


# -- settings ------------------------------------------------------------------------------------------------------


def training_base_url(settings: Settings) -> str:
    """``fireworks.training_base_url``, else the serverless endpoint under ``fireworks.base_url`` (or the public
    API root)."""
    fw = settings.fireworks
    if fw.training_base_url:
        return fw.training_base_url.rstrip("/")
    root = (fw.base_url or DEFAULT_API_ROOT).rstrip("/")
    for suffix in ("/inference/v1", "/inference", "/v1"):
        if root.endswith(suffix):
            root = root[: -len(suffix)]
            break
    return root + SERVERLESS_SUFFIX


def is_fireworks_model_name(name: str | None) -> bool:
    return bool(name) and str(name).startswith("accounts/")


def base_model_name(settings: Settings) -> str:
    """The Fireworks base model to train: ``fireworks.base_model``, else ``model`` when it is a Fireworks name."""
    if settings.fireworks.base_model:
        return settings.fireworks.base_model
    if is_fireworks_model_name(settings.model):
        return str(settings.model)
    raise BackendError(
        "the Fireworks backend needs a Fireworks base model: set fireworks.base_model "
        "(e.g. accounts/fireworks/models/qwen3-8b) or model to such a name"
    )


def tokenizer_source(settings: Settings) -> str:
    """Where the chat tokenizer comes from: ``fireworks.tokenizer``, else ``model`` when it is an HF id or path."""
    if settings.fireworks.tokenizer:
        return settings.fireworks.tokenizer
    if settings.model and not is_fireworks_model_name(settings.model):
        return str(settings.model)
    raise BackendError(
        "the Fireworks backend renders chats with the base model's own tokenizer: set fireworks.tokenizer to its "
        "Hugging Face id or a local path (e.g. Qwen/Qwen3-8B)"
    )


# -- errors --------------------------------------------------------------------------------------------------------


def _exception_chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 16:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _http_status(chain: Sequence[BaseException]) -> int | None:
    """The HTTP status behind an SDK failure. Futures wrap transport errors (a 401 while polling arrives as a
    ValueError caused by the status error), so the whole chain is searched."""
    for item in chain:
        for attr in ("status_code", "final_status", "wire_status"):
            value = getattr(item, attr, None)
            if isinstance(value, int) and not isinstance(value, bool):
                return value
        status = getattr(getattr(item, "response", None), "status_code", None)
        if isinstance(status, int):
            return status
    return None


def _scrub(exc: BaseException, redact: Sequence[str]) -> str:
    """The exception's message on one line, at most 300 characters, with the secrets in ``redact`` masked."""
    text = " ".join(str(exc).split())
    for secret in redact:
        if secret:
            text = text.replace(secret, "****")
    return text[:300]


def to_backend_error(
    exc: BaseException, doing: str, *, opening: bool = False, redact: Sequence[str] = ()
) -> BackendError:
    """One clear BackendError for an SDK failure while ``doing``; ``retryable`` when trying later can help.

    ``opening``: the failure came while opening the session or the training run, where a 403/404 means the account
    cannot use step-wise training at all (and any other permanent failure may). Strings in ``redact`` (the API key)
    never appear in the message.
    """
    error = _classify(exc, doing, opening=opening, redact=redact)
    if opening and not error.retryable and error.status_code not in (401, 403, 404) and error is not exc:
        error = BackendError(
            f'{error}; if this account has no access to step-wise training, set fireworks.mode = "batch"',
            status_code=error.status_code,
        )
    return error


def _classify(exc: BaseException, doing: str, *, opening: bool, redact: Sequence[str]) -> BackendError:
    if isinstance(exc, BackendError):
        return exc
    if "Training request sequence failed" in str(exc):
        # The SDK poisons a training client once one of its requests failed to submit (it cannot know what the
        # service applied); only a new run, resumed from a checkpoint, can continue.
        return BackendError(
            f"the Fireworks training run stopped accepting work after an earlier failed request ({doing}); "
            "restart openclaw to resume from the last checkpoint"
        )
    chain = _exception_chain(exc)
    names = {cls.__name__ for item in chain for cls in type(item).__mro__}
    status = _http_status(chain)
    detail = f"{type(exc).__name__}: {_scrub(exc, redact)}"
    if status == 401:
        return BackendError(
            f"Fireworks rejected the API key (HTTP 401) while {doing}; check {KEY_ENV} or fireworks.api_key",
            status_code=401,
        )
    if status in (403, 404) and opening:
        return BackendError(f"{NOT_ENABLED_HINT} (HTTP {status} while {doing}: {detail})", status_code=status)
    if status == 403:
        return BackendError(f"Fireworks refused {doing} (HTTP 403): {detail}", status_code=403)
    failed = next((item for item in chain if type(item).__name__ == "RequestFailedError"), None)
    if failed is not None:
        category = str(getattr(getattr(failed, "category", None), "value", getattr(failed, "category", ""))).lower()
        message = _scrub(failed, redact)
        if category == "user":
            return BackendError(f"Fireworks rejected the request while {doing}: {message}", status_code=400)
        return BackendError(f"Fireworks failed while {doing} (server side, may pass): {message}", retryable=True)
    if status is not None and (status in (408, 409, 425, 429) or status >= 500):
        return BackendError(
            f"Fireworks is unavailable (HTTP {status}) while {doing}; try again shortly: {detail}", retryable=True
        )
    if status is not None and 400 <= status < 500:
        return BackendError(f"Fireworks rejected the request while {doing} (HTTP {status}): {detail}", status_code=400)
    transient = {"APIConnectionError", "APITimeoutError", "TransportError", "TimeoutError", "RetryableException"}
    if names & (transient | {"SamplingClientClosedError", "SamplingRequestError"}):
        return BackendError(f"cannot reach Fireworks while {doing}; try again shortly: {detail}", retryable=True)
    return BackendError(f"Fireworks call failed while {doing}: {detail}")


# -- SDK adapters: the Tinker shape the core expects, without blocking the event loop ------------------------------


class _Pending:
    """An SDK future whose failure comes out as a BackendError (the core awaits ``result_async``)."""

    def __init__(self, future: Any, doing: str, redact: Sequence[str]) -> None:
        self._future = future
        self._doing = doing
        self._redact = redact

    async def result_async(self) -> Any:
        try:
            return await self._future.result_async()
        except Exception as exc:
            raise to_backend_error(exc, self._doing, redact=self._redact) from exc


async def _in_thread(work: Callable[[], Any], doing: str, redact: Sequence[str], *, opening: bool = False) -> Any:
    try:
        return await asyncio.to_thread(work)
    except Exception as exc:
        raise to_backend_error(exc, doing, opening=opening, redact=redact) from exc


@dataclass(frozen=True)
class _Sequence:
    """What the core reads of a sampled sequence: tokens, their raw log-probabilities, why it stopped."""

    tokens: list[int]
    logprobs: list[float]
    stop_reason: str


@dataclass(frozen=True)
class _SampleResponse:
    sequences: list[_Sequence]


class FiretitanSampler:
    """A ``FiretitanSamplingClient`` with Tinker's ``sample`` / ``compute_logprobs`` as coroutines on our loop."""

    def __init__(self, client: Any, tokenizer: Callable[[], HFChatTokenizer], redact: Sequence[str] = ()) -> None:
        self.client = client
        self._tokenizer = tokenizer  # looked up per request: the base sampler opens before the backend has one
        self._redact = tuple(redact)

    @property
    def model(self) -> str:
        return str(self.client.deployment_sampler.model)

    async def sample(self, prompt: Any, num_samples: int, sampling_params: Any) -> _SampleResponse:
        options: dict[str, Any] = {"logprobs": True, "top_p": float(sampling_params.top_p)}
        if sampling_params.top_k is not None and sampling_params.top_k > 0:
            options["top_k"] = int(sampling_params.top_k)
        if sampling_params.seed is not None:
            options["seed"] = int(sampling_params.seed)
        stops = self._stop_strings(sampling_params.stop)
        try:
            completions = await self.client.deployment_sampler.sample_with_prompt_tokens(
                list(prompt.to_ints()),
                n=num_samples,
                max_tokens=int(sampling_params.max_tokens),
                temperature=float(sampling_params.temperature),
                stop=stops or None,
                **options,
            )
        except Exception as exc:
            raise to_backend_error(exc, "sampling", redact=self._redact) from exc
        sequences = []
        for completion in completions:
            tokens = [int(t) for t in completion.full_tokens[completion.prompt_len :]]
            raw = completion.inference_logprobs
            if raw is None or len(raw) != len(tokens):
                got = "no" if raw is None else str(len(raw))
                raise BackendError(f"Fireworks returned {len(tokens)} tokens with {got} log-probabilities")
            stop_reason = "length" if completion.finish_reason == "length" else "stop"
            sequences.append(_Sequence(tokens, [float(v) for v in raw], stop_reason))
        return _SampleResponse(sequences)

    async def compute_logprobs(self, prompt: Any) -> list[float | None]:
        """log p(t_i | t_<i) for every token (None first): the prompt echoed back with one sampled token."""
        ids = list(prompt.to_ints())
        try:
            completions = await self.client.deployment_sampler.sample_with_prompt_tokens(
                ids, n=1, max_tokens=1, temperature=1.0, top_p=1.0, logprobs=True, echo=True
            )
        except Exception as exc:
            raise to_backend_error(exc, "scoring tokens", redact=self._redact) from exc
        raw = completions[0].inference_logprobs if len(completions) == 1 else None
        if raw is None or len(raw) < len(ids) - 1:
            raise BackendError(f"Fireworks returned no prompt log-probabilities for {len(ids)} tokens")
        return [None, *(float(v) for v in raw[: len(ids) - 1])]

    def close(self) -> None:
        """Close the SDK sampler's connections (called on our event loop, where its async client lives)."""
        try:
            self.client.close()
        except Exception as exc:  # closing must never fail a shutdown
            log.debug("closing a Fireworks sampler failed: %s", exc)

    def _stop_strings(self, stop: Any) -> list[str]:
        """The core sends stop token ids (EOS + requested ids). The completions API takes strings only and stops at
        the model's EOS by itself, so EOS ids are dropped and other ids are sent as their text."""
        if not stop:
            return []
        if isinstance(stop, str):
            return [stop]
        tokenizer = self._tokenizer()
        eos = set(tokenizer.eos_token_ids)
        return [s if isinstance(s, str) else tokenizer.hf.decode([int(s)]) for s in stop if s not in eos]


def _submitted(submit: Callable[[], Any], doing: str, redact: Sequence[str]) -> _Pending:
    """Submit one ordered request now (the SDK numbers requests as they are submitted) and return its future."""
    try:
        return _Pending(submit(), doing, redact)
    except Exception as exc:
        raise to_backend_error(exc, doing, redact=redact) from exc


class FireworksTraining:
    """A ``FiretitanTrainingClient`` for the core: ordered requests return awaitable futures at once; the blocking
    ``save_weights_for_sampler`` runs in a worker thread."""

    def __init__(self, client: Any, redact: Sequence[str] = ()) -> None:
        self.client = client
        self._redact = tuple(redact)

    def forward_backward(self, datums: list[Any], loss_fn: str, loss_fn_config: dict[str, float] | None) -> _Pending:
        return _submitted(
            lambda: self.client.forward_backward(datums, loss_fn, loss_fn_config),
            f"computing gradients ({loss_fn})",
            self._redact,
        )

    def optim_step(self, adam: Any) -> _Pending:
        # No server-side normalisation: the loss is a plain sum, as with every other backend.
        return _submitted(lambda: self.client.optim_step(adam), "taking an optimizer step", self._redact)

    def save_state(self, name: str) -> _Pending:
        if not _DNS_LABEL.match(name):
            raise BackendError(f"Fireworks checkpoint names are a-z, 0-9 and '-' (got {name!r})", status_code=400)
        return _submitted(lambda: self.client.save_state(name), "saving a training checkpoint", self._redact)

    def load_state_with_optimizer(self, path: str) -> _Pending:
        doing = f"loading the checkpoint {path}"
        return _submitted(lambda: self.client.load_state_with_optimizer(path), doing, self._redact)

    async def save_weights_for_sampler(self, name: str) -> Any:
        return await _in_thread(
            lambda: self.client.save_weights_for_sampler(name).result(), "saving sampler weights", self._redact
        )


class FireworksService:
    """A ``FiretitanServiceClient`` for the core. Opening the session is deferred to the first call (in a thread),
    so constructing this never blocks; a 403/404 while opening the session or the run names the preview."""

    def __init__(self, factory: ServiceClientFactory, api_key: str, base_url: str, backend: FireworksStepwiseBackend):
        self._factory = factory
        self._api_key = api_key
        self._base_url = base_url
        self._backend = backend
        self._client: Any = None
        self._lock = threading.Lock()
        # Samplers still referenced (serving or pinned); the core drops old versions, and the SDK closes a sampler
        # when it is collected, so only the live ones are left to close here.
        self._samplers: weakref.WeakSet[FiretitanSampler] = weakref.WeakSet()

    def _service(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._factory(self._api_key, self._base_url)
            return self._client

    @property
    def training_session_id(self) -> str | None:
        return getattr(self._client, "training_session_id", None)

    async def create_sampling_client(
        self, *, model_path: str | None = None, base_model: str | None = None
    ) -> FiretitanSampler:
        doing = f"opening a sampler for {model_path or base_model}"

        def open_sampler() -> Any:
            service = self._service()
            if model_path is not None:
                return service.create_sampling_client(model_path=model_path)
            return service.create_sampling_client(base_model=base_model)

        client = await _in_thread(open_sampler, doing, (self._api_key,), opening=model_path is None)
        sampler = self._backend.wrap_sampler(client)
        self._samplers.add(sampler)
        return sampler

    async def create_lora_training_client(self, *, base_model: str, **kwargs: Any) -> FireworksTraining:
        doing = f"creating a LoRA training run on {base_model}"
        client = await _in_thread(
            lambda: self._service().create_lora_training_client(base_model, **kwargs),
            doing,
            (self._api_key,),
            opening=True,
        )
        return FireworksTraining(client, (self._api_key,))

    async def create_training_client_from_state_with_optimizer(self, path: str) -> FireworksTraining:
        """A new run with this backend's LoRA settings, then weights + optimizer from ``path`` (module docstring)."""
        training = await self.create_lora_training_client(
            base_model=self._backend.base_model, **self._backend.lora_training_kwargs()
        )
        await training.load_state_with_optimizer(path).result_async()
        return training

    async def close(self) -> None:
        for sampler in list(self._samplers):
            sampler.close()
        client, self._client = self._client, None
        if client is not None:
            await asyncio.to_thread(_end_session, client)


def _end_session(service: Any) -> None:
    """Release the serverless session (its concurrent-run slot) and the client's connections; best effort."""
    delete = getattr(service, "delete_training_session", None)
    if callable(delete):
        try:
            delete()
        except Exception as exc:  # checkpoints are already saved; a leftover session expires without heartbeats
            log.warning("could not delete the Fireworks training session: %s", exc)
    try:
        service.close()
    except Exception as exc:
        log.warning("closing the Fireworks service client failed: %s", exc)


# -- the backend ---------------------------------------------------------------------------------------------------


class FireworksStepwiseBackend(TinkerShapedBackend):
    """The Backend protocol over Fireworks' step-wise training SDK (see the module docstring)."""

    name: ClassVar[str] = "fireworks"

    def __init__(self, settings: Settings, *, service_client_factory: ServiceClientFactory | None = None) -> None:
        self._api_key = env_secret(settings.fireworks.api_key, KEY_ENV)
        super().__init__(
            settings,
            keep_versions=settings.fireworks.keep_versions,
            redact=[self._api_key] if self._api_key else [],
        )
        self._factory = service_client_factory or default_service_client

    @property
    def base_model(self) -> str:
        return base_model_name(self.settings)

    def make_sdk(self) -> TinkerShapedSdk:
        try:
            from fireworks.training.sdk import APIConnectionError, APITimeoutError
            from fireworks.training.sdk import types as fw_types
        except ImportError as exc:
            raise BackendError(f"the Fireworks training SDK is not installed ({exc}); {INSTALL_HINT}") from exc
        if not self._api_key:
            raise BackendError(f"no Fireworks API key: set {KEY_ENV} or fireworks.api_key")
        service = FireworksService(self._factory, self._api_key, training_base_url(self.settings), self)
        return TinkerShapedSdk(
            title="Fireworks",
            key_env=KEY_ENV,
            types=fw_types,
            connect=lambda: service,
            publish_mode="save_weights_for_sampler",
            timeout_errors=(APITimeoutError,),
            connection_errors=(APIConnectionError,),
            close_service=lambda svc: svc.close(),
        )

    def lora_training_kwargs(self) -> dict[str, Any]:
        lora = self.settings.lora
        targets = set(lora.targets)
        return {
            "rank": lora.rank,
            "alpha": lora.alpha,
            "seed": self.settings.local.seed,
            "train_attn": bool(targets & _ATTN) or not targets & _MLP,
            "train_mlp": bool(targets & _MLP),
            "train_unembed": False,  # like the local backend: LoRA on the blocks, never on the output layer
        }

    def load_tokenizer(self, model: str) -> HFChatTokenizer:
        # ``model`` is the Fireworks base model name; the tokenizer has its own source (an HF id or path).
        tokenizer = super().load_tokenizer(tokenizer_source(self.settings))
        if self.settings.fireworks.context_length:
            tokenizer.context_length = self.settings.fireworks.context_length
        return tokenizer

    def wrap_sampler(self, client: Any) -> FiretitanSampler:
        return FiretitanSampler(client, self.tokenizer, [self._api_key] if self._api_key else [])

    @classmethod
    def diagnose(cls, settings: Settings) -> list[Check]:
        """SDK import, key and model settings; contacts nothing."""
        from importlib.util import find_spec

        try:
            installed = find_spec("fireworks.training.sdk") is not None
        except ModuleNotFoundError:
            installed = False
        checks = [Check("training sdk", installed, "" if installed else INSTALL_HINT)]
        key = env_secret(settings.fireworks.api_key, KEY_ENV)
        checks.append(Check("api key", key is not None, "" if key else f"set {KEY_ENV} or fireworks.api_key"))
        for label, resolve in (("base model", base_model_name), ("tokenizer", tokenizer_source)):
            try:
                checks.append(Check(label, True, resolve(settings)))
            except BackendError as exc:
                checks.append(Check(label, False, str(exc)))
        checks.append(Check("training endpoint", True, training_base_url(settings)))
        return checks
