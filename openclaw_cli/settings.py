"""Effective settings: defaults < ``openclaw.toml`` (or ``--config PATH``) < ``OPENCLAW_*`` env vars < CLI flags.

Nested keys use ``__`` in env vars (``OPENCLAW_JUDGE__VOTES=5``) and dots on the CLI (``--set judge.votes=5``).
Secrets are ``SecretStr``: they print masked everywhere and are never written back to a file by us.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)
from pydantic_settings import SettingsError as SourceParseError

DEFAULT_CONFIG_FILE = "openclaw.toml"
ENV_PREFIX = "OPENCLAW_"
ENV_NESTED_DELIMITER = "__"
TrackerName = Literal["tensorboard", "wandb", "mlflow", "trackio"]
TRACKERS: tuple[str, ...] = get_args(TrackerName)
DEFAULT_LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SECRET_SET = "**** (set)"  # what a set secret shows as, anywhere settings are shown


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class JudgeSettings(_Section):
    model: str | None = Field(
        None,
        description="Judge model: an OpenAI-compatible model name (with base_url), a LiteLLM model string, "
        "or unset to use the policy itself.",
    )
    base_url: str | None = Field(None, description="OpenAI-compatible endpoint of the judge.")
    api_key: SecretStr | None = Field(None, description="Key for the judge endpoint.")
    client: Literal["auto", "openai", "litellm"] = Field(
        "auto",
        description="How the judge is called: auto = the openai SDK when base_url is set, LiteLLM for a model "
        "alone; litellm = always LiteLLM, base_url becoming its api_base (e.g. model 'anthropic/<name>' on an "
        "Anthropic-compatible server, 'openai/<name>' on an OpenAI-compatible one); openai = the openai SDK "
        "(needs base_url).",
    )
    mode: Literal["auto", "channel", "logprob", "vote"] = Field(
        "auto",
        description="How a verdict is read (see openclaw_cli/learn/judge_verdict.py): channel = likelihood of the next "
        "state after a happy vs an unhappy prefix (policy judge only); logprob = the judge's next-token distribution "
        "over good/bad/unclear (policy judge, or an OpenAI-compatible endpoint with top_logprobs); vote = sampled "
        "chain-of-thought votes with majority (strong judges). auto = channel for the policy judging itself, "
        "logprob for an OpenAI-compatible endpoint, vote for a LiteLLM model.",
    )
    margin: float = Field(
        1.0,
        ge=0.0,
        description="channel/logprob: a verdict whose log-odds of progress over correction is smaller than this "
        "in size scores 0 (masked out). 1.0 measured on bench/judge_accuracy.py with SmolLM2-135M.",
    )
    hint_source: Literal["auto", "judge", "next_state", "off"] = Field(
        "auto",
        description="OPD hints: judge = written by the judge (vote mode); next_state = the user's own next message "
        "(see next_state_hints); auto = the judge's hint when it wrote one, else next_state.",
    )
    next_state_hints: Literal["every", "unhappy", "corrections"] = Field(
        "corrections",
        description="Which user replies become OPD hints: corrections = where the judge leans toward reading the "
        "reply as a correction (log-odds below 0, under judge.margin or not; vote mode: a score below 0); unhappy = "
        "where the reward is <= 0 (corrections and every verdict under the margin); every = all of them. "
        "corrections by default: with every, a user who only thanked and asked follow-ups ('Thanks! Next question: "
        "...', 'tell me more') got plain replies 25% shorter in 10 minutes (unhappy: 47%), because the base model "
        "told any of those ends its answers sooner and OPD distils that; see docs/benchmarks.md (owners.py).",
    )
    votes: int = Field(3, ge=1, le=15, description="vote mode: PRM votes per turn (majority; tie or none -> 0).")
    temperature: float = Field(0.6, ge=0.0, le=2.0, description="vote mode: sampling temperature of the judge.")
    max_concurrency: int = Field(4, ge=1, le=256)
    max_ahead: int = Field(
        8,
        ge=0,
        description=(
            "The judge waits while this many judged turns the trainer can still train are waiting for it (0: never "
            "waits; never fewer than train.batch_size). Verdicts beyond what the trainer takes land on turns too "
            "stale to train by the time it gets to them, and a judge on the same machine (the embedded policy "
            "judging itself) takes the trainer's CPU: on SmolLM2 an unpaced judge judged 275 turns in 20 minutes "
            "for 88 trained."
        ),
    )


# Marks a plain setting whose rejected value is never echoed (a user may paste a secret into it by mistake).
_MAY_HOLD_SECRETS: dict[str, Any] = {"may_hold_secrets": True}


class LoraSettings(_Section):
    rank: int = Field(32, ge=1, le=512)
    alpha: int = Field(32, ge=1)
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    targets: list[str] = Field(default_factory=lambda: list(DEFAULT_LORA_TARGETS))
    scope: Literal["owner", "shared"] = Field(
        "owner",
        description="owner = each owner (API key, or session scope with lessons.scope = session) gets an adapter "
        "of its own, trained on its own conversations only, and is served by it (the base model until its first "
        "step); shared = one adapter for everyone. A server with one owner (no key or one key) is the same either "
        "way. See docs/owners.md.",
    )
    groups: dict[str, list[str]] = Field(
        default_factory=dict,
        json_schema_extra=_MAY_HOLD_SECRETS,  # a key pasted by mistake must not be echoed in the error
        description="Owners who share one adapter, by group name: each member is an owner id as `openclaw status` "
        "shows it (key:<hash>, session:<scope>). A group is served and trained as one owner.",
    )
    resident_adapters: int = Field(
        16,
        ge=1,
        le=4096,
        description="With lora.scope = owner: owners' adapters kept in memory, for training (weights and optimizer "
        "moments) and, apart, for serving (their kept versions); the least recently used go to files under "
        "local.state_dir and come back on their next step or request. The shared adapter always stays.",
    )

    @field_validator("groups")
    @classmethod
    def _group_names(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        seen: dict[str, str] = {}
        for name, members in value.items():
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", name) or name in ("shared", "local"):
                raise ValueError(
                    f"group name {name!r} must be letters, digits, '.', '_' or '-' (max 64), not shared or local"
                )
            for member in members:
                if not member.startswith(("key:", "session:")):
                    raise ValueError(
                        f"group {name}: member {member[:8]!r}... is not an owner id (key:<hash> or session:<scope>, "
                        "as `openclaw status` lists owners); never put an API key itself in a group"
                    )
                if member in seen and seen[member] != name:
                    raise ValueError(f"owner {member} is in two groups ({seen[member]} and {name})")
                seen[member] = name
        return value


class TrainSettings(_Section):
    lr: float = Field(
        2e-4,
        gt=0.0,
        lt=1.0,
        description="Adam learning rate (LoRA). 2e-4 measured on SmolLM2 (bench/learning.py, 20 minutes, 3 seeds): "
        "3e-4 made held-out replies shorter (43-61% against 35-55%) but lost keyword hits on one seed, and with the "
        "later defaults (demonstrations for every hinted turn, replayed) it was longer on the mean (21.4 words against "
        "19.6); 1e-4 moved "
        "nothing in 10 minutes, 5e-4 (before the KL anchor) flattened the policy into noise.",
    )
    batch_size: int = Field(4, ge=1, le=4096, description="Judged samples per optimizer step.")
    loss_norm: Literal["sample", "token"] = Field(
        "sample",
        description="How a step averages the per-token loss: sample = per-sample token mean, then the mean over "
        "samples; token = over all trained tokens of the batch (a long reply's tokens weigh as much as a short "
        "one's). sample by default: the 20-minute bench/learning.py run with token (and next_state_hints = "
        "unhappy) measured worse (held-out 15/34/15% shorter on 3 seeds against 26/32/36%); see "
        "docs/learning-history.md.",
    )
    adam_beta1: float = Field(0.9, ge=0.0, lt=1.0)
    adam_beta2: float = Field(0.95, ge=0.0, lt=1.0)
    weight_decay: float = Field(0.0, ge=0.0)
    grad_clip_norm: float = Field(1.0, ge=0.0, description="0 disables clipping.")
    eps_low: float = Field(0.2, ge=0.0, le=1.0, description="PPO clip: ratio >= 1 - eps_low.")
    eps_high: float = Field(0.28, ge=0.0, description="PPO clip: ratio <= 1 + eps_high.")
    w_opd: float = Field(1.0, ge=0.0, description="Hybrid weight of the OPD advantage.")
    w_rl: float = Field(1.0, ge=0.0, description="Hybrid weight of the binary RL reward.")
    baseline_decay: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="Binary RL running-mean reward baseline (EMA decay); 0 = no baseline, as the reference method.",
    )
    opd_max_advantage: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="Upper clip of the OPD advantage (the lower one is -1). 0 keeps only the teacher's objections: "
        "raising tokens the student sampled from its tail flattened SmolLM2 into noise within 10 minutes.",
    )
    kl_coef: float = Field(
        0.1,
        ge=0.0,
        description="KL anchor to the base model: beta * (log pi_old - log pi_base) is subtracted from every "
        "trained token's advantage (0 = off).",
    )
    demo_weight: float = Field(
        1.0,
        ge=0.0,
        le=4.0,
        description="Hindsight demonstrations (opd / combined): for a hinted turn (see demo_for), the base "
        "model's reply to the conversation with the hint is trained as a reply without it, with this advantage on "
        "every token (0 = off); under Adam it sets the demonstrations' share of a step, not its size (0.5 and 2.0 "
        "measured no better than 1.0). See openclaw_cli/learn/hindsight_demos.py; measured in "
        "docs/learning-history.md.",
    )
    demo_for: Literal["every", "unapproved"] = Field(
        "every",
        description="Which hinted turns get a hindsight demonstration: every = each one (a demonstration that would "
        "not be usable is dropped all the same); unapproved = only where the judge's score is <= 0. every by default: "
        "SmolLM2 judging itself approved 5 of 31 of the brevity user's 'far too long' corrections (and scored none "
        "below 0), so unapproved lost those turns' demonstrations; see docs/learning-history.md.",
    )
    demo_replay: int = Field(
        2,
        ge=0,
        le=16,
        description="Later steps each hindsight demonstration is trained again in, rescored by the current policy "
        "(0 = once). See DemoReplay in openclaw_cli/learn/hindsight_demos.py; measured in docs/learning-history.md.",
    )
    demo_max_tokens: int = Field(
        128, ge=1, le=4096, description="Token budget of a hindsight demonstration (a cut-off one is dropped)."
    )
    loop_probes: int = Field(
        2,
        ge=0,
        le=64,
        description="Loop probe: each step, greedy replies of the current policy to this many of the batch's prompts; "
        "one that runs into a loop (repeats one span to the token budget) has its first repetition trained with "
        "advantage -1 (0 = off). See openclaw_cli/learn/loop_probe.py; measured in docs/learned.md.",
    )
    loop_probe_tokens: int = Field(
        64, ge=8, le=4096, description="Token budget of a loop probe's greedy reply (a loop must reach it to count)."
    )
    collapse_guard: bool = Field(
        True,
        description="Probe each new version (repetition, empty replies, KL to base) before it serves; a failing "
        "version never serves and training rewinds to the served one (openclaw_cli/learn/collapse_guard.py).",
    )
    guard_max_kl: float = Field(1.0, gt=0.0, description="Collapse guard: largest per-token KL estimate to base.")
    guard_min_distinct: float = Field(
        0.5, ge=0.0, le=1.0, description="Collapse guard: smallest distinct-word ratio of a probe reply."
    )
    max_staleness: int = Field(4, ge=0, description="Samples older than this many policy versions are dropped.")
    checkpoint_every: int = Field(20, ge=1)
    promotion_gate: bool = Field(
        False,
        description="Serve a newly trained version only once an eval on held-out stored sessions shows no "
        "regression against the served one (see openclaw_cli/learn/promotion.py); else it stays unserved.",
    )
    gate_sessions: int = Field(16, ge=1, le=1024, description="Promotion gate: held-out sessions evaluated.")
    gate_margin: float = Field(
        0.05, ge=0.0, le=0.5, description="Promotion gate: promote when the new version's win rate >= 0.5 - margin."
    )
    gate_max_tokens: int = Field(256, ge=1, description="Promotion gate: reply budget per evaluated prompt.")
    report_to: list[TrackerName] = Field(
        default_factory=list,
        description="Experiment trackers that get every training step's metrics, the settings and `openclaw eval` "
        "results (docs/tracking.md): tensorboard, wandb, mlflow, trackio; each needs its extra "
        "(pip install 'openclaw-cli[tensorboard]'). 'none' or empty: no tracker.",
    )

    @field_validator("report_to", mode="before")
    @classmethod
    def _tracker_list(cls, value: Any) -> Any:
        # --report-to tensorboard,mlflow and OPENCLAW_TRAIN__REPORT_TO=wandb arrive as one string.
        if isinstance(value, str):
            value = [part for part in (p.strip() for p in value.split(",")) if part]
        if isinstance(value, list):
            named = [v.strip().lower() if isinstance(v, str) else v for v in value]
            if "all" in named:
                return list(TRACKERS)
            return list(dict.fromkeys(v for v in named if v != "none"))
        return value


class TrackingSettings(_Section):
    """Where train.report_to sends the metrics (docs/tracking.md)."""

    project: str = Field("openclaw", min_length=1, description="Project (W&B, trackio) or experiment (MLflow) name.")
    run_name: str | None = Field(
        None, description="Name of the run; unset = openclaw-<date>-<time> of the first launch on this store."
    )
    dir: Path | None = Field(
        None,
        description="Where local trackers write (TensorBoard event files, W&B offline runs, the MLflow SQLite store, "
        "trackio's database); unset = the directory of store.path (.openclaw/).",
    )
    mlflow_uri: str | None = Field(
        None,
        description="MLflow tracking URI; unset = MLFLOW_TRACKING_URI if set, else sqlite:///<dir>/mlflow.db.",
    )
    interval_s: float = Field(5.0, gt=0, le=3600, description="How often new steps are sent to the trackers.")


class LessonSettings(_Section):
    """Lessons: a user's correction of how the bot answers, kept as a standing instruction (docs/lessons.md)."""

    enabled: bool = Field(
        True,
        description="Find lessons in the users' corrections, verify them, serve them in main-line prompts, distil "
        "them into the weights and retire them once learned.",
    )
    scope: Literal["owner", "session"] = Field(
        "owner",
        description="Whose lessons a request gets: owner = its API key (one owner for the server when no key is "
        "set); session = its session scope (X-Session-Id and the like), for servers shared by several people "
        "without keys.",
    )
    max_active: int = Field(4, ge=1, le=64, description="Active lessons per owner; the oldest retires past it.")
    max_tokens: int = Field(
        96, ge=8, le=2048, description="Token budget of one owner's lesson block; a lesson that does not fit waits."
    )
    max_chars: int = Field(300, ge=20, le=4000, description="Longest correction kept as a lesson (characters).")
    verify_prompts: int = Field(
        3,
        ge=1,
        le=16,
        description="Recent prompts of the same owner (not the one corrected) a candidate is tried on before it "
        "becomes active.",
    )
    verify_max_tokens: int = Field(64, ge=8, le=1024, description="Reply budget of each verification reply.")
    retire_gap: float = Field(
        1.0,
        gt=0.0,
        description="Retire a lesson when what it still adds is at most this: on the owner's newest untrained "
        "prompts, the current policy's greedy replies with and without it, scored by the base model reading the "
        "user's correction (median nats per reply; 0 when the replies are the same).",
    )
    return_gap: float = Field(
        2.0, gt=0.0, description="A retired lesson whose effect has grown past this (the behaviour slipped) comes back."
    )
    retire_checks: int = Field(
        2,
        ge=1,
        le=32,
        description="Passing retirement checks in a row (each on a new policy version and on at least verify_prompts "
        "untrained prompts where the lesson acts) before a lesson retires; each time it came back adds as many again.",
    )
    min_shaped: int = Field(
        3, ge=1, le=256, description="Turns a lesson must have shaped before it is checked for retirement."
    )
    consolidate: bool = Field(
        True,
        description="Train each turn served with lessons as a demonstration for the same conversation without "
        "them (context distillation through the hindsight-demonstration loss).",
    )


class StoreSettings(_Section):
    path: Path = Field(Path(".openclaw/store.sqlite3"), description="SQLite database (WAL, mode 0600).")
    retention_days: int | None = Field(
        None, ge=1, description="Delete turns captured more than this many days ago (unset = keep forever)."
    )
    redact: bool | list[Literal["email", "api_key", "phone"]] = Field(
        False,
        description="Redact these kinds (true = all) from text sent to a judge or exported, and keep turns "
        "containing them away from a cloud trainer (see openclaw_cli/capture/redaction.py).",
    )


class LocalSettings(_Section):
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    sampler: Literal["auto", "transformers", "vllm", "remote"] = Field(
        "auto",
        description="auto = the vLLM servers of vllm_servers when listed, else vLLM when importable and a GPU exists, "
        "else transformers; remote = the vLLM servers of vllm_servers (docs/serving-fleet.md).",
    )
    vllm_servers: list[str] = Field(
        default_factory=list,
        description="Base URLs of vLLM servers you run (e.g. http://gpu1:8000): they serve the policy, each new "
        "version loaded onto every one; the trainer stays in this process.",
    )
    vllm_api_key: SecretStr | None = Field(None, description="The servers' --api-key, if they were started with one.")
    vllm_publish: Literal["load", "resolver"] = Field(
        "load",
        description="load = each version is loaded onto every listed server (/v1/load_lora_adapter); resolver = "
        "written into vllm_adapter_dir only, which the servers read with vLLM's filesystem resolver by name on their "
        "first request for it (one URL behind your own load balancer works).",
    )
    vllm_adapter_dir: Path | None = Field(
        None,
        description="Where each version's PEFT adapter is written for the servers to load: a directory every server "
        "can read at the same path (unset = a temporary directory, for servers on this machine).",
    )
    keep_versions: int = Field(3, ge=1, le=64, description="Published versions kept servable (plus the base).")
    max_concurrent_requests: int = Field(
        4, ge=1, le=256, description="Requests the transformers sampler decodes together (more wait in order)."
    )
    decode_threads: int | None = Field(
        None,
        ge=1,
        le=1024,
        description="CPU cores the transformers sampler's decode steps use while a training or scoring pass runs "
        "beside them (prefill, and decode while nothing else runs, use all); unset = half the cores.",
    )
    state_dir: Path = Field(Path(".openclaw/checkpoints"))
    seed: int = 0


class TinkerSettings(_Section):
    api_key: SecretStr | None = Field(None, description="Tinker key (tml-...); also read from TINKER_API_KEY.")
    base_url: str | None = None
    keep_versions: int = Field(3, ge=1, le=64, description="Published versions kept servable (plus the base).")
    sample_timeout_s: float = Field(
        300.0, gt=0, description="Longest wait for one sampling/scoring call; then a retryable error (503)."
    )


class FireworksSettings(_Section):
    api_key: SecretStr | None = Field(None, description="Also read from FIREWORKS_API_KEY.")
    account_id: str | None = Field(None, description="Also read from FIREWORKS_ACCOUNT_ID.")
    base_url: str | None = None
    training_base_url: str | None = Field(
        None,
        description="Step-wise training endpoint (fireworks.training.sdk); unset = "
        "{base_url or https://api.fireworks.ai}/training/v1/serverless.",
    )
    mode: Literal["stepwise", "batch"] = "stepwise"
    deployment: str | None = Field(None, description="Existing deployment id to serve from.")
    # -- serving and batch mode (backends/fireworks: control, serving, batch) --
    base_model: str | None = Field(
        None, description="Fireworks base model (accounts/fireworks/models/...); unset = `model` when it is one."
    )
    tokenizer: str | None = Field(
        None,
        description="HF id or local path of the base model's tokenizer (chat template); unset = `model` when that "
        "is not a Fireworks name.",
    )
    context_length: int | None = Field(None, ge=16, description="Context window of the served model; unset = 8192.")
    addon_mode: Literal["multi_lora", "hot_reload"] = Field(
        "multi_lora",
        description="multi_lora: each trained LoRA is loaded beside the last and serving switches by name (exact "
        "versions, no gap); hot_reload: the deployment's merged addon is replaced in place.",
    )
    deployment_shape: str | None = Field(None, description="Deployment shape for a deployment openclaw creates.")
    accelerator_type: str | None = Field(None, description="Accelerator for a deployment openclaw creates.")
    min_replicas: int = Field(0, ge=0, description="0 lets a created deployment scale to zero when idle.")
    max_replicas: int = Field(1, ge=1)
    replicas: int | None = Field(None, ge=0, description="Scale the deployment to this many replicas on start.")
    batch_samples: int = Field(
        32, ge=3, le=100_000, description="Batch mode: positively judged samples per training job (Fireworks: >= 3)."
    )
    sft_epochs: int = Field(1, ge=1, le=100)
    sft_learning_rate: float | None = Field(None, gt=0.0, lt=1.0, description="Unset = train.lr.")
    keep_versions: int = Field(2, ge=1, le=50, description="multi_lora: published LoRAs kept loaded for pinning.")
    max_deployments: int = Field(1, ge=0, description="Cost cap: deployments openclaw may create (and not delete).")
    max_steps_per_day: int = Field(24, ge=0, description="Cost cap: training jobs started in any 24 hours.")
    poll_interval_s: float = Field(10.0, gt=0.0, description="How often deployment/job/model states are polled.")
    deploy_timeout_s: float = Field(1800.0, gt=0.0)
    job_timeout_s: float = Field(7200.0, gt=0.0)
    scale_up_timeout_s: float = Field(
        300.0, ge=0.0, description="How long a request retries a scaled-to-zero deployment's 503 before failing."
    )
    state_dir: Path = Field(Path(".openclaw/fireworks"), description="Queued batch samples and the cost ledger.")


class ProxySettings(_Section):
    served_model_name: str | None = Field(
        None, description="Model id the proxy serves under; unset = `model`, or openclaw-policy when that is unset."
    )
    model_aliases: list[str] = Field(
        default_factory=list,
        description="Extra model names accepted as the policy (e.g. the names a client insists on sending).",
    )
    accept_any_model: bool = Field(False, description="Serve the policy whatever model name a request asks for.")
    max_body_bytes: int = Field(32 * 1024 * 1024, ge=1024, description="Larger request bodies get 413.")
    default_max_tokens: int = Field(
        2048, ge=1, description="Completion budget when an OpenAI request sets no max_tokens (capped by context)."
    )
    max_output_tokens: int | None = Field(
        None,
        ge=1,
        description="Server-side cap on one reply's tokens, whatever a client asks for (Claude Code asks 32000); "
        "unset = a quarter of the model's context window, at most 4096.",
    )
    capture_timeout_s: float = Field(10.0, gt=0, description="Longest wait for the store to record one reply.")
    capture_max_backlog: int = Field(
        256,
        ge=1,
        description="Replies waiting to be written to the store at most; beyond it a reply is served but its "
        "capture dropped (counted in status).",
    )
    keepalive_s: float = Field(15.0, gt=0, description="Idle streams get an SSE keep-alive this often.")
    expire_every_s: float = Field(5.0, gt=0, description="How often idle sessions are expired while serving.")
    retry_after_s: int = Field(2, ge=0, description="Retry-After sent with 503/529 when the backend is busy.")
    max_messages: int = Field(10_000, ge=1, description="Requests with more messages get 400.")
    max_tools: int = Field(1024, ge=0, description="Requests offering more tools get 400.")
    max_in_flight: int = Field(
        64, ge=1, description="Chat requests served at once; more get 429 (OpenAI) / 529 (Anthropic) + Retry-After."
    )
    tool_choice_retries: int = Field(
        2,
        ge=0,
        le=16,
        description="Extra samples drawn when a reply misses tool_choice required/any/named or OpenAI "
        "response_format JSON (no constrained decoding); after that the request fails with 502.",
    )


class TrainEnvSettings(_Section):
    """``openclaw train``: batch RL on an environment (see openclaw_cli/env_training)."""

    env: str | None = Field(
        None, description="Rollout hook: an openclaw.rollouts entry-point name, module:function or path/to/file.py."
    )
    reward: str | None = Field(
        None, description="Reward hook (trajectory -> float) replacing the env's own reward; same spec forms."
    )
    loss: str = Field(
        "ppo", description="ppo, importance_sampling, or a custom loss hook (openclaw.losses name or module:function)."
    )
    steps: int = Field(10, ge=1, description="Optimizer steps (each one collects a fresh batch of rollouts).")
    group_size: int = Field(4, ge=2, le=1024, description="GRPO: rollouts per prompt (same task, different samples).")
    prompts_per_step: int = Field(4, ge=1, le=4096, description="GRPO groups per step.")
    max_tokens: int = Field(256, ge=1, description="Completion budget of one model call inside a rollout.")
    temperature: float = Field(1.0, ge=0.0, le=2.0, description="Sampling temperature of rollouts.")
    std_normalize: bool = Field(
        False, description="Divide group advantages by the group's reward std (GRPO); default mean-centred only."
    )
    concurrency: int = Field(8, ge=1, le=1024, description="Rollouts running at once.")
    seed: int = Field(0, description="Seeds task choice (per group) and sampling (per rollout).")
    env_args: list[str] = Field(
        default_factory=list,
        description='Options for the env as "KEY=VALUE" strings (RolloutContext.env_args; a later KEY wins).',
    )
    max_failed_fraction: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        description="A failed rollout drops its group from the step; the run stops when more than this fraction "
        "of a step's rollouts fail (0 = stop at the first failure).",
    )
    checkpoint_every: int = Field(
        5, ge=0, description="Save the backend state and a resume manifest every N steps (0 = never)."
    )
    keep_checkpoints: int = Field(
        3,
        ge=1,
        description="Newest checkpoints of a run kept; older manifests and their local saved states are deleted.",
    )
    store: Path | None = Field(
        None,
        description="SQLite store to record each step's metrics in (for `openclaw eval --plot`); must not be the "
        "online store.path, whose steps table the online trainer numbers.",
    )

    @field_validator("env_args")
    @classmethod
    def _key_value_pairs(cls, value: list[str]) -> list[str]:
        bad = [pair for pair in value if not pair.partition("=")[0].strip() or "=" not in pair]
        if bad:
            raise ValueError(f"each entry must be KEY=VALUE, got {bad[0]!r}")
        return value


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        env_nested_delimiter=ENV_NESTED_DELIMITER,
        extra="forbid",
        validate_default=True,
    )

    backend: str = Field("local", description="Backend name (see `openclaw backends`).")
    model: str | None = Field(
        None, description="HF model id or local path; unset = the embedded SmolLM2-135M-Instruct (local backend)."
    )
    host: str = "127.0.0.1"
    port: int = Field(8400, ge=1, le=65535)
    api_key: SecretStr | None = Field(None, description="Required for any non-loopback bind.")
    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="More accepted keys, one per person: each key is an owner of its own lessons.",
    )
    method: Literal["rl", "opd", "combined"] = Field(
        "opd",
        description="rl = Binary RL on the judge's reward; opd = On-Policy Distillation from hints (the user's own "
        "correction by default); combined = both. opd by default: see docs/algorithms.md.",
    )
    session_idle_s: float = Field(900.0, gt=0)
    judge: JudgeSettings = Field(default_factory=JudgeSettings)
    lora: LoraSettings = Field(default_factory=LoraSettings)
    train: TrainSettings = Field(default_factory=TrainSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    lessons: LessonSettings = Field(default_factory=LessonSettings)
    tracking: TrackingSettings = Field(default_factory=TrackingSettings)
    local: LocalSettings = Field(default_factory=LocalSettings)
    tinker: TinkerSettings = Field(default_factory=TinkerSettings)
    fireworks: FireworksSettings = Field(default_factory=FireworksSettings)
    proxy: ProxySettings = Field(default_factory=ProxySettings)
    train_env: TrainEnvSettings = Field(default_factory=TrainEnvSettings)
    plugins: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Sections of third-party backends, [plugins.<backend name>]: each backend validates its own "
        "with openclaw_cli.backend.plugin_settings. Secret-looking keys are masked wherever settings are shown.",
    )

    def accepted_api_keys(self) -> list[str]:
        """Every key the proxy accepts (``api_key`` first, then ``api_keys``), blanks left out."""
        keys = [self.api_key, *self.api_keys] if self.api_key is not None else list(self.api_keys)
        return [value for value in (key.get_secret_value().strip() for key in keys) if value]

    @field_validator("backend")
    @classmethod
    def _backend_name(cls, value: str) -> str:
        if not value or not value.replace("-", "_").isidentifier():
            raise ValueError("must be a backend name such as local, tinker, fireworks")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Highest priority first. The TOML path is chosen per load (see load_settings), never a global default.
        toml_path = _CONFIG_PATH_FOR_LOAD.get("path")
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if toml_path is not None:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=toml_path))
        return tuple(sources)


# load_settings sets this for the duration of one construction; pydantic-settings asks for sources at that time.
_CONFIG_PATH_FOR_LOAD: dict[str, Path | None] = {"path": None}


class SettingsError(ValueError):
    """Invalid configuration; ``str()`` is one line per problem, each naming the key and what is allowed."""


def resolve_config_path(config: Path | None, cwd: Path | None = None) -> Path | None:
    """The TOML file to read: the explicit ``--config`` (must exist), else ./openclaw.toml when present."""
    if config is not None:
        if not config.is_file():
            raise SettingsError(f"config file not found: {config}")
        return config
    default = (cwd or Path.cwd()) / DEFAULT_CONFIG_FILE
    return default if default.is_file() else None


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """Turn ``["judge.votes=5", "model=x"]`` into a nested dict; values stay strings (pydantic coerces).

    A value that starts with ``[`` or ``{`` is read as JSON, so list settings can be set from the command line
    (``--set 'lora.targets=["q_proj","v_proj"]'``), the same syntax the env source expects for them.
    """
    result: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            raise SettingsError(f"--set expects KEY=VALUE, got {pair!r}")
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise SettingsError(f"--set {key}: {part} is not a section")
        node[parts[-1]] = _override_value(key, value)
    return result


def _override_value(key: str, value: str) -> Any:
    if not value.lstrip().startswith(("[", "{")):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise SettingsError(f"--set {key}: value looks like JSON but does not parse ({exc.msg})") from None


def _format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc)
        field = _field_at(loc)
        if err["type"] == "extra_forbidden":
            lines.append(f"invalid setting {key}: unknown setting; {_known_keys_hint(loc)}")
            continue
        msg = err["msg"]
        allowed = _allowed_range(field) if err["type"] in _RANGE_ERRORS else ""
        if allowed:
            msg = f"{msg}; allowed: {allowed}"
        # Echo the rejected value only for plain leaf settings: a secret (or a section that holds one) must never
        # be printed, not even when it was given with the wrong type.
        show_input = field is not None and not _is_section(field) and not _is_secret(field)
        shown = f" (got {err.get('input')!r})" if show_input else ""
        lines.append(f"invalid setting {key}: {msg}{shown}")
    return "\n".join(lines)


_RANGE_ERRORS = frozenset({"greater_than", "greater_than_equal", "less_than", "less_than_equal"})


def _field_at(loc: list[str]) -> FieldInfo | None:
    """The model field a validation-error location points at (list indices after a leaf are ignored)."""
    model: type[BaseModel] = Settings
    field: FieldInfo | None = None
    for part in loc:
        if field is not None and not _is_section(field):
            break  # e.g. an index into a list setting
        field = model.model_fields.get(part)
        if field is None:
            return None
        if _is_section(field):
            model = field.annotation  # type: ignore[assignment]
    return field


def _section_fields(loc: list[str]) -> dict[str, FieldInfo]:
    model: type[BaseModel] = Settings
    for part in loc:
        field = model.model_fields.get(part)
        if field is None or not _is_section(field):
            break
        model = field.annotation  # type: ignore[assignment]
    return dict(model.model_fields)


def _known_keys_hint(loc: list[str]) -> str:
    known = _section_fields(loc[:-1])
    where = ".".join(loc[:-1]) or "the top level"
    close = difflib.get_close_matches(loc[-1], list(known), n=1)
    suggestion = f"did you mean {close[0]}? " if close else ""
    return f"{suggestion}known keys in {where}: {', '.join(known)}"


def _is_section(field: FieldInfo) -> bool:
    return isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)


def _is_secret(field: FieldInfo) -> bool:
    if (field.json_schema_extra or {}) == _MAY_HOLD_SECRETS:
        return True
    annotation = field.annotation
    if get_origin(annotation) in (Union, types.UnionType):
        return any(arg is SecretStr for arg in get_args(annotation))
    return annotation is SecretStr


def _allowed_range(field: FieldInfo | None) -> str:
    if field is None:
        return ""
    bounds = []
    for item in field.metadata:
        if isinstance(item, Ge):
            bounds.append(f">= {item.ge}")
        elif isinstance(item, Gt):
            bounds.append(f"> {item.gt}")
        elif isinstance(item, Le):
            bounds.append(f"<= {item.le}")
        elif isinstance(item, Lt):
            bounds.append(f"< {item.lt}")
    return " and ".join(bounds)


def load_settings(
    overrides: dict[str, Any] | None = None, config: Path | None = None, cwd: Path | None = None
) -> Settings:
    """Build the effective settings. ``overrides`` are the CLI flags (highest priority); None values are ignored."""
    path = resolve_config_path(config, cwd)
    _CONFIG_PATH_FOR_LOAD["path"] = path
    try:
        return Settings(**_drop_none(overrides or {}))
    except ValidationError as exc:
        raise SettingsError(_format_validation_error(exc)) from None
    except SourceParseError as exc:
        # pydantic-settings raises this for an env value it cannot decode (list/section values must be JSON).
        # Its message names the field, never the value, so it is safe to show.
        raise SettingsError(
            f"invalid setting from the environment: {exc} (list and section values in {ENV_PREFIX}* variables "
            f"must be JSON, e.g. {ENV_PREFIX}LORA{ENV_NESTED_DELIMITER}TARGETS='[\"q_proj\"]')"
        ) from None
    except (OSError, ValueError) as exc:  # unreadable / malformed TOML
        raise SettingsError(f"cannot read config file {path}: {exc}") from None
    finally:
        _CONFIG_PATH_FOR_LOAD["path"] = None


def _drop_none(data: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, dict):
            nested = _drop_none(value)
            if nested:
                out[key] = nested
        elif value is not None:
            out[key] = value
    return out


def _flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in data.items():
        full = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, full + "."))
        else:
            flat[full] = value
    return flat


def settings_sources(
    overrides: dict[str, Any] | None = None, config: Path | None = None, cwd: Path | None = None
) -> dict[str, str]:
    """For each leaf key, where its effective value came from: "cli", "env", the TOML path, or "default"."""
    path = resolve_config_path(config, cwd)
    layers: list[tuple[str, dict[str, Any]]] = []
    if path is not None:
        layers.append((str(path), TomlConfigSettingsSource(Settings, toml_file=path)()))
    layers.append(
        (
            "env",
            EnvSettingsSource(
                Settings, env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED_DELIMITER, case_sensitive=False
            )(),
        )
    )
    layers.append(("cli", InitSettingsSource(Settings, init_kwargs=_drop_none(overrides or {}))()))
    origin: dict[str, str] = {}
    for label, data in layers:  # lowest priority first, later layers win
        for key in _flatten(data):
            origin[key] = label
    return origin


def effective_items(settings: Settings, sources: dict[str, str]) -> list[tuple[str, str, str]]:
    """(key, shown value, source) for every leaf setting, secrets masked."""
    rows = []
    for key, value in _flatten(_leaves(settings, _as_text, str)).items():
        source = sources.get(key) or next((s for k, s in sources.items() if k.startswith(key + ".")), "default")
        rows.append((key, value, source))
    return rows


def effective_values(settings: Settings) -> dict[str, Any]:
    """Every leaf setting by dotted key as a JSON-ready value (unset -> None); secrets masked, never revealed."""
    return _flatten(_leaves(settings, _as_json, lambda item: item))


def _leaves(model: BaseModel, shown: Callable[[Any], Any], free_form: Callable[[Any], Any]) -> dict[str, Any]:
    """The settings tree with every secret masked, every other field as ``shown`` and every leaf of a free-form section
    (plugins) as ``free_form``."""
    out: dict[str, Any] = {}
    for name in type(model).model_fields:
        value = getattr(model, name)
        if isinstance(value, BaseModel):
            out[name] = _leaves(value, shown, free_form)
        elif isinstance(value, SecretStr):
            out[name] = mask_secret(value)
        elif isinstance(value, dict):
            out[name] = _masked_mapping(value, free_form)
        else:
            out[name] = shown(value)
    return out


def _as_json(value: Any) -> Any:
    return str(value) if isinstance(value, Path) else list(value) if isinstance(value, list) else value


def _as_text(value: Any) -> str:
    if value is None:
        return "(unset)"
    return ", ".join(map(str, value)) or "(empty)" if isinstance(value, list) else str(value)


def _masked_mapping(value: dict[str, Any], leaf: Callable[[Any], Any] = lambda item: item) -> dict[str, Any]:
    """A free-form section (plugins) as shown, ``leaf`` applied to each value: a value under a secret-looking key
    never appears."""
    from openclaw_cli.secrets_scrub import is_secret_name

    return {
        key: _masked_mapping(item, leaf)
        if isinstance(item, dict)
        else (SECRET_SET if is_secret_name(str(key)) and item not in (None, "") else leaf(item))
        for key, item in value.items()
    }


def mask_secret(value: SecretStr | None) -> str:
    if value is None:
        return "(unset)"
    # Never echo any part of a secret: a prefix can identify the key's account or type.
    return SECRET_SET if value.get_secret_value() else "(empty)"


def env_secret(value: SecretStr | None, *env_names: str) -> str | None:
    """A secret from settings, else from the first set of the well-known env vars (e.g. TINKER_API_KEY)."""
    if value is not None and value.get_secret_value():
        return value.get_secret_value()
    for name in env_names:
        if os.environ.get(name):
            return os.environ[name]
    return None
