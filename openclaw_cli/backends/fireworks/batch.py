"""Fireworks batch mode: judged samples -> an SFT job warm-started from the last LoRA -> the new LoRA on the
deployment -> serving switches to it. For accounts without the step-wise training SDK.

**Why SFT warm start, not keep-alive RL trainer steps.** Fireworks offers two ways to train in batches: a
keep-alive RL trainer (``rlorTrainerJobs`` + ``:executeTrainStep`` on datasets of ``{"samples": [...], "evals":
{"score"}}``) and supervised fine-tuning with ``warmStartFrom``. The RL trainer computes group-relative advantages
over the N samples of each prompt; live traffic yields ONE sample per prompt, whose group-relative advantage is
zero, so our judge scores would carry no signal there. It also keeps a trainer (GPUs) alive between steps. SFT
jobs are generally available, billed per job, and chain: each one starts from the previous LoRA. So a batch step
is rejection-sampling fine-tuning: the positively judged replies (advantage sum > 0) become the SFT targets, and
negatively judged ones are left out (their signal is lost in this mode; the step-wise mode uses it).

**The protocol mapping** (what :class:`openclaw_cli.learn.trainer_loop.TrainerLoop` calls):

- ``forward_backward(datums, ...)`` queues the positive datums as SFT rows (deduplicated, so the loop's retry of a
  failed step does not queue them twice; persisted in ``fireworks.state_dir/pending.jsonl``). Nothing is computed
  locally: the result's ``loss`` is NaN (not computed; the store records it as null) and its per-datum
  ``logprobs`` are empty.
- ``optim_step`` returns at once while fewer than ``fireworks.batch_samples`` rows are queued. Otherwise it runs the
  whole remote cycle and returns when the new LoRA is loaded: dataset create + upload, SFT job (capped by
  ``fireworks.max_steps_per_day``), output model READY, ``deployedModels`` load (with ``replaceMergedAddon`` on a
  hot-reload deployment), DEPLOYED. Serving continues on the published version all along. A failure leaves the
  rows queued for the next try.
- ``publish`` switches serving to the loaded LoRA (a new version); with nothing new it returns the current version.
  On a multi-LoRA deployment LoRAs older than the newest ``fireworks.keep_versions`` are unloaded.

**Version control** (rollback and the promotion gate; :class:`~openclaw_cli.backend.SupportsVersionControl`). On a
multi-LoRA deployment the base and the newest ``fireworks.keep_versions`` LoRAs stay loaded, so ``stage`` makes the
loaded LoRA a version servable by pin without serving it, and ``activate(N)`` switches which model name serving
uses, at once. ``activate(N, train_from=True)`` also makes the next SFT job warm-start from version N's model (the
base model for 0); a job still running then is abandoned when it ends (its LoRA unloaded, its samples queued
again), so the abandoned weights never come back. A hot-reload deployment holds one LoRA, replaced in place, so only
its current version is servable: activating another one is a 409, and ``train.promotion_gate`` is refused at start.

**Conversations.** SFT rows are chat messages, but datums carry token ids. The backend's tokenizer remembers, for
the prompts it rendered (the proxy renders every request through it), which messages and tools produced them; a
datum whose prompt it does not know (rendered before a restart) is skipped and counted. The assistant reply is the
decoded completion, split into content / tool calls / reasoning by the model's parser; earlier assistant turns get
``weight: 0`` so only the judged reply is trained.

**An adapter per owner** (``lora.scope = owner``; :meth:`FireworksBatchBackend.adapter`). Each owner gets a view
of this backend with its own queue of SFT rows, its own warm-start chain of LoRAs (its first job starts from the
base model) and its own served versions, all on the one multi-LoRA deployment: an owner's request names that owner's
LoRA, and each owner keeps its newest ``fireworks.keep_versions`` LoRAs loaded, so the deployment holds at most
owners x keep_versions addons. A view's files (queue and state, which hold that owner's conversations) live under the
owner's adapter directory (``local.state_dir/adapters/<name>/fireworks``), which ``openclaw forget-owner`` deletes.
A hot-reload deployment holds one LoRA, so it cannot serve owners apart: refused at start.

**State.** ``fireworks.state_dir/batch-state.json`` holds the warm-start chain and the serving LoRA after every job
and publish, so a restart continues from the newest model; ``save_state`` writes the same snapshot as a checkpoint
for the trainer loop, and ``load_state`` of an older snapshot keeps the newer model.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import os
import re
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openclaw_cli.adapters import SHARED_ADAPTER, adapter_state_dir
from openclaw_cli.backend import BackendError
from openclaw_cli.backends.fireworks.control import (
    DeploymentSpec,
    FireworksControl,
    UsageLedger,
    check_deployment,
    make_client,
    resolve_base_model,
    resolve_credentials,
    resolve_tokenizer_source,
)
from openclaw_cli.backends.fireworks.serving import (
    BASE_VERSION,
    FireworksSampler,
    ServedModel,
    ServedVersions,
    deployment_model_name,
)
from openclaw_cli.backends.sampler_serving import ServesFromSampler
from openclaw_cli.structured_output import plain_json_schema
from openclaw_cli.types import (
    AdamParams,
    Datum,
    FwdBwdResult,
    LossName,
    Message,
    OutputConstraint,
    ParsedAssistant,
    PolicyVersion,
    StepResult,
)

if TYPE_CHECKING:
    from fireworks import AsyncFireworks, Fireworks

    from openclaw_cli.settings import Settings
    from openclaw_cli.tokenizer import HFChatTokenizer

log = logging.getLogger("openclaw.fireworks")

STATE_FILE = "openclaw-state.json"  # the checkpoint marker the trainer loop looks for
BATCH_STATE_FILE = "batch-state.json"
PENDING_FILE = "pending.jsonl"
USAGE_FILE = "usage.json"
HOT_RELOAD_HOLDS_ONE_LORA = (
    "a hot-reload Fireworks deployment holds one LoRA for everyone (use fireworks.addon_mode = 'multi_lora')"
)
_STATE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
_ID_CHARS = re.compile(r"[^a-z0-9-]+")


# ---------------------------------------------------------------------------------------------------------------
# Recovering the conversation behind a prompt


def _digest(*parts: Sequence[int]) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(b"".join(int(t).to_bytes(8, "little", signed=True) for t in part))
    return h.hexdigest()


class RecordingTokenizer:
    """The model's chat tokenizer, remembering which messages + tools rendered each generation prompt (LRU)."""

    def __init__(self, inner: HFChatTokenizer, *, capacity: int = 4096) -> None:
        self.inner = inner
        self.capacity = capacity
        self._lock = threading.Lock()  # the proxy renders in worker threads
        self._seen: OrderedDict[str, tuple[list[Message], list[dict[str, Any]] | None]] = OrderedDict()

    @property
    def eos_token_ids(self) -> Sequence[int]:
        return self.inner.eos_token_ids

    @property
    def context_length(self) -> int:
        return self.inner.context_length

    def render(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *, add_generation_prompt: bool = True
    ) -> list[int]:
        ids = self.inner.render(messages, tools, add_generation_prompt=add_generation_prompt)
        if add_generation_prompt:
            entry = (copy.deepcopy(messages), copy.deepcopy(tools) if tools else None)
            with self._lock:
                key = _digest(ids)
                self._seen[key] = entry
                self._seen.move_to_end(key)
                while len(self._seen) > self.capacity:
                    self._seen.popitem(last=False)
        return ids

    def conversation(self, prompt_ids: Sequence[int]) -> tuple[list[Message], list[dict[str, Any]] | None] | None:
        with self._lock:
            found = self._seen.get(_digest(prompt_ids))
        return copy.deepcopy(found) if found is not None else None

    def encode(self, text: str) -> list[int]:
        return self.inner.encode(text)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.inner.decode(token_ids)

    def parse_assistant(self, text: str, *, tools_offered: bool = True) -> ParsedAssistant:
        return self.inner.parse_assistant(text, tools_offered=tools_offered)


# ---------------------------------------------------------------------------------------------------------------
# Datums -> SFT rows


@dataclass(frozen=True)
class SplitDatum:
    prompt: list[int]
    completion: list[int]
    signal: float | None  # sum of advantage x weight over the completion; None without advantages


def split_datum(datum: Datum) -> SplitDatum | None:
    """Prompt and completion of a Tinker-aligned datum: the prompt ends where the first weighted target begins.
    None when no target carries weight."""
    inputs = datum.loss_fn_inputs
    weights = inputs.get("weights") or [1.0] * len(datum.model_input)
    start = next((i for i, w in enumerate(weights) if w > 0), None)
    if start is None:
        return None
    prompt = [int(t) for t in datum.model_input[: start + 1]]
    completion = [int(t) for t in inputs["target_tokens"][start:]]
    advantages = inputs.get("advantages")
    signal = None
    if advantages is not None:
        signal = sum(a * w for a, w in zip(advantages[start:], weights[start:], strict=True))
    return SplitDatum(prompt, completion, signal)


def sft_row(messages: list[Message], tools: list[dict[str, Any]] | None, reply: ParsedAssistant) -> dict[str, Any]:
    """One Fireworks SFT row: the conversation, earlier assistant turns at weight 0, the judged reply at weight 1."""
    history = []
    for message in messages:
        entry = dict(message)
        if entry.get("role") == "assistant":
            entry["weight"] = 0
        history.append(entry)
    answer: dict[str, Any] = {"role": "assistant", "content": reply.content, "weight": 1}
    if reply.tool_calls:
        answer["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in reply.tool_calls
        ]
    if reply.reasoning:
        answer["reasoning_content"] = reply.reasoning
    row: dict[str, Any] = {"messages": [*history, answer]}
    if tools:
        row["tools"] = tools
    return row


def default_deployment_id(base_model: str) -> str:
    """``openclaw-<model id>``, lowercased to the characters Fireworks ids allow (at most 63)."""
    slug = _ID_CHARS.sub("-", base_model.rsplit("/", 1)[-1].lower()).strip("-") or "policy"
    return f"openclaw-{slug}"[:63].rstrip("-")


# ---------------------------------------------------------------------------------------------------------------
# The backend


@dataclass
class _ReadyModel:
    model: str  # accounts/<a>/models/<id>
    deployed_model: str  # accounts/<a>/deployedModels/<id>


class FireworksBatchBackend(ServesFromSampler):
    """Serving from a Fireworks deployment, training by SFT jobs (see the module docstring)."""

    name = "fireworks"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.fw = settings.fireworks
        self.state_dir = Path(self.fw.state_dir).expanduser()
        self._tokenizer: RecordingTokenizer | None = None
        self._client: Fireworks | None = None
        self._async_client: AsyncFireworks | None = None
        self.control: FireworksControl | None = None
        self.sampler: FireworksSampler | None = None
        self.base_model = ""
        self.deployment_id = ""
        self._pending: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self._ready: _ReadyModel | None = None  # trained and loaded, not yet published
        self._jobs_done = 0
        self._last_model: str | None = None  # the newest trained LoRA: the next job warm-starts from it
        self._run = time.strftime("%y%m%d%H%M%S") + secrets.token_hex(2)
        self._attempts = itertools.count(1)  # shared with every owner's view: job ids stay unique in the run
        self._train_lock = asyncio.Lock()
        self._lineage = 0  # bumped by a rollback that moves training: a job started before it is abandoned
        self._adapter = SHARED_ADAPTER
        self._views: dict[str, FireworksBatchBackend] = {}
        self._unrestored: dict[str, Any] | None = None  # a view's saved state, served again when its loop resumes

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.sampler is not None:
            return
        try:
            import fireworks
        except ImportError as exc:
            raise BackendError(
                f"the Fireworks SDK is not installed ({exc}); pip install 'openclaw-cli[fireworks]'"
            ) from exc
        if self.settings.train.promotion_gate and self.hot_reload:
            raise BackendError(
                "train.promotion_gate needs fireworks.addon_mode = 'multi_lora': a hot-reload deployment serves a "
                "new LoRA as soon as it is loaded, so a candidate cannot be evaluated before it serves"
            )
        creds = resolve_credentials(self.settings)
        base_model = resolve_base_model(self.settings)
        if not base_model:
            raise BackendError(
                "no Fireworks base model: set fireworks.base_model (or `model`) to e.g. "
                "accounts/fireworks/models/qwen3-8b"
            )
        tokenizer_source = resolve_tokenizer_source(self.settings)
        if not tokenizer_source:
            raise BackendError(
                f"no tokenizer for {base_model}: set fireworks.tokenizer to the Hugging Face id or local path of the "
                "same model (the proxy renders chats with its template and sends token ids)"
            )
        tokenizer = await asyncio.to_thread(self._load_tokenizer, tokenizer_source)
        self.base_model = base_model
        self._client = make_client(creds.api_key, creds.account_id, creds.base_url)
        self._async_client = fireworks.AsyncFireworks(
            api_key=creds.api_key, account_id=creds.account_id, base_url=creds.base_url, max_retries=0, timeout=600.0
        )
        self.state_dir.mkdir(parents=True, exist_ok=True)
        control = FireworksControl(
            self._client,
            creds.account_id,
            UsageLedger(self.state_dir / USAGE_FILE),
            poll_interval_s=self.fw.poll_interval_s,
            max_deployments=self.fw.max_deployments,
            max_steps_per_day=self.fw.max_steps_per_day,
        )
        try:
            self.deployment_id = await asyncio.to_thread(self._prepare_deployment, control)
            deployment = control.name("deployments", self.deployment_id)
            base = ServedModel(PolicyVersion(BASE_VERSION, "base"), deployment_model_name(base_model, deployment))
            versions = ServedVersions(base, keep=self.fw.keep_versions, exclusive=self.hot_reload)
            self.control, self._tokenizer = control, tokenizer
            self.sampler = FireworksSampler(
                self._async_client,
                tokenizer,
                versions,
                deployment=deployment,
                scale_up_timeout_s=self.fw.scale_up_timeout_s,
            )
            self._pending = self._read_pending()
            await self._restore(self._read_json(self.state_dir / BATCH_STATE_FILE), source="fireworks.state_dir")
        except BaseException:
            await self.close()
            raise

    def _load_tokenizer(self, source: str) -> RecordingTokenizer:
        from openclaw_cli.tokenizer import HFChatTokenizer

        try:
            inner = HFChatTokenizer.from_pretrained(source, context_length=self.fw.context_length)
        except Exception as exc:
            raise BackendError(f"cannot load the tokenizer {source!r}: {exc}") from exc
        return RecordingTokenizer(inner)

    def _prepare_deployment(self, control: FireworksControl) -> str:
        """The deployment to serve from: the named existing one, or ours (created when missing); scaled when
        ``fireworks.replicas`` is set, and READY."""
        fw = self.fw
        if fw.deployment:
            deployment_id = fw.deployment.rsplit("/", 1)[-1]
            found = control.get_deployment(deployment_id)
            if found is None:
                raise BackendError(f"Fireworks deployment {deployment_id} not found in account {control.account_id}")
            check_deployment(found, self.base_model, fw.addon_mode)
        else:
            spec = DeploymentSpec(
                deployment_id=default_deployment_id(self.base_model),
                base_model=self.base_model,
                addon_mode=fw.addon_mode,
                min_replicas=fw.min_replicas,
                max_replicas=fw.max_replicas,
                deployment_shape=fw.deployment_shape,
                accelerator_type=fw.accelerator_type,
            )
            deployment_id = control.create_or_get_deployment(spec).name or spec.deployment_id
            deployment_id = deployment_id.rsplit("/", 1)[-1]
        if fw.replicas is not None:
            control.scale_deployment(deployment_id, fw.replicas)
        control.wait_deployment_ready(deployment_id, fw.deploy_timeout_s)
        return deployment_id

    async def close(self) -> None:
        """Close the HTTP clients. Remote resources stay as they are (a deployment with min_replicas 0 scales to
        zero by itself when idle)."""
        if self._async_client is not None:
            await self._async_client.close()
        if self._client is not None:
            self._client.close()
        self._client = self._async_client = None
        self.sampler = self.control = None

    @property
    def hot_reload(self) -> bool:
        return self.fw.addon_mode == "hot_reload"

    # -- an adapter per owner ---------------------------------------------------------------------------------------

    @property
    def serves_adapters(self) -> bool:
        """A multi-LoRA deployment serves each owner's LoRA by name; a hot-reload one holds a single LoRA."""
        return not self.hot_reload

    def adapter(self, name: str) -> FireworksBatchBackend:
        """This backend as adapter ``name`` sees it: its own SFT queue, warm-start chain and served versions on the
        shared deployment (see the module docstring); call after :meth:`start`."""
        if name == self._adapter:
            return self
        sampler = self._require_sampler()
        if not self.serves_adapters:
            raise BackendError(f"{HOT_RELOAD_HOLDS_ONE_LORA}, or set lora.scope = 'shared'", status_code=501)
        view = self._views.get(name)
        if view is None:
            view = copy.copy(self)  # shares the clients, control, tokenizer, deployment and job counter
            view._adapter = name
            view.state_dir = adapter_state_dir(self.settings, name) / "fireworks"
            view.state_dir.mkdir(parents=True, exist_ok=True)
            view._views = {}
            view._train_lock = asyncio.Lock()
            view._lineage, view._jobs_done, view._last_model, view._ready = 0, 0, None, None
            base = sampler.versions.base()
            view.sampler = dataclasses.replace(
                sampler, versions=ServedVersions(base, keep=self.fw.keep_versions, exclusive=False)
            )
            view._pending = view._read_pending()
            view._unrestored = view._read_json(view.state_dir / BATCH_STATE_FILE)
            self._views[name] = view
        return view

    # -- serving --------------------------------------------------------------------------------------------------

    def accepts_constraint(self, constraint: OutputConstraint) -> str | None:
        """Fireworks' JSON mode (``response_format`` json_schema) enforces a plain JSON answer while decoding; a tool
        call in the model's own frame, or JSON-or-a-tool-call, is not a JSON Schema, so it is checked and resampled."""
        if plain_json_schema(constraint) is None:
            return "Fireworks' JSON mode takes one JSON schema, not a tool call in the model's frame"
        return None

    def tokenizer(self) -> RecordingTokenizer:
        if self._tokenizer is None:
            raise BackendError("the Fireworks backend is not started; call start() first")
        return self._tokenizer

    def current_version(self) -> PolicyVersion:
        return self._require_sampler().versions.current().info

    def servable_versions(self) -> list[int]:
        return self._require_sampler().versions.servable()

    # -- training -------------------------------------------------------------------------------------------------

    @property
    def pending_samples(self) -> int:
        return len(self._pending)

    async def forward_backward(
        self, datums: list[Datum], loss: LossName, loss_config: dict[str, float] | None = None
    ) -> FwdBwdResult:
        """Queue the positively judged datums as SFT rows (every datum for ``cross_entropy``)."""
        tokenizer = self.tokenizer()
        queued = not_positive = unknown = tokens = 0
        async with self._train_lock:
            for datum in datums:
                split = split_datum(datum)
                if split is None or (loss != "cross_entropy" and not (split.signal or 0.0) > 0):
                    not_positive += 1
                    continue
                conversation = tokenizer.conversation(split.prompt)
                if conversation is None:
                    unknown += 1
                    continue
                key = _digest(split.prompt, split.completion)
                if key in self._pending:
                    continue
                messages, tools = conversation
                reply = tokenizer.parse_assistant(tokenizer.decode(split.completion), tools_offered=bool(tools))
                self._pending[key] = sft_row(messages, tools, reply)
                queued += 1
                tokens += len(split.completion)
            if queued:
                await asyncio.to_thread(self._write_pending)
        if unknown:
            log.warning(
                "Fireworks batch mode: %d sample(s) skipped, their prompts were not rendered by this process "
                "(captured before a restart?)",
                unknown,
            )
        metrics = {
            "queued": float(queued),
            "pending": float(len(self._pending)),
            "skipped_not_positive": float(not_positive),
            "skipped_unknown_prompt": float(unknown),
            "n_tokens": float(tokens),
        }
        # No loss is computed here: the remote SFT job does the math.
        return FwdBwdResult(loss=math.nan, metrics=metrics, logprobs=[[] for _ in datums])

    async def discard_gradients(self) -> None:
        """Nothing to drop: queued rows are keyed by their tokens, so a retried step cannot queue a sample twice."""

    async def optim_step(self, adam: AdamParams) -> StepResult:
        """Run one remote training cycle once ``fireworks.batch_samples`` rows are queued (see module docstring)."""
        control = self._require_control()
        async with self._train_lock:
            if len(self._pending) < self.fw.batch_samples:
                return StepResult(self._jobs_done, {"job_ran": 0.0, "queued_samples": float(len(self._pending))})
            keys = list(self._pending)
            rows = [self._pending[k] for k in keys]
            learning_rate = self.fw.sft_learning_rate or adam.learning_rate
            started = time.monotonic()
            lineage = self._lineage
            ready = await asyncio.to_thread(self._train_remotely, control, rows, learning_rate)
            if lineage != self._lineage:
                return await self._abandon(ready, len(rows), time.monotonic() - started)
            for key in keys:
                self._pending.pop(key, None)
            self._ready = ready
            self._jobs_done += 1
            self._last_model = ready.model
            await asyncio.to_thread(self._write_pending)
            await asyncio.to_thread(self._write_batch_state)
            seconds = time.monotonic() - started
        log.info("Fireworks: %s loaded after %.0f s (%d samples); publish serves it", ready.model, seconds, len(rows))
        return StepResult(
            self._jobs_done,
            {"job_ran": 1.0, "job_samples": float(len(rows)), "job_seconds": seconds, "learning_rate": learning_rate},
        )

    async def _abandon(self, ready: _ReadyModel, samples: int, seconds: float) -> StepResult:
        """A rollback moved training while this job ran: drop its model, keep its samples queued for the next job
        (which warm-starts from the rolled-back version). Call with the train lock held."""
        log.warning("Fireworks: %s was trained from weights a rollback abandoned; it will not be served", ready.model)
        if not self.hot_reload:
            try:
                await asyncio.to_thread(self._require_control().unload_lora, ready.deployed_model)
            except BackendError as exc:
                log.warning("Fireworks: could not unload %s (%s); it stays loaded", ready.model, exc)
        return StepResult(
            self._jobs_done,
            {"job_ran": 1.0, "job_abandoned": 1.0, "job_samples": float(samples), "job_seconds": seconds},
        )

    def _train_remotely(
        self, control: FireworksControl, rows: list[dict[str, Any]], learning_rate: float
    ) -> _ReadyModel:
        fw = self.fw
        job_id = f"oc-{self._run}-{next(self._attempts)}"
        dataset = control.upload_dataset(job_id, rows, timeout_s=fw.deploy_timeout_s)
        output_model = control.name("models", job_id)
        control.start_sft_job(
            job_id,
            dataset=dataset,
            output_model=output_model,
            base_model=None if self._last_model else self.base_model,
            warm_start_from=self._last_model,
            lora_rank=self.settings.lora.rank,
            epochs=fw.sft_epochs,
            learning_rate=learning_rate,
        )
        control.wait_job(job_id, fw.job_timeout_s)
        control.wait_model_ready(output_model, fw.deploy_timeout_s)
        deployed = control.load_lora(output_model, self.deployment_id, replace_merged=self.hot_reload)
        deployed_name = deployed.name or ""
        if not deployed_name:
            raise BackendError(f"Fireworks did not name the deployed model for {output_model}")
        control.wait_lora_deployed(deployed_name, fw.deploy_timeout_s)
        return _ReadyModel(output_model, deployed_name)

    async def publish(self, name: str | None = None) -> PolicyVersion:
        """Serve the LoRA the last ``optim_step`` loaded; without one, the current version stays."""
        return await self._publish_ready(name, make_current=True)

    async def stage(self, name: str | None = None) -> PolicyVersion:
        """Make the LoRA the last ``optim_step`` loaded a version servable by pin, without serving it (multi-LoRA
        deployments only); without one, the current version is returned."""
        if self.hot_reload:
            raise BackendError(
                "a hot-reload deployment serves a new LoRA as soon as it is loaded, so it cannot be staged; "
                "use fireworks.addon_mode = 'multi_lora'",
                status_code=409,
            )
        return await self._publish_ready(name, make_current=False)

    async def activate(self, version: int, *, train_from: bool = False) -> PolicyVersion:
        """Serve ``version`` from now on (see the module docstring); ``train_from``: the next SFT job warm-starts
        from its model, and a job running now is abandoned when it ends."""
        versions = self._require_sampler().versions
        current = versions.current()
        if self.hot_reload and version != current.number:
            raise BackendError(
                f"policy version {version} cannot serve again: a hot-reload deployment holds only its current LoRA "
                f"(version {current.number}); rollback needs fireworks.addon_mode = 'multi_lora'",
                status_code=409,
            )
        served = versions.make_current(version)  # 400 naming the servable versions when it is not one
        if train_from:
            self._lineage += 1
            self._last_model = served.lora_model  # None: the next job starts from the base model
            abandoned, self._ready = self._ready, None
            if abandoned is not None and abandoned.model != served.lora_model and not self.hot_reload:
                try:
                    await asyncio.to_thread(self._require_control().unload_lora, abandoned.deployed_model)
                except BackendError as exc:
                    log.warning("Fireworks: could not unload %s (%s); it stays loaded", abandoned.model, exc)
        await asyncio.to_thread(self._write_batch_state)
        log.info("Fireworks: serving version %d (%s)", served.number, served.lora_model or "base model")
        return served.info

    async def _publish_ready(self, name: str | None, *, make_current: bool) -> PolicyVersion:
        sampler, control = self._require_sampler(), self._require_control()
        ready = self._ready
        if ready is None:
            return sampler.versions.current().info
        info, dropped = self._serve(ready, name, None, make_current=make_current)
        self._ready = None
        await asyncio.to_thread(self._write_batch_state)
        log.info("Fireworks: %s %s as version %d", "serving" if make_current else "staged", ready.model, info.version)
        if not self.hot_reload:  # on a hot-reload deployment the replaced addon is gone already
            for old in dropped:
                if old.deployed_model:
                    try:
                        await asyncio.to_thread(control.unload_lora, old.deployed_model)
                    except BackendError as exc:
                        log.warning("Fireworks: could not unload %s (%s); it stays loaded", old.lora_model, exc)
        return info

    def _serve(
        self, ready: _ReadyModel, name: str | None, version: int | None, *, make_current: bool = True
    ) -> tuple[PolicyVersion, list[ServedModel]]:
        deployment = self._require_control().name("deployments", self.deployment_id)
        # Hot reload: the deployment's merged addon is the new LoRA, requested under the base model's name.
        model = self.base_model if self.hot_reload else ready.model
        return self._require_sampler().versions.publish(
            deployment_model_name(model, deployment),
            lora_model=ready.model,
            deployed_model=ready.deployed_model,
            name=name,
            version=version,
            make_current=make_current,
        )

    # -- checkpoints ----------------------------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """What a restart needs: the warm-start chain and the LoRA serving now (its weights live on Fireworks)."""
        current = self._require_sampler().versions.current()
        return {
            "backend": "fireworks",
            "mode": "batch",
            "jobs_done": self._jobs_done,
            "last_model": self._last_model,
            "deployment": self.deployment_id,
            "version": current.number,
            "version_name": current.info.name,
            "lora_model": current.lora_model,
            "deployed_model": current.deployed_model,
            "saved_at": time.time(),
        }

    async def save_state(self, name: str) -> str:
        if not _STATE_NAME.match(name):
            raise BackendError(f"checkpoint name {name!r} must be letters, digits, '.', '_' or '-' (max 128)")
        target = adapter_state_dir(self.settings, self._adapter) / name
        snapshot = self.snapshot()

        def write() -> None:
            target.mkdir(parents=True, exist_ok=True)
            _write_json(target / STATE_FILE, snapshot)

        await asyncio.to_thread(write)
        return str(target)

    async def load_state(self, path: str) -> PolicyVersion:
        state = self._read_json(Path(path).expanduser() / STATE_FILE)
        if state is None or state.get("backend") != "fireworks":
            raise BackendError(f"{path} is not a Fireworks checkpoint (no readable {STATE_FILE})")
        newest, self._unrestored = self._unrestored, None
        if newest and int(newest.get("jobs_done", 0)) > int(state.get("jobs_done", 0)):
            path, state = str(self.state_dir / BATCH_STATE_FILE), newest  # a job finished after that checkpoint
        if int(state.get("jobs_done", 0)) < self._jobs_done:
            log.info("checkpoint %s predates the newest trained model; keeping %s", path, self._last_model)
            return self.current_version()
        await self._restore(state, source=path)
        return self.current_version()

    async def _restore(self, state: dict[str, Any] | None, *, source: str) -> None:
        """Take over the warm-start chain and, when its LoRA is still deployed, the serving version of ``state``."""
        if not state:
            return
        self._jobs_done = int(state.get("jobs_done", 0))
        self._last_model = state.get("last_model") or None
        lora, deployed = state.get("lora_model"), state.get("deployed_model")
        current = self._require_sampler().versions.current()
        if not lora or not deployed or current.lora_model == lora:
            return
        control = self._require_control()
        try:
            entry = await asyncio.to_thread(control.find_lora, lora, self.deployment_id)
            if entry is None or entry.state != "DEPLOYED":
                if self.hot_reload:
                    raise BackendError(f"{lora} is no longer the deployment's addon")
                entry = await asyncio.to_thread(control.load_lora, lora, self.deployment_id, replace_merged=False)
                await asyncio.to_thread(control.wait_lora_deployed, entry.name or "", self.fw.deploy_timeout_s)
        except BackendError as exc:
            log.warning("cannot serve %s from %s again (%s); serving the base model", lora, source, exc)
            return
        self._serve(_ReadyModel(lora, entry.name or deployed), state.get("version_name"), int(state["version"]))
        log.info("Fireworks: restored version %s (%s) from %s", state.get("version"), lora, source)

    # -- files ----------------------------------------------------------------------------------------------------

    def _read_pending(self) -> OrderedDict[str, dict[str, Any]]:
        path = self.state_dir / PENDING_FILE
        pending: OrderedDict[str, dict[str, Any]] = OrderedDict()
        if not path.is_file():
            return pending
        for number, line in enumerate(path.read_text().splitlines(), 1):
            try:
                item = json.loads(line)
                pending[item["key"]] = item["row"]
            except (ValueError, KeyError, TypeError):
                log.warning("%s line %d is not a queued sample; skipped", path, number)
        return pending

    def _write_pending(self) -> None:
        lines = [json.dumps({"key": k, "row": r}, ensure_ascii=False) + "\n" for k, r in self._pending.items()]
        path = self.state_dir / PENDING_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(lines))
        os.chmod(tmp, 0o600)  # conversations are private
        os.replace(tmp, path)

    def _write_batch_state(self) -> None:
        _write_json(self.state_dir / BATCH_STATE_FILE, self.snapshot())

    @staticmethod
    def _read_json(path: Path) -> dict[str, Any] | None:
        try:
            value = json.loads(path.read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("cannot read %s (%s); ignoring it", path, exc)
            return None
        return value if isinstance(value, dict) else None

    # -- helpers --------------------------------------------------------------------------------------------------

    def _serving_sampler(self) -> FireworksSampler:
        return self._require_sampler()

    def _scoring_sampler(self) -> FireworksSampler:
        return self._require_sampler()

    def _require_sampler(self) -> FireworksSampler:
        if self.sampler is None:
            raise BackendError("the Fireworks backend is not started; call start() first")
        return self.sampler

    def _require_control(self) -> FireworksControl:
        if self.control is None:
            raise BackendError("the Fireworks backend is not started; call start() first")
        return self.control


def _write_json(path: Path, value: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(value, indent=2) + "\n")
    os.replace(tmp, path)


__all__ = [
    "FireworksBatchBackend",
    "RecordingTokenizer",
    "SplitDatum",
    "default_deployment_id",
    "sft_row",
    "split_datum",
]
