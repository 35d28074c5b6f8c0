"""The backend protocol on a Tinker-shaped training service, written once for every SDK with Tinker's shape.

A Tinker-shaped SDK has a service client that makes a LoRA training client (``forward_backward``, ``optim_step``,
``save_state``, sampler snapshots) and sampling clients (``sample``, ``compute_logprobs``), every call returning a
future to await. Tinker's own SDK is one; Fireworks' step-wise training SDK spells the same methods and types. A
binding subclasses :class:`TinkerShapedBackend` and supplies a :class:`TinkerShapedSdk` (how to connect, the type
namespace, its error classes, how a snapshot becomes servable); see ``backends/tinker.py``.

**Serving.** Version 0 is the base model's sampling client. ``publish`` snapshots the trained weights into a new
sampling client and then swaps the "current" pointer in one step on the event loop: nothing waits for the
snapshot, the old client serves until the new one is ready, and a request keeps the client it started with until
it finishes. The last ``keep_versions`` published versions stay servable by number (``sample(..., version=N)``);
the version serving now is never dropped, even when it is older than those (after a rollback).

**Version control** (:class:`~openclaw_cli.backend.SupportsVersionControl`, for ``openclaw rollback`` and the
promotion gate). ``stage`` snapshots like ``publish`` but leaves the current version serving; ``activate(N)``
makes a servable version current at once (requests already running keep theirs). ``activate(N, train_from=True)``
also moves the *trainer* to version N: the service's training run cannot be rewound, so every ``publish`` /
``stage`` also saves the training state (``save_state``: weights + Adam moments) under ``openclaw-v<N>-train``,
and a rollback loads that state into the training run (``load_state_with_optimizer``; an SDK without it gets a new
run from the state, ``create_training_client_from_state_with_optimizer``; Fireworks allows one run per service
client, so in place is the only way there), so training continues from N's weights with the optimizer moments N
had. Version 0's state (the fresh adapter, i.e. the base model) is saved once, when the core opens a fresh training
run. A version whose training state was not saved (the save failed, the run was resumed from a checkpoint before
it, or ``save_version_states=False``) is refused with a 409 before anything switches: never a silent "rollback"
that keeps training the abandoned weights.
*Cost*: one extra ``save_state`` per published version, submitted together with the sampler snapshot (no extra
round trip to wait for; the next training request queues behind it on the service) and kept on the service like
any checkpoint; only the newest ``keep_versions`` are remembered here. Saving lazily (only once a rollback is
asked for) is not possible: by then the trainer has moved past the version's weights.

**Streaming.** These services sample a whole completion per call (no token streaming), so :meth:`stream` yields
the completion's tokens only after sampling ends, all at once, the text on the last chunk.

**Training.** Calls on the training client run in submission order on the service. ``forward_backward_and_step``
submits both requests back to back and then waits for both (one round trip instead of two); the protocol's
separate ``forward_backward`` / ``optim_step`` also work. The training client is created on first use, so a process
that only serves (or resumes from a checkpoint) never opens a fresh training run it does not need.

**Checkpoints.** ``save_state(name)`` saves weights + optimizer on the service and writes a small local record
``<local.state_dir>/<name>/openclaw-state.json`` holding the service path, so the trainer loop's resume finds it;
``load_state`` accepts that directory or a service path (``tinker://…``) directly.

**Errors** become one-line :class:`~openclaw_cli.backend.BackendError` s
(:func:`openclaw_cli.backends.tinker_wire.backend_error`); opening clients is retried with backoff on retryable errors,
on top of the SDK's own HTTP retries.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import json
import logging
import os
import re
import tempfile
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal, TypeVar

from openclaw_cli.adapters import SHARED_ADAPTER, adapter_state_dir
from openclaw_cli.backend import BASE_VERSION, BackendError, none_before
from openclaw_cli.backends import tinker_wire as wire
from openclaw_cli.types import (
    AdamParams,
    Datum,
    FwdBwdResult,
    LossName,
    PolicyVersion,
    SampleResult,
    SamplingParams,
    StepResult,
    StreamEvent,
    TokenChunk,
)

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings
    from openclaw_cli.tokenizer import HFChatTokenizer

log = logging.getLogger("openclaw.backend.tinker_shaped")

T = TypeVar("T")
PublishMode = Literal["save_weights_and_get_sampling_client", "save_weights_for_sampler"]
STATE_FILE = "openclaw-state.json"  # the trainer loop's "finished checkpoint" marker (trainer_loop._STATE_FILE)
_STATE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_CLOSE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class TinkerShapedSdk:
    """What the core needs from one Tinker-shaped SDK.

    ``types`` is a namespace with ``ModelInput``, ``Datum``, ``TensorData``, ``SamplingParams`` and ``AdamParams``.
    ``connect()`` returns a new service client with the binding's credentials. ``publish_mode`` chooses how trained
    weights become servable: Tinker's one-call ``save_weights_and_get_sampling_client()`` or
    ``save_weights_for_sampler(name)`` + ``create_sampling_client(model_path=...)`` for SDKs without the former.
    ``close_service`` ends the service session (may return a future), when the SDK has such a call.
    """

    title: str
    key_env: str
    types: Any
    connect: Callable[[], Any]
    publish_mode: PublishMode = "save_weights_and_get_sampling_client"
    timeout_errors: tuple[type[BaseException], ...] = ()
    connection_errors: tuple[type[BaseException], ...] = ()
    close_service: Callable[[Any], Any] | None = None


@dataclass(frozen=True)
class ServedVersion:
    """A servable policy: its identity and the sampling client whose (fixed) weights are that policy."""

    info: PolicyVersion
    client: Any = field(repr=False)

    @property
    def number(self) -> int:
        return self.info.version


class TinkerShapedBackend:
    """The :class:`~openclaw_cli.backend.Backend` protocol over a Tinker-shaped SDK (module docstring)."""

    name: ClassVar[str] = "tinker-shaped"
    retry_delays_s: tuple[float, ...] = (1.0, 4.0)  # waits between attempts at opening clients

    def __init__(
        self,
        settings: Settings,
        *,
        keep_versions: int = 3,
        sample_timeout_s: float = 300.0,
        redact: Sequence[str] = (),
        save_version_states: bool = True,
    ) -> None:
        if keep_versions < 1:
            raise ValueError(f"keep_versions must be >= 1, got {keep_versions}")
        self.settings = settings
        self.keep_versions = keep_versions
        self.sample_timeout_s = sample_timeout_s
        self._redact = tuple(s for s in redact if s)
        self._sdk: TinkerShapedSdk | None = None
        self._service: Any = None
        self._tokenizer: HFChatTokenizer | None = None
        self._base: ServedVersion | None = None
        self.save_version_states = save_version_states
        self._start_lock = asyncio.Lock()
        # An adapter per owner (openclaw_cli.adapters): each is a training run of its own on the same base model,
        # with its own versions and checkpoints; the service, the tokenizer and the base sampler are shared.
        self._adapter = SHARED_ADAPTER
        self._views: dict[str, TinkerShapedBackend] = {}
        self._new_adapter_state()

    def _new_adapter_state(self) -> None:
        """What belongs to one adapter: its training run, versions, step count, saved states and locks."""
        self._training: Any = None
        self._published: OrderedDict[int, ServedVersion] = OrderedDict()
        self._current: ServedVersion | None = self._base
        self._latest_number = BASE_VERSION
        self._step = 0  # optimizer steps taken by this training run
        # The version whose weights the training client holds exactly now (None once it trained past them).
        self._trainer_version: int | None = BASE_VERSION
        # Service paths of the training state saved with each kept published version (for train_from).
        self._train_states: dict[int, str] = {}
        # A forward_backward was submitted since the last optim_step went through: the service may hold gradients.
        self._gradients_pending = False
        self._discards = 0
        self._training_open_lock = asyncio.Lock()
        self._train_lock = asyncio.Lock()

    def adapter(self, name: str) -> TinkerShapedBackend:
        """This backend as adapter ``name`` sees it (see :class:`~openclaw_cli.backend.SupportsAdapters`): a LoRA
        training run of its own on the same base model, created on its first training call, its own version numbers
        (the base model, 0, until its first publish) and checkpoints under ``local.state_dir/adapters/<name>``."""
        if name == self._adapter:
            return self
        self._require_service()
        view = self._views.get(name)
        if view is None:
            view = copy.copy(self)  # shares the service, the tokenizer, the base sampler and the views
            view._adapter = name
            view._new_adapter_state()
            self._views[name] = view
        return view

    # -- binding hooks -------------------------------------------------------------------------------------------

    def make_sdk(self) -> TinkerShapedSdk:
        """The SDK binding; called once, in :meth:`start` (imports of the SDK belong here, not at module level)."""
        raise NotImplementedError

    def lora_training_kwargs(self) -> dict[str, Any]:
        """Keyword arguments of ``create_lora_training_client`` besides ``base_model``."""
        return {"rank": self.settings.lora.rank}

    def load_tokenizer(self, model: str) -> HFChatTokenizer:
        """The model's own Hugging Face tokenizer + chat template (the one the local backend uses for it too)."""
        from openclaw_cli.tokenizer import HFChatTokenizer

        context_length = None
        try:
            from transformers import AutoConfig

            config = AutoConfig.from_pretrained(model)
            text_config = getattr(config, "text_config", None) or config
            context_length = getattr(text_config, "max_position_embeddings", None)
        except Exception as exc:  # the tokenizer alone is enough to serve; the context length then defaults
            log.debug("no model config for %s (%s); using the default context length", model, exc)
        return HFChatTokenizer.from_pretrained(model, context_length=context_length)

    # -- lifecycle -----------------------------------------------------------------------------------------------

    @property
    def base_model(self) -> str:
        model = (self.settings.model or "").strip()
        if not model:
            raise BackendError(f"the {self.name} backend needs --model (e.g. Qwen/Qwen3-4B-Instruct-2507)")
        return model

    async def start(self) -> None:
        async with self._start_lock:
            if self._base is not None:
                return
            model = self.base_model
            sdk = self.make_sdk()
            # Credentials first: a missing or wrong key is the likelier mistake and the cheaper one to report than
            # a tokenizer download. The SDK's client constructor may block on the network, hence the thread.
            try:
                service = await asyncio.to_thread(sdk.connect)
            except Exception as exc:
                raise self._error(exc, f"connecting to {sdk.title}", sdk) from exc
            try:
                tokenizer = await asyncio.to_thread(self.load_tokenizer, model)
            except Exception as exc:
                raise BackendError(
                    f"cannot load the tokenizer of {model} ({type(exc).__name__}: {wire.one_line(exc, ())}); "
                    f"the {sdk.title} backend renders chats with the model's own Hugging Face tokenizer "
                    "(for gated models log in with `hf auth login`)"
                ) from exc
            self._sdk = sdk
            base_client = await self._retrying(
                lambda: self._call(
                    lambda: service.create_sampling_client(base_model=model), f"opening a sampler for {model}"
                )
            )
            self._service, self._tokenizer = service, tokenizer
            self._base = ServedVersion(PolicyVersion(BASE_VERSION, "base"), base_client)
            self._current = self._base

    async def close(self) -> None:
        service, sdk = self._service, self._sdk
        self._service = self._training = self._base = self._current = None
        self._published.clear()
        self._train_states.clear()
        if service is None or sdk is None or sdk.close_service is None:
            return
        try:
            pending = sdk.close_service(service)
            await asyncio.wait_for(self._resolve(pending), timeout=_CLOSE_TIMEOUT_S)
        except Exception as exc:  # closing is best effort: saved checkpoints are already on the service
            log.warning("closing the %s session failed: %s", sdk.title, self._error(exc, "closing the session", sdk))

    # -- serving -------------------------------------------------------------------------------------------------

    def tokenizer(self) -> HFChatTokenizer:
        if self._tokenizer is None:
            raise BackendError(f"the {self.name} backend is not started; call start() first")
        return self._tokenizer

    def current_version(self) -> PolicyVersion:
        return self._require_current().info

    def servable_versions(self) -> list[int]:
        """Version numbers that ``sample(..., version=N)`` accepts now (0 = the base model), oldest first."""
        self._require_current()
        return [BASE_VERSION, *self._published]

    async def sample(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> SampleResult:
        served = self._acquire(version)  # pinned now: a publish during sampling does not move this request
        prompt = [int(t) for t in prompt_tokens]
        tokenizer = self.tokenizer()
        self._check_prompt(prompt, params.max_tokens, tokenizer.context_length)
        sdk = self._require_sdk()
        sdk_params = wire.sdk_sampling_params(sdk.types, params, tokenizer.eos_token_ids)
        model_input = sdk.types.ModelInput.from_ints(prompt)
        started = time.time()
        response = await self._call(
            lambda: served.client.sample(prompt=model_input, num_samples=1, sampling_params=sdk_params),
            "sampling",
            timeout_s=self.sample_timeout_s,
        )
        sequences = list(getattr(response, "sequences", None) or [])
        if not sequences:
            raise BackendError(f"{sdk.title} returned no sequence for a sampling request", retryable=True)
        return wire.sample_result(
            sequences[0],
            params,
            version=served.number,
            prompt_tokens=len(prompt),
            decode=tokenizer.decode,
            eos_token_ids=tokenizer.eos_token_ids,
            started_at=started,
            finished_at=time.time(),
        )

    def stream(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        """The whole completion, after sampling: its tokens as chunks (the text on the last one), then the result.
        The service has no token streaming; see the module docstring."""
        return self._stream(prompt_tokens, params, version)

    async def _stream(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None
    ) -> AsyncIterator[StreamEvent]:
        result = await self.sample(prompt_tokens, params, version)
        last = len(result.tokens) - 1
        for i, (token, logprob) in enumerate(zip(result.tokens, result.logprobs, strict=True)):
            yield TokenChunk(token, logprob, result.text if i == last else "", result.version)
        yield result

    async def compute_logprobs(self, tokens: list[int], *, base: bool = False, start: int = 1) -> list[float | None]:
        served = self._require_base() if base else self._acquire(None)
        ids = [int(t) for t in tokens]
        context = self.tokenizer().context_length
        if len(ids) > context:
            raise BackendError(f"{len(ids)} tokens exceed the model's context length of {context}", status_code=400)
        if len(ids) < 2:
            return [None] * len(ids)
        model_input = self._require_sdk().types.ModelInput.from_ints(ids)
        values = await self._call(
            lambda: served.client.compute_logprobs(model_input), "scoring tokens", timeout_s=self.sample_timeout_s
        )
        values = list(values)
        if len(values) != len(ids):
            raise BackendError(f"scoring {len(ids)} tokens returned {len(values)} logprobs")
        return none_before([None if v is None else float(v) for v in values], max(start, 1))

    # -- training ------------------------------------------------------------------------------------------------

    async def forward_backward(
        self, datums: list[Datum], loss: LossName, loss_config: dict[str, float] | None = None
    ) -> FwdBwdResult:
        sdk_datums, sdk_config = self._training_inputs(datums, loss, loss_config)
        async with self._train_lock:
            training = await self._training_client()
            self._gradients_pending = True
            output = await self._call(
                lambda: training.forward_backward(sdk_datums, loss, sdk_config), "computing gradients"
            )
        return wire.fwdbwd_result(output, datums, loss, sdk_config)

    async def discard_gradients(self) -> None:
        """Drop gradients accumulated since the last optimizer step (no-op when none can be pending).

        The service has no call for this, so the training client is rebuilt from a fresh ``save_state`` (weights
        and optimizer state, which do not include accumulated gradients): the same weights and Adam moments, no
        gradients. That costs a save and a load, and only happens after a failed step attempt.
        """
        async with self._train_lock:
            if not self._gradients_pending or self._training is None:
                self._gradients_pending = False
                return
            training, service = self._training, self._require_service()
            self._discards += 1
            name = f"openclaw-discard-{self._step}-{self._discards}"
            saved = await self._call(lambda: training.save_state(name), "saving state to drop pending gradients")
            self._training = await self._retrying(
                lambda: self._call(
                    lambda: service.create_training_client_from_state_with_optimizer(str(saved.path)),
                    "reopening the training run without pending gradients",
                )
            )
            self._gradients_pending = False

    async def optim_step(self, adam: AdamParams) -> StepResult:
        sdk_adam = wire.sdk_adam(self._require_sdk().types, adam)
        async with self._train_lock:
            training = await self._training_client()
            response = await self._call(lambda: training.optim_step(sdk_adam), "taking an optimizer step")
            self._step += 1
            self._gradients_pending = False
            self._trainer_version = None
            return self._step_result(response, adam)

    async def forward_backward_and_step(
        self, datums: list[Datum], loss: LossName, loss_config: dict[str, float] | None, adam: AdamParams
    ) -> tuple[FwdBwdResult, StepResult]:
        """``forward_backward`` then ``optim_step``, submitted back to back and awaited together."""
        sdk_datums, sdk_config = self._training_inputs(datums, loss, loss_config)
        sdk_adam = wire.sdk_adam(self._require_sdk().types, adam)
        async with self._train_lock:
            training = await self._training_client()
            self._gradients_pending = True
            fb_pending = self._submit(
                lambda: training.forward_backward(sdk_datums, loss, sdk_config), "computing gradients"
            )
            step_pending = self._submit(lambda: training.optim_step(sdk_adam), "taking an optimizer step")
            output, response = await asyncio.gather(
                self._resolve(fb_pending, "computing gradients"),
                self._resolve(step_pending, "taking an optimizer step"),
            )
            self._step += 1
            self._gradients_pending = False
            self._trainer_version = None
            step = self._step_result(response, adam)
        return wire.fwdbwd_result(output, datums, loss, sdk_config), step

    async def publish(self, name: str | None = None) -> PolicyVersion:
        """Snapshot the trained weights into a new sampling client, then make it current in one step."""
        return await self._publish_trained(name, make_current=True)

    # -- version control (openclaw_cli.backend.SupportsVersionControl; module docstring) ------------------------

    async def stage(self, name: str | None = None) -> PolicyVersion:
        """Like :meth:`publish`, but the new version is only servable when pinned; the current one keeps serving."""
        return await self._publish_trained(name, make_current=False)

    async def activate(self, version: int, *, train_from: bool = False) -> PolicyVersion:
        """Serve ``version`` from now on (at once; requests already running finish on theirs). ``train_from``:
        the trainer also continues from that version's saved training state (weights and optimizer moments), once
        a training call in progress is done. Not servable: 400; no saved training state: 409, nothing switched."""
        served = self._acquire(version)  # 400 naming the servable versions when it is not one
        if train_from and not self._can_train_from(version):
            raise BackendError(
                f"policy version {version} can serve but cannot be trained from: its training state was not saved "
                "with it (see the log of its publish, or it predates a resume from a checkpoint); serving is "
                "unchanged. Roll back to a version this run published with its state saved",
                status_code=409,
            )
        self._make_current(served)
        if not train_from:
            return served.info
        async with self._train_lock:
            if self._trainer_version != version or self._gradients_pending:
                await self._restore_training(version)
            # A publish that finished while we waited for the lock may have put the abandoned weights in front.
            self._make_current(served)
        return served.info

    def _can_train_from(self, version: int) -> bool:
        if version in self._train_states or self._trainer_version == version:
            return True
        return version == BASE_VERSION and self._training is None  # the run opened next starts fresh anyway

    async def _restore_training(self, version: int) -> None:
        """Load ``version``'s saved training state into the training run (in place when the SDK can, else a new
        run from it); call with the train lock held."""
        path = self._train_states.get(version)
        if path is None:
            if version == BASE_VERSION and self._training is None:
                self._trainer_version = BASE_VERSION
                return
            # The version's state was dropped while we waited for the lock.
            raise BackendError(f"the training state of version {version} is no longer kept", status_code=409)
        doing = f"restoring the training state of version {version} ({path})"
        training, service = self._training, self._require_service()
        load_in_place = getattr(training, "load_state_with_optimizer", None) if training is not None else None
        try:
            if callable(load_in_place):
                await self._retrying(lambda: self._call(lambda: load_in_place(path), doing))
            else:
                self._training = await self._retrying(
                    lambda: self._call(lambda: service.create_training_client_from_state_with_optimizer(path), doing)
                )
        except BackendError as exc:
            raise BackendError(
                f"version {version} serves now, but the trainer could not be moved to its weights: {exc}",
                retryable=exc.retryable,
                status_code=exc.status_code,
            ) from exc
        self._gradients_pending = False
        self._trainer_version = version

    async def _publish_trained(self, name: str | None, *, make_current: bool) -> PolicyVersion:
        async with self._train_lock:
            training = await self._training_client()
            number = self._latest_number + 1
            state_pending = self._submit_version_state(training, number)
            client = await self._snapshot(training, f"openclaw-v{number}")
            state_path = await self._resolve_version_state(state_pending, number)
            info = self._install(client, name, None, make_current=make_current)
            if state_path is not None:
                self._train_states[info.version] = state_path
            self._trainer_version = info.version
            return info

    def _submit_version_state(self, training: Any, number: int) -> Any:
        """Submit the training-state save for version ``number`` (submitted first, so it is queued before the
        snapshot and both run in one round trip); None when not wanted or the submit itself failed."""
        if not self.save_version_states:
            return None
        name = f"openclaw-v{number}-train"
        try:
            return self._submit(lambda: training.save_state(name), "saving the training state of a version")
        except BackendError as exc:
            log.warning("version %d will not be trainable-from after a rollback: %s", number, exc)
            return None

    async def _resolve_version_state(self, pending: Any, number: int) -> str | None:
        if pending is None:
            return None
        try:
            response = await self._resolve(pending, "saving the training state of a version")
        except BackendError as exc:  # serving the new version matters more; a rollback to it will say 409
            log.warning("version %d will not be trainable-from after a rollback: %s", number, exc)
            return None
        return str(response.path)

    # -- checkpoints ---------------------------------------------------------------------------------------------

    async def save_state(self, name: str) -> str:
        """Save weights + optimizer state on the service and a local record of it; returns the record's directory.

        Before any training there is nothing to save on the service (the adapter is still at its initial,
        no-op weights), so only the record is written and ``load_state`` of it starts afresh.
        """
        if not _STATE_NAME.match(name):
            raise BackendError(f"checkpoint name {name!r} must be letters, digits, '.', '_' or '-' (max 128)")
        target = adapter_state_dir(self.settings, self._adapter) / name
        async with self._train_lock:
            current = self._require_current().info
            service_path: str | None = None
            if self._training is not None:
                training = self._training
                response = await self._call(lambda: training.save_state(name), "saving a checkpoint")
                service_path = str(response.path)
            elif self._step:
                raise BackendError("there is trained state but no training client to save it from")
            record = {
                "backend": self.name,
                "adapter": self._adapter,
                "service_path": service_path,
                "model": self.base_model,
                "lora_rank": self.settings.lora.rank,
                "version": current.version,
                "version_name": current.name,
                "weights_are_version": self._trainer_version == current.version,
                "trainer_step": self._step,
                "saved_at": time.time(),
            }
            await asyncio.to_thread(_write_record, target, record)
        return str(target)

    async def load_state(self, path: str) -> PolicyVersion:
        """Resume from ``save_state``'s directory (or a service path such as ``tinker://…/weights/NAME``): a new
        training client with the saved weights and optimizer state, whose weights are then served (under the saved
        version number when they were that version and the number is still unused here)."""
        record = await asyncio.to_thread(self._read_record, path)
        service_path = record.get("service_path")
        async with self._train_lock:
            self._require_current()
            if service_path is None:  # saved before any training: nothing on the service to restore
                self._training = None
                self._gradients_pending = False
                self._step = int(record.get("trainer_step", 0))
                self._trainer_version = BASE_VERSION
                self._current = self._require_base()  # a fresh adapter is the base model
                return self._current.info
            service = self._require_service()
            training = await self._retrying(
                lambda: self._call(
                    lambda: service.create_training_client_from_state_with_optimizer(service_path),
                    f"restoring the checkpoint {service_path}",
                )
            )
            self._training = training
            self._gradients_pending = False
            self._step = int(record.get("trainer_step", 0))
            saved_version = int(record.get("version", 0))
            exact = bool(record.get("weights_are_version"))
            if exact and saved_version == BASE_VERSION and self._require_current().number == BASE_VERSION:
                info = self._require_current().info  # untrained weights: the base serves, as it did
            else:
                client = await self._snapshot(training, f"openclaw-resume-{self._step}")
                name = record.get("version_name") if exact else None
                info = self._install(client, name, saved_version if exact else None)
                self._train_states[info.version] = str(service_path)  # what it serves is exactly that state
            self._trainer_version = info.version
            return info

    def _read_record(self, path: str) -> dict[str, Any]:
        if "://" in path:
            return {"service_path": path, "model": self.base_model}
        directory = Path(path).expanduser()
        try:
            record: dict[str, Any] = json.loads((directory / STATE_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise BackendError(f"{directory} is not a checkpoint (no readable {STATE_FILE})") from exc
        if record.get("backend") != self.name:
            written_by = record.get("backend") or "local"
            raise BackendError(
                f"{directory} was written by the {written_by} backend, not {self.name}; "
                "use another local.state_dir or the backend that wrote it"
            )
        if record.get("model") != self.base_model:
            raise BackendError(f"{directory} was trained on {record.get('model')}, this run uses {self.base_model}")
        saved_adapter = record.get("adapter", SHARED_ADAPTER)
        if saved_adapter != self._adapter:
            raise BackendError(f"{directory} is adapter {saved_adapter}'s checkpoint, not {self._adapter}'s")
        return record

    # -- internals -----------------------------------------------------------------------------------------------

    async def _training_client(self) -> Any:
        """The LoRA training client, created on first use (call with the train lock held)."""
        if self._training is None:
            async with self._training_open_lock:
                if self._training is None:
                    service, model = self._require_service(), self.base_model
                    kwargs = self.lora_training_kwargs()
                    training = await self._retrying(
                        lambda: self._call(
                            lambda: service.create_lora_training_client(base_model=model, **kwargs),
                            f"creating a LoRA training run on {model}",
                        )
                    )
                    self._training = training
                    if self._trainer_version == BASE_VERSION:  # a fresh adapter: what a rollback to 0 restores
                        pending = self._submit_version_state(training, BASE_VERSION)
                        state_path = await self._resolve_version_state(pending, BASE_VERSION)
                        if state_path is not None:
                            self._train_states[BASE_VERSION] = state_path
        return self._training

    async def _snapshot(self, training: Any, label: str) -> Any:
        """A sampling client with the training client's current weights (ephemeral or named, per the SDK)."""
        sdk = self._require_sdk()
        if sdk.publish_mode == "save_weights_and_get_sampling_client":
            return await self._call(
                lambda: training.save_weights_and_get_sampling_client(), "publishing the trained weights"
            )
        saved = await self._call(lambda: training.save_weights_for_sampler(label), "saving weights for sampling")
        service = self._require_service()
        return await self._retrying(
            lambda: self._call(
                lambda: service.create_sampling_client(model_path=str(saved.path)), "opening the new sampler"
            )
        )

    def _install(
        self, client: Any, name: str | None, requested: int | None, *, make_current: bool = True
    ) -> PolicyVersion:
        """Make ``client`` servable as a new version, and current unless only staged. Synchronous on the event
        loop, so the swap is atomic; numbers only grow (a requested number is honoured when it is above every
        number used so far)."""
        number = self._latest_number + 1
        if requested is not None and requested > self._latest_number:
            number = requested
        served = ServedVersion(PolicyVersion(number, name or f"v{number}", time.time()), client)
        self._published[number] = served
        self._latest_number = number
        if make_current:
            self._current = served
        self._evict()
        return served.info

    def _make_current(self, served: ServedVersion) -> None:
        """Serve ``served`` from now on (synchronous: atomic on the event loop); it is kept servable again if a
        publish dropped it meanwhile."""
        if served.number != BASE_VERSION and served.number not in self._published:
            self._published[served.number] = served
            self._published = OrderedDict(sorted(self._published.items()))
        self._current = served
        self._evict()

    def _evict(self) -> None:
        """Keep at most ``keep_versions`` published versions, oldest out first, never the current one."""
        while len(self._published) > self.keep_versions:
            # Requests already running on the dropped version hold their own reference and finish on it.
            oldest = next(n for n, v in self._published.items() if v is not self._current)
            del self._published[oldest]
            self._train_states.pop(oldest, None)

    def _acquire(self, version: int | None) -> ServedVersion:
        current = self._require_current()
        if version is None:
            return current
        if version == BASE_VERSION:
            return self._require_base()
        served = self._published.get(version)
        if served is None:
            known = ", ".join(str(v) for v in self.servable_versions())
            raise BackendError(f"policy version {version} is not servable; servable versions: {known}", status_code=400)
        return served

    def _training_inputs(
        self, datums: list[Datum], loss: LossName, loss_config: dict[str, float] | None
    ) -> tuple[list[Any], dict[str, float] | None]:
        if not datums:
            raise BackendError("forward_backward needs at least one datum", status_code=400)
        types = self._require_sdk().types
        return [wire.sdk_datum(types, d, loss) for d in datums], wire.sdk_loss_config(loss, loss_config)

    def _step_result(self, response: Any, adam: AdamParams) -> StepResult:
        metrics = {str(k): float(v) for k, v in (getattr(response, "metrics", None) or {}).items()}
        return StepResult(step=self._step, metrics={**metrics, "lr": adam.learning_rate})

    def _check_prompt(self, prompt: list[int], max_tokens: int, context: int) -> None:
        if not prompt:
            raise BackendError("the prompt is empty; at least one token is needed", status_code=400)
        if len(prompt) + max_tokens > context:
            raise BackendError(
                f"prompt ({len(prompt)} tokens) + max_tokens ({max_tokens}) exceeds the model's context length "
                f"of {context}",
                status_code=400,
            )

    def _submit(self, submit: Callable[[], Any], doing: str) -> Any:
        """Submit one SDK request (returns its future); a failure to submit becomes a BackendError."""
        try:
            return submit()
        except Exception as exc:
            raise self._error(exc, doing) from exc

    async def _resolve(self, pending: Any, doing: str = "", *, timeout_s: float | None = None) -> Any:
        """Await an SDK future (``await``-able APIFuture, or anything with ``result_async``); plain values pass."""
        try:
            if hasattr(pending, "result_async"):
                waiting: Awaitable[Any] = pending.result_async()
            elif inspect.isawaitable(pending):
                waiting = pending
            else:
                return pending
            if timeout_s is None:
                return await waiting
            return await asyncio.wait_for(waiting, timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            raise self._error(exc, doing or "waiting for a result") from exc

    async def _call(self, submit: Callable[[], Any], doing: str, *, timeout_s: float | None = None) -> Any:
        return await self._resolve(self._submit(submit, doing), doing, timeout_s=timeout_s)

    async def _retrying(self, attempt: Callable[[], Awaitable[T]]) -> T:
        """Run ``attempt``, again after each delay in :attr:`retry_delays_s` while it fails retryably."""
        delays = list(self.retry_delays_s)
        while True:
            try:
                return await attempt()
            except BackendError as exc:
                if not exc.retryable or not delays:
                    raise
                delay = delays.pop(0)
                log.warning("%s; retrying in %.0f s", exc, delay)
                await asyncio.sleep(delay)

    def _error(self, exc: BaseException, doing: str, sdk: TinkerShapedSdk | None = None) -> BackendError:
        sdk = sdk or self._sdk
        title = sdk.title if sdk is not None else self.name
        return wire.backend_error(
            exc,
            doing=doing,
            title=title,
            key_env=sdk.key_env if sdk is not None else "the API key",
            timeout_errors=sdk.timeout_errors if sdk is not None else (),
            connection_errors=sdk.connection_errors if sdk is not None else (),
            redact=self._redact,
        )

    def _require_sdk(self) -> TinkerShapedSdk:
        if self._sdk is None:
            raise BackendError(f"the {self.name} backend is not started; call start() first")
        return self._sdk

    def _require_service(self) -> Any:
        if self._service is None:
            raise BackendError(f"the {self.name} backend is not started; call start() first")
        return self._service

    def _require_current(self) -> ServedVersion:
        if self._current is None:
            raise BackendError(f"the {self.name} backend is not started; call start() first")
        return self._current

    def _require_base(self) -> ServedVersion:
        if self._base is None:
            raise BackendError(f"the {self.name} backend is not started; call start() first")
        return self._base


def _write_record(target: Path, record: dict[str, Any]) -> None:
    """Write ``target/openclaw-state.json`` atomically (a reader never sees half a record)."""
    target.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".state-", dir=target)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(record, indent=2) + "\n")
        os.replace(tmp, target / STATE_FILE)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
