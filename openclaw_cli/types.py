"""Data types shared by every backend and by the core loops.

They mirror Tinker's primitives (``Datum``, ``SamplingParams``, ``AdamParams``) so the algorithms are written once
and a Tinker or Fireworks backend passes them through with a thin conversion.

Alignment rule for ``Datum`` (same as Tinker): position ``i`` of ``model_input`` predicts
``loss_fn_inputs["target_tokens"][i]``. For a prompt ``P`` and completion ``C``::

    model_input   = P + C[:-1]
    target_tokens = [0] * (len(P) - 1) + C
    logprobs / advantages / weights are 0 over the prompt part.

Use :func:`datum_from_completion` to build one without off-by-one mistakes.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

LossName = Literal["cross_entropy", "importance_sampling", "ppo"]
LOSS_NAMES: tuple[str, ...] = ("cross_entropy", "importance_sampling", "ppo")
MAX_TOP_LOGPROBS = 20  # as OpenAI's API

TopLogprobs = list[tuple[int, float]]  # (token id, raw log-probability), most likely first
FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class ReplyForm:
    """One shape a constrained reply may take: ``prefix``, then one JSON value matching ``schema_json`` (a JSON
    Schema as text, so params stay hashable), then ``suffix``, then the end of the turn. A tool call is the model's
    own call frame around the call object; a JSON answer has neither prefix nor suffix."""

    schema_json: str
    prefix: str = ""
    suffix: str = ""


@dataclass(frozen=True)
class OutputConstraint:
    """A constrained reply takes one of ``forms`` (a JSON answer, or a tool call where tools may still be called).
    Built by :mod:`openclaw_cli.structured_output`; only sent to a backend whose ``accepts_constraint`` took it."""

    forms: tuple[ReplyForm, ...]


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one completion. ``top_k <= 0`` and ``top_p >= 1`` switch those filters off. ``constraint``:
    decode only tokens that keep the reply a valid prefix of what it describes (constrained decoding); only for a
    backend whose ``accepts_constraint`` took it."""

    max_tokens: int = 512
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    top_logprobs: int = 0  # how many most likely alternatives (raw distribution) to report per token; 0 = none
    constraint: OutputConstraint | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise ValueError(f"top_logprobs must be in [0, {MAX_TOP_LOGPROBS}], got {self.top_logprobs}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass
class SampleResult:
    """One finished completion.

    ``tokens`` are the exact completion token ids the sampler produced (the stop token included when generation
    ended on one, so training teaches the model to stop). ``logprobs[i]`` is log pi(tokens[i] | prefix) under the
    policy's raw distribution (temperature 1, no top-k/top-p): what a teacher-forced forward pass of the same
    version computes, and what the importance ratio needs. ``sampling_logprobs[i]`` is the log-probability under
    the distribution actually sampled from (after temperature/top-k/top-p), for exact off-policy correction;
    backends that cannot report it leave it empty. ``text`` is the decoded completion with any stop sequence and
    special stop token removed.
    """

    tokens: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    version: int
    text: str = ""
    stop_sequence: str | None = None
    sampling_logprobs: list[float] = field(default_factory=list)
    top_logprobs: list[TopLogprobs] = field(default_factory=list)  # per token, when params.top_logprobs > 0
    # Constrained decoding: positions of ``tokens`` where the constraint left exactly one token (certain under the
    # masked distribution whatever the policy says; training gives them no policy gradient). Empty when unknown.
    forced_tokens: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    started_at: float = 0.0
    first_token_at: float = 0.0
    finished_at: float = 0.0


@dataclass
class TokenChunk:
    """One streamed token. ``text`` is the newly decodable text (may be empty while a UTF-8 sequence or a
    possible stop sequence is held back)."""

    token_id: int
    logprob: float
    text: str
    version: int
    top_logprobs: TopLogprobs = field(default_factory=list)  # when params.top_logprobs > 0 and the backend knows


StreamEvent = TokenChunk | SampleResult
"""``Backend.stream`` yields TokenChunks and then exactly one SampleResult, the complete completion."""


@dataclass
class Datum:
    model_input: list[int]
    loss_fn_inputs: Mapping[str, Sequence[float]]  # target_tokens holds ints

    def __post_init__(self) -> None:
        n = len(self.model_input)
        for key, values in self.loss_fn_inputs.items():
            if len(values) != n:
                raise ValueError(f"loss_fn_inputs[{key!r}] has length {len(values)}, model_input has {n}")
        if "target_tokens" not in self.loss_fn_inputs:
            raise ValueError("loss_fn_inputs needs 'target_tokens'")


def datum_from_completion(
    prompt_tokens: list[int],
    completion_tokens: list[int],
    *,
    logprobs: list[float] | None = None,
    advantages: list[float] | float | None = None,
    weights: list[float] | float | None = None,
) -> Datum:
    """Build a Tinker-aligned datum for ``prompt + completion``; per-token lists are over the completion."""
    if not prompt_tokens:
        raise ValueError("prompt_tokens must not be empty")
    if not completion_tokens:
        raise ValueError("completion_tokens must not be empty")
    n_prompt, n_comp = len(prompt_tokens), len(completion_tokens)
    pad = [0.0] * (n_prompt - 1)

    def per_token(values: list[float] | float | None, default: float, key: str) -> list[float]:
        if values is None:
            values = default
        if isinstance(values, int | float):
            return pad + [float(values)] * n_comp
        if len(values) != n_comp:
            raise ValueError(f"{key} has {len(values)} entries, completion has {n_comp} tokens")
        return pad + [float(v) for v in values]

    inputs: dict[str, Sequence[float]] = {
        "target_tokens": [0] * (n_prompt - 1) + list(completion_tokens),
        "weights": per_token(weights, 1.0, "weights"),
    }
    if logprobs is not None:
        inputs["logprobs"] = per_token(logprobs, 0.0, "logprobs")
    if advantages is not None:
        inputs["advantages"] = per_token(advantages, 0.0, "advantages")
    return Datum(model_input=list(prompt_tokens) + list(completion_tokens[:-1]), loss_fn_inputs=inputs)


@dataclass(frozen=True)
class AdamParams:
    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0  # 0 = no clipping


@dataclass
class FwdBwdResult:
    """``loss`` is the summed loss of the call (Tinker semantics: no normalisation). ``logprobs`` holds, per datum,
    the learner's log-probabilities of its target tokens at every position (prompt positions included)."""

    loss: float
    metrics: dict[str, float]
    logprobs: list[list[float]]


@dataclass
class StepResult:
    step: int
    metrics: dict[str, float]


@dataclass(frozen=True)
class PolicyVersion:
    """A servable policy. Version 0 is the base model; each ``publish`` makes the next one."""

    version: int
    name: str
    created_at: float = field(default_factory=time.time)


@dataclass
class ToolCall:
    id: str
    name: str
    arguments: str  # JSON text, as the OpenAI API carries it


@dataclass
class ParsedAssistant:
    """An assistant completion split into the parts the APIs carry separately."""

    content: str
    tool_calls: list[ToolCall] = field(default_factory=list)
    reasoning: str = ""


Message = dict[str, Any]
"""An OpenAI-style chat message: role, content (str or parts), optional tool_calls / tool_call_id / name."""
