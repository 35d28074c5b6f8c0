"""The local backend: the policy runs in this process, PEFT LoRA trains it, and one base model serves every version.

Serving and training share the base weights: the trainer builds its PEFT model on a copy of the module tree that
shares the parameter tensors, and the serving side wraps the served tree's LoRA targets so each request runs on the
LoRA deltas of the version it pinned (:mod:`openclaw_cli.backends.local.serving`). Trainer calls run in a worker
thread under one asyncio lock, serving in the sampler's own scheduler thread, so a training step never blocks a reply.

Heavy imports (torch, transformers, peft) happen in :meth:`LocalBackend.start`, so listing backends stays fast.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import importlib
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from openclaw_cli.adapters import SHARED_ADAPTER, adapter_state_dir
from openclaw_cli.backend import BASE_VERSION, BackendError, Check
from openclaw_cli.backends.local.heap import keep_large_allocations_mapped, release_free_memory
from openclaw_cli.backends.sampler_serving import AdapterServing, ServesFromSampler
from openclaw_cli.types import (
    AdamParams,
    Datum,
    FwdBwdResult,
    LossName,
    OutputConstraint,
    PolicyVersion,
    SampleResult,
    SamplingParams,
    StepResult,
    StreamEvent,
)

if TYPE_CHECKING:
    from openclaw_cli.backends.local.adapter_states import AdapterStates
    from openclaw_cli.backends.local.lora_delta import LoraWeights
    from openclaw_cli.backends.local.model_loading import LoadedModel
    from openclaw_cli.backends.local.remote_vllm import RemoteVLLMSampler
    from openclaw_cli.backends.local.sampler import AdapterSampler, TransformersSampler
    from openclaw_cli.backends.local.serving import PolicyVersions
    from openclaw_cli.backends.local.trainer import LoraTrainer
    from openclaw_cli.backends.local.vllm_sampler import VLLMSampler
    from openclaw_cli.settings import Settings
    from openclaw_cli.tokenizer import HFChatTokenizer

SamplerKind = Literal["transformers", "vllm", "remote"]
STATE_FILE = "openclaw-state.json"
TRAINER_SUBDIR = "trainer"
_STATE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def choose_sampler(preference: str, *, servers: bool = False) -> SamplerKind:
    """``auto`` = the vLLM servers of ``local.vllm_servers`` when listed (``servers``), else vLLM when it is
    installed and a GPU exists, else transformers; an explicit choice must work."""
    if preference == "transformers":
        return "transformers"
    if preference == "remote" or (preference == "auto" and servers):
        if not servers:
            raise BackendError("local.sampler is 'remote' but local.vllm_servers lists no server")
        return "remote"
    if preference not in ("auto", "vllm"):
        raise BackendError(f"unknown local.sampler {preference!r}; use auto, transformers, vllm or remote")
    from openclaw_cli.backends.local.vllm_sampler import vllm_available  # light: vllm itself is imported only on start

    usable, why = vllm_available()
    if preference == "vllm" and not usable:
        raise BackendError(f"local.sampler is 'vllm' but {why}; use local.sampler = 'auto' or 'transformers'")
    return "vllm" if usable else "transformers"


class LocalBackend(ServesFromSampler):
    """In-process policy: PEFT LoRA trainer + versioned serving over one copy of the base weights.

    With the vLLM sampler, vLLM serves ``sample``/``stream`` while the torch model keeps the same versions (every
    publish goes to both, under the same number) for ``compute_logprobs``.
    """

    name = "local"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.sampler_kind: SamplerKind | None = None
        self._loaded: LoadedModel | None = None
        self._trainer: LoraTrainer | None = None
        self._versions: PolicyVersions | None = None
        self._torch_sampler: TransformersSampler | None = None  # scoring always; serving unless vLLM serves
        self._vllm: VLLMSampler | RemoteVLLMSampler | None = None
        self._vllm_adapters: Path | None = None
        self._train_lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        # Per adapter (openclaw_cli.adapters), shared by reference with every view (:meth:`adapter`): the trainer
        # step whose weights the adapter's current version serves (-1: none; absent: 0), and (version, trainer
        # step) of the adapter's last staged version.
        self._adapter = SHARED_ADAPTER
        self._states: AdapterStates | None = None
        self._served_steps: dict[str, int] = {}
        self._staged_steps: dict[str, tuple[int, int]] = {}
        self._views: dict[str, LocalBackend] = {}

    # -- one adapter per owner ------------------------------------------------------------------------------------

    def adapter(self, name: str) -> LocalBackend:
        """This backend as adapter ``name`` sees it: serving, scoring, training, versions and checkpoints all act on
        that adapter alone (``SHARED_ADAPTER``: this backend itself). The view shares everything else (the model,
        the sampler, the locks) with this backend, so it is cheap; call after :meth:`start`."""
        if name == self._adapter:
            return self
        self._require_versions()  # a view made before start would never see the started parts
        view = self._views.get(name)
        if view is None:
            view = copy.copy(self)  # a shallow copy: every attribute but the adapter name is the same object
            view._adapter = name
            self._views[name] = view
        return view

    async def _hold(self) -> LoraTrainer:
        """The trainer, holding this view's adapter (call under the training lock)."""
        trainer = self._require_trainer()
        states = self._states
        if states is not None and states.holding != self._adapter:
            await asyncio.to_thread(states.hold, self._adapter)
        return trainer

    @property
    def _published_step(self) -> int:
        return self._served_steps.get(self._adapter, 0)

    @_published_step.setter
    def _published_step(self, step: int) -> None:
        self._served_steps[self._adapter] = step

    # -- lifecycle ----------------------------------------------------------------------------------------------

    async def start(self) -> None:
        async with self._start_lock:
            if self._torch_sampler is not None:
                return
            local = self.settings.local
            kind = choose_sampler(local.sampler, servers=bool(local.vllm_servers))
            keep_large_allocations_mapped()  # before the model's tensors exist (see heap.py)
            loaded, trainer, states, versions, torch_sampler = await asyncio.to_thread(self._build)
            if kind in ("vllm", "remote"):
                self._vllm_adapters = Path(tempfile.mkdtemp(prefix="openclaw-vllm-adapters-"))
                vllm = self._vllm_sampler(kind, loaded, trainer, torch_sampler)
                try:
                    await vllm.start()
                except BaseException:
                    with contextlib.suppress(Exception):  # its connections and watcher (a remote sampler's)
                        await vllm.close()
                    torch_sampler.close()
                    shutil.rmtree(self._vllm_adapters, ignore_errors=True)
                    raise
                self._vllm = vllm
            self._loaded, self._trainer, self._versions, self._states = loaded, trainer, versions, states
            self._torch_sampler = torch_sampler
            self.sampler_kind = kind

    def _vllm_sampler(
        self, kind: SamplerKind, loaded: LoadedModel, trainer: LoraTrainer, torch_sampler: TransformersSampler
    ) -> VLLMSampler | RemoteVLLMSampler:
        """vLLM in this process, or the team's vLLM servers (``local.vllm_servers``), checked against the torch
        copy of the same base model."""
        assert self._vllm_adapters is not None
        if kind == "vllm":
            from openclaw_cli.backends.local.vllm_sampler import VLLMSampler

            return VLLMSampler(loaded.path, loaded.tokenizer, self.settings, adapter_dir=self._vllm_adapters)
        from openclaw_cli.backends.local.remote_vllm import RemoteVLLMSampler

        async def score_base(tokens: list[int], start: int) -> list[float | None]:
            return await torch_sampler.compute_logprobs(tokens, version=BASE_VERSION, start=start)

        shared = self.settings.local.vllm_adapter_dir
        return RemoteVLLMSampler(
            loaded.path,
            loaded.tokenizer,
            self.settings,
            adapter_dir=Path(shared).expanduser() if shared is not None else self._vllm_adapters,
            scorer=score_base,
            probe_weights=trainer.lora_weights(),
        )

    def _build(self) -> tuple[LoadedModel, LoraTrainer, AdapterStates, PolicyVersions, TransformersSampler]:
        from openclaw_cli.backends.local.adapter_states import AdapterStates
        from openclaw_cli.backends.local.model_loading import load_model
        from openclaw_cli.backends.local.sampler import TransformersSampler
        from openclaw_cli.backends.local.serving import PolicyVersions
        from openclaw_cli.backends.local.trainer import LoraTrainer

        settings = self.settings
        loaded = load_model(settings)
        # The trainer copies the module tree before the serving wrappers go in, so PEFT never sees our wrappers.
        try:
            trainer = LoraTrainer(loaded.model, settings.lora, seed=settings.local.seed, every_position=False)
        except ValueError as exc:  # e.g. no LoRA target matches this model's layers
            raise BackendError(f"cannot set up LoRA training on {loaded.path}: {exc}") from exc

        # Owners' adapters past lora.resident_adapters wait in files in their own directories, for training and
        # for serving alike.
        def directory_of(adapter: str) -> Path:
            return adapter_state_dir(settings, adapter)

        states = AdapterStates(trainer, resident=settings.lora.resident_adapters, directory_of=directory_of)
        versions = PolicyVersions(
            loaded.model,
            settings.lora.targets,
            keep=settings.local.keep_versions,
            resident=settings.lora.resident_adapters,
            spill_dir=directory_of,
        )
        sampler = TransformersSampler(
            loaded.model,
            loaded.tokenizer,
            versions,
            max_concurrent=settings.local.max_concurrent_requests,
            decode_threads=settings.local.decode_threads,
            context_length=loaded.tokenizer.context_length,
        )
        return loaded, trainer, states, versions, sampler

    async def close(self) -> None:
        if self._vllm is not None:
            await self._vllm.close()
        if self._torch_sampler is not None:
            self._torch_sampler.close()
        if self._vllm_adapters is not None:
            shutil.rmtree(self._vllm_adapters, ignore_errors=True)
        self._vllm = self._vllm_adapters = self._torch_sampler = None
        self._versions = self._trainer = self._loaded = self._states = None
        self._views.clear()

    # -- serving ------------------------------------------------------------------------------------------------

    def tokenizer(self) -> HFChatTokenizer:
        return self._require_loaded().tokenizer

    # -- serving: vLLM's constrained replies get the policy's own log-probabilities --------------------------------

    async def sample(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> SampleResult:
        result = await super().sample(prompt_tokens, params, version)
        return await self._with_policy_logprobs(prompt_tokens, params, result)

    def stream(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        events = super().stream(prompt_tokens, params, version)
        if self._vllm is None or params.constraint is None:
            return events
        return self._rescored(prompt_tokens, params, events)

    async def _rescored(
        self, prompt_tokens: list[int], params: SamplingParams, events: AsyncIterator[StreamEvent]
    ) -> AsyncIterator[StreamEvent]:
        async with contextlib.aclosing(cast(Any, events)):
            async for event in events:
                if isinstance(event, SampleResult):
                    event = await self._with_policy_logprobs(prompt_tokens, params, event)
                yield event

    async def _with_policy_logprobs(
        self, prompt_tokens: list[int], params: SamplingParams, result: SampleResult
    ) -> SampleResult:
        """A reply vLLM decoded under a constraint carries the masked distribution's log-probabilities (vLLM masks
        before it computes them): the torch copy of the same version scores it for the policy's own, and the masked
        values become the sampling log-probabilities where they are that (temperature 1, unfiltered)."""
        if self._vllm is None or params.constraint is None or not result.tokens:
            return result
        scores = await self._scoring_sampler().compute_logprobs(
            list(prompt_tokens) + result.tokens, version=result.version, start=len(prompt_tokens)
        )
        masked = result.logprobs
        result.logprobs = [float(v) for v in scores[len(prompt_tokens) :] if v is not None]
        if params.temperature == 0:
            result.sampling_logprobs = [0.0] * len(result.tokens)
        elif params.temperature == 1 and params.top_p >= 1 and params.top_k <= 0:
            result.sampling_logprobs = masked
        return result

    def accepts_constraint(self, constraint: OutputConstraint) -> str | None:
        """None when the serving sampler decodes under ``constraint`` (llguidance on the transformers sampler,
        vLLM's structured outputs on vLLM), else why not (the proxy then checks and resamples)."""
        return self._serving_sampler().accepts_constraint(constraint)

    def current_version(self) -> PolicyVersion:
        return self._require_versions().current(self._adapter)

    async def next_token_logprobs(
        self, prompt_tokens: list[int], candidates: list[int], *, version: int | None = None
    ) -> list[float]:
        """log p(c | prompt) for each candidate token, one forward pass (the judge's verdict readout)."""
        return await self._require_sampler().next_token_logprobs(
            prompt_tokens, candidates, version=version, adapter=self._adapter
        )

    # -- training -----------------------------------------------------------------------------------------------

    async def forward_backward(
        self, datums: list[Datum], loss: LossName, loss_config: dict[str, float] | None = None
    ) -> FwdBwdResult:
        async with self._train_lock:
            trainer = await self._hold()
            with self._require_sampler().other_work.running():  # decode steps leave it cores meanwhile
                return await asyncio.to_thread(trainer.forward_backward, datums, loss, loss_config)

    async def discard_gradients(self) -> None:
        async with self._train_lock:
            trainer = await self._hold()
            trainer.discard_gradients()  # sets .grad to None: no tensor work worth a thread

    async def optim_step(self, adam: AdamParams) -> StepResult:
        async with self._train_lock:
            trainer = await self._hold()
            with self._require_sampler().other_work.running():
                result = await asyncio.to_thread(trainer.optim_step, adam)
            # The step's activations and gradients are all freed by now: give their pages back (see heap.py).
            await asyncio.to_thread(release_free_memory)
            return result

    async def publish(self, name: str | None = None) -> PolicyVersion:
        async with self._train_lock:
            trainer = await self._hold()
            weights = await asyncio.to_thread(trainer.lora_weights)
            info = await self._publish_everywhere(weights, name, None)
            self._published_step = trainer.step
            return info

    # -- version control (optional capabilities: see openclaw_cli.backend.SupportsVersionControl) ---------------

    async def stage(self, name: str | None = None) -> PolicyVersion:
        """Like :meth:`publish`, but the new version is only servable when pinned; the current one keeps serving
        until :meth:`activate` promotes it (the promotion gate evaluates it in between)."""
        async with self._train_lock:
            trainer = await self._hold()
            weights = await asyncio.to_thread(trainer.lora_weights)
            info = await self._publish_everywhere(weights, name, None, make_current=False)
            self._staged_steps[self._adapter] = (info.version, trainer.step)
            return info

    async def activate(self, version: int, *, train_from: bool = False) -> PolicyVersion:
        """Serve ``version`` (a servable one: the base 0 or one of the last ``local.keep_versions``) from now on.

        Serving switches at once, even while a training step runs. ``train_from=True`` (a rollback) then also
        resets the trainer to that version's LoRA weights with a fresh optimizer once the step in progress is done,
        so training continues from what is served instead of republishing the abandoned weights at the next step.
        Without it the trainer is untouched (promoting a staged version: the trainer already has it).
        """
        versions = self._require_versions()
        served = versions.acquire(version, self._adapter)  # raises, listing the servable versions, if not one
        info = self._serve(version)
        async with self._train_lock:
            trainer = await self._hold()
            if train_from:
                try:
                    await asyncio.to_thread(trainer.set_lora_weights, served.weights)
                except ValueError as exc:
                    raise BackendError(f"cannot train from version {version}: {exc}") from exc
                # A step that finished while we waited may have published the abandoned weights: serve ours again.
                info = self._serve(version)
                # The trainer's weights are exactly this version again, so a checkpoint may record it as such.
                self._published_step = trainer.step
            else:
                # Only a version staged from the trainer's present weights is what the trainer holds.
                step = trainer.step
                self._published_step = step if self._staged_steps.get(self._adapter) == (info.version, step) else -1
        return info

    def _serve(self, version: int) -> PolicyVersion:
        if self._vllm is not None:
            self._vllm.make_current(version, self._adapter)
        return self._require_versions().make_current(version, self._adapter)

    def serving_status(self) -> dict[str, Any]:
        """What serves (for ``openclaw status``): the sampler, and each vLLM server's health when they serve."""
        status: dict[str, Any] = {"sampler": self.sampler_kind}
        servers = getattr(self._vllm, "status", None)
        if callable(servers):
            status["vllm_servers"] = servers()
        return status

    def servable_versions(self) -> list[int]:
        """Version numbers that can be served or activated now (0 = the base model), oldest first."""
        return self._require_versions().servable(self._adapter)

    async def _publish_everywhere(
        self, weights: LoraWeights, name: str | None, version: int | None, *, make_current: bool = True
    ) -> PolicyVersion:
        versions = self._require_versions()
        if self._vllm is None:
            return versions.publish(weights, name, version=version, make_current=make_current, adapter=self._adapter)
        # vLLM numbers first (by the same rule as the torch side); the torch side mirrors whatever number vLLM
        # gave, so scoring and serving always agree on what "version N" of this adapter is.
        info = await self._vllm.publish(
            weights, name, version=version, make_current=make_current, adapter=self._adapter
        )
        mirrored = versions.publish(
            weights, name, version=info.version, make_current=make_current, adapter=self._adapter
        )
        if mirrored.version != info.version:
            raise BackendError(f"version numbers diverged: vLLM {info.version}, torch side {mirrored.version}")
        return info

    # -- the owner's own weights -----------------------------------------------------------------------------------

    async def export_adapter(self, directory: Path) -> PolicyVersion:
        """Write this view's adapter at its current version to ``directory`` as a PEFT LoRA adapter (loadable by
        PEFT and vLLM on the same base model); returns the version written. The base model (version 0: nothing
        trained yet) is a 404 BackendError."""
        from openclaw_cli.backends.local.lora_delta import write_peft_adapter

        served = self._require_versions().acquire(None, self._adapter)
        if not served.weights:
            raise BackendError("no trained adapter yet: the base model serves (version 0)", status_code=404)
        await asyncio.to_thread(write_peft_adapter, served.weights, directory, self._require_loaded().path)
        return served.info

    # -- checkpoints --------------------------------------------------------------------------------------------

    async def save_state(self, name: str) -> str:
        """Write trainer state + the serving version to ``local.state_dir/<name>`` (atomically); returns its path.

        The file records whether the trainer's weights are exactly the current version's (no optimizer step
        since the last publish); only then does ``load_state`` bring that version number back.
        """
        from openclaw_cli.backends.local.model_loading import write_dir_atomically

        if not _STATE_NAME.match(name):
            raise BackendError(f"checkpoint name {name!r} must be letters, digits, '.', '_' or '-' (max 128)")
        versions = self._require_versions()
        target = adapter_state_dir(self.settings, self._adapter) / name
        async with self._train_lock:
            trainer = await self._hold()
            current = versions.current(self._adapter)
            state = {
                "version": current.version,
                "version_name": current.name,
                "weights_are_version": trainer.step == self._published_step,
                "trainer_step": trainer.step,
                "model": str(self._require_loaded().path),
                "adapter": self._adapter,
                "saved_at": time.time(),
            }

            def write(directory: Path) -> None:
                trainer.save(directory / TRAINER_SUBDIR)
                (directory / STATE_FILE).write_text(json.dumps(state, indent=2) + "\n")

            await asyncio.to_thread(write_dir_atomically, target, write)
        return str(target)

    async def load_state(self, path: str) -> PolicyVersion:
        """Restore the trainer from ``path`` and serve its weights (under the saved version number when it was
        a published version and that number is still unused here; else the next one)."""
        versions = self._require_versions()
        directory = Path(path).expanduser()
        try:
            state: dict[str, Any] = json.loads((directory / STATE_FILE).read_text())
        except (OSError, ValueError) as exc:
            raise BackendError(f"{directory} is not a local-backend checkpoint (no readable {STATE_FILE})") from exc
        saved_adapter = state.get("adapter", SHARED_ADAPTER)
        if saved_adapter != self._adapter:
            raise BackendError(f"{directory} is adapter {saved_adapter}'s checkpoint, not {self._adapter}'s")
        async with self._train_lock:
            trainer = await self._hold()
            try:
                await asyncio.to_thread(trainer.load, directory / TRAINER_SUBDIR)
            except (OSError, ValueError) as exc:
                raise BackendError(f"cannot restore the trainer from {directory}: {exc}") from exc
            saved_version = int(state.get("version", 0))
            exact = bool(state.get("weights_are_version"))
            if exact and saved_version == 0 and versions.current(self._adapter).version == 0:
                info = versions.current(self._adapter)  # nothing was ever published: the base serves, as it did
            else:
                weights = await asyncio.to_thread(trainer.lora_weights)
                name = state.get("version_name") if exact else None
                info = await self._publish_everywhere(weights, name, saved_version if exact else None)
            self._published_step = trainer.step
            return info

    # -- readiness ----------------------------------------------------------------------------------------------

    @classmethod
    def diagnose(cls, settings: Settings) -> list[Check]:
        """Import checks, device, model location and sampler choice. Loads no model weights."""
        checks = [_import_check(module) for module in ("torch", "transformers", "peft")]
        if not checks[0].ok:
            return checks
        from openclaw_cli.backends.local.model_loading import resolve_device

        try:
            device = resolve_device(settings.local.device)
            detail = str(device)
            if device.type == "cuda":
                import torch

                detail += f" ({torch.cuda.get_device_name(device)})"
            checks.append(Check("device", True, detail))
        except BackendError as exc:
            checks.append(Check("device", False, str(exc)))
        checks.append(_model_check(settings))
        if settings.local.vllm_servers and settings.local.sampler in ("auto", "remote"):
            from openclaw_cli.backends.local.remote_checks import server_checks

            return checks + server_checks(settings)
        from openclaw_cli.backends.local.vllm_sampler import vllm_available

        usable, why = vllm_available()
        if settings.local.sampler == "vllm":
            checks.append(Check("sampler", usable, "vllm" if usable else why))
        else:
            chosen = "vllm" if usable and settings.local.sampler == "auto" else "transformers"
            checks.append(Check("sampler", True, f"{chosen} ({why})"))
        return checks

    # -- helpers ------------------------------------------------------------------------------------------------

    def _require_loaded(self) -> LoadedModel:
        if self._loaded is None:
            raise BackendError("the local backend is not started; call start() first")
        return self._loaded

    def _require_trainer(self) -> LoraTrainer:
        if self._trainer is None:
            raise BackendError("the local backend is not started; call start() first")
        return self._trainer

    def _require_versions(self) -> PolicyVersions:
        if self._versions is None:
            raise BackendError("the local backend is not started; call start() first")
        return self._versions

    def _require_sampler(self) -> TransformersSampler:
        if self._torch_sampler is None:
            raise BackendError("the local backend is not started; call start() first")
        return self._torch_sampler

    def _serving_sampler(self) -> TransformersSampler | AdapterServing | VLLMSampler | RemoteVLLMSampler:
        if self._vllm is None:
            return self._scoring_sampler()
        if self._adapter == SHARED_ADAPTER:
            return self._vllm
        return AdapterServing(self._vllm, self._adapter)

    def _scoring_sampler(self) -> TransformersSampler | AdapterSampler:
        """The torch sampler, for this view's adapter (teacher-forced scoring runs in torch, also when vLLM
        serves)."""
        sampler = self._require_sampler()
        if self._adapter == SHARED_ADAPTER:
            return sampler
        from openclaw_cli.backends.local.sampler import AdapterSampler

        return AdapterSampler(sampler, self._adapter)


def _import_check(module: str) -> Check:
    try:
        imported = importlib.import_module(module)
    except Exception as exc:  # a broken install must show up as a failed check, not crash `doctor`
        return Check(f"{module} importable", False, f"{type(exc).__name__}: {exc}; pip install 'openclaw-cli[local]'")
    return Check(f"{module} importable", True, getattr(imported, "__version__", "unknown version"))


def _model_check(settings: Settings) -> Check:
    """Where the model would come from, without loading or converting it."""
    from openclaw_cli.backends.local import model_loading as ml

    spec = (settings.model or "").strip()
    if not spec:
        try:
            gguf = ml.embedded_gguf_file()
        except BackendError as exc:
            return Check("model", False, str(exc))
        converted = (ml.cache_root() / ml.EMBEDDED_CACHE_SUBDIR / "config.json").is_file()
        state = "converted copy cached" if converted else "converts once on first start (about a minute)"
        return Check("model", True, f"embedded SmolLM2-135M-Instruct from {gguf.name}; {state}")
    local = Path(spec).expanduser()
    if local.is_dir():
        ok = (local / "config.json").is_file()
        return Check("model", ok, str(local) if ok else f"{local} has no config.json")
    if local.is_file():
        ok = local.suffix.lower() == ".gguf"
        return Check("model", ok, str(local) if ok else f"{local} is a file but not a .gguf model")
    if spec.startswith(("/", ".", "~")) or spec.endswith(".gguf"):
        return Check("model", False, f"model path not found: {local}")
    try:
        from huggingface_hub import try_to_load_from_cache

        cached = isinstance(try_to_load_from_cache(spec, "config.json"), str)
    except Exception as exc:  # invalid repo id and the like
        return Check("model", False, f"{spec!r}: {exc}")
    if cached:
        return Check("model", True, f"{spec} (in the Hugging Face cache)")
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}:
        return Check("model", False, f"{spec} is not in the Hugging Face cache and HF_HUB_OFFLINE is set")
    return Check("model", True, f"{spec} (not cached; downloads on first start)")
