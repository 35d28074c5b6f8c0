"""The judge: PRM votes and OPD hints for every ready main-line turn, and the loop that hands them to the trainer.

For each turn the store hands out (``Store.claim_ready("judge", ...)``) the loop asks the judge model
``settings.judge.votes`` times, concurrently, whether the turn's next state shows progress (+1), a correction (-1) or
neither (0), and takes the majority of the valid votes (tie or none valid -> 0). When ``settings.method`` is ``opd`` or
``combined`` it also asks, as many times, for a hindsight hint (see :mod:`openclaw_cli.learn.judge_prompts`). A turn
with no next state (its session ended) scores 0 without a judge call. The verdict is stored once with
``Store.complete("judge", turn_id, json, reward=score)``; its JSON holds::

    {"score": -1|0|1, "votes": [1, -1, null, ...], "hints": [...distinct...], "hint": str|null,
     "hint_votes": [1, -1, null, ...], "prompt_version": "...", "prompt_hash": {"prm": ..., "hint": ...},
     "judge": "openai:model@url", "reason": "judged" | "no_next_state", "next_state_role": "user"|"tool"|null,
     "raw": {"prm": [...], "hint": [...]}}        # the judge's replies, clipped, for auditing

Failure handling: a judge that cannot be reached, times out, or answers 5xx / 429 / 401 is retried per call with
exponential backoff; when a call still fails the turn is given back (``Store.release``) to be claimed again after a
pause that grows while the judge stays down (up to :data:`MAX_DOWN_WAIT_S`, never longer than the lease). A judge
that stays down therefore leaves turns waiting, uncounted and unscored, and nothing here touches serving. A turn the
judge *rejects* (HTTP 400 / 413 / 422, e.g. a prompt over its context; or a prompt that cannot be built) is tried
again after ``retry_turn_after_s``, at most ``max_turn_attempts`` times; then it is completed as judged-failed. So is
a turn whose calls keep failing like an outage (5xx, timeouts) while the judge answers other turns: such a failure
counts against the turn only when the judge has judged some other turn since this turn last failed (a judge that is
simply down never costs a turn its attempts)::

    {"score": null, "failed": true, "reason": "judge_failed", "error": "...", "attempts": 3, "judge": "...", ...}

(``Store.handoff_counts`` and the status endpoint count them; the trainer completes them untrained). A restart
releases the claims the previous process held at once (``Store.take_over_claims`` in :meth:`JudgeLoop.run`).

Judge clients (:func:`make_judge_client`): an OpenAI-compatible endpoint (``judge.base_url`` + ``judge.model``), a
LiteLLM model string (``judge.model`` alone; needs ``pip install litellm``), or, with no judge model, the policy
backend itself pinned to version 0, the frozen base model: a judge that trained along with the policy would grade
with labels drifting under the very updates they cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import json
import logging
import math
import os
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from openclaw_cli.capture.redaction import Redactor
from openclaw_cli.learn.judge_prompts import (
    PROMPT_VERSION,
    assistant_text,
    choose_hint,
    clip_middle,
    dedupe_hints,
    hint_messages,
    majority,
    parse_hint,
    parse_vote,
    prm_messages,
    prompt_hashes,
)
from openclaw_cli.learn.judge_verdict import (
    CHANNEL_FRAMES,
    VERDICT_PROMPT_VERSION,
    VERDICT_QUESTION,
    VERDICT_SYSTEM,
    VERDICT_WORDS,
    channel_log_odds,
    channel_prefix,
    channel_text,
    hint_from_next_state,
    reward_from_log_odds,
    verdict_log_odds,
)
from openclaw_cli.tokenizer import flatten_content
from openclaw_cli.types import SamplingParams

if TYPE_CHECKING:
    from openclaw_cli.backend import Backend
    from openclaw_cli.settings import Settings
    from openclaw_cli.store import Store, TurnRecord

log = logging.getLogger(__name__)
# What a judge reads of a turn: (history, the reply, its next state, the next state's role).
TurnToJudge = tuple[list[dict], dict, list[dict], str | None]
T = TypeVar("T")

JUDGE_CONSUMER = "judge"
POLICY_JUDGE_VERSION = 0  # the base model; see the module docstring
RAW_REPLY_CHARS = 1000
REJECTION_STATUS = frozenset({400, 413, 422})  # the judge refused this input: the same call would fail again
MAX_DOWN_WAIT_S = 300.0  # longest pause before turns are retried while the judge stays down


class JudgeConfigError(ValueError):
    """The judge settings cannot make a client (the message says which setting and what to do)."""


class JudgeUnavailable(RuntimeError):
    """A judge call kept failing after every retry; the turn is left for a later claim."""


class JudgeRejected(RuntimeError):
    """The judge refused this turn's prompt (or it could not be built); retrying the same call cannot help."""


class JudgeNoLogprobs(RuntimeError):
    """The judge endpoint answers but returns no logprobs, so the logprob readout cannot run on it."""


class JudgeInputError(ValueError):
    """A judge client cannot send this prompt at all (e.g. it does not fit the judge's context)."""


def is_rejection(exc: BaseException) -> bool:
    """Whether a failed judge call failed because of this turn's input, rather than because the judge is down,
    overloaded or misconfigured (401, 404, 429, 5xx, connection errors: worth waiting for)."""
    if isinstance(exc, JudgeInputError):
        return True
    status = getattr(exc, "status_code", None)
    if status is None:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    return isinstance(status, int) and status in REJECTION_STATUS


@runtime_checkable
class JudgeClient(Protocol):
    async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str: ...


# --- clients -------------------------------------------------------------------------------------------------------
class OpenAIJudgeClient:
    """Any OpenAI-compatible chat endpoint, through the ``openai`` SDK (its own retries off: the loop retries)."""

    def __init__(
        self,
        model: str,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 120.0,
        http_client: Any = None,
    ) -> None:
        from openai import AsyncOpenAI

        self.model = model
        self.name = f"openai:{model}@{base_url}"
        # Local servers (vLLM, llama.cpp, Ollama) take any key; the SDK refuses to start without one.
        self._client = AsyncOpenAI(
            base_url=base_url,
            api_key=api_key or "not-needed",
            max_retries=0,
            timeout=timeout_s,
            http_client=http_client,
        )

    async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str:
        response = await self._client.chat.completions.create(
            model=self.model,
            messages=messages,  # type: ignore[arg-type]
            temperature=temperature,
            max_tokens=max_tokens,
        )
        if not response.choices:
            raise RuntimeError("the judge endpoint returned no choices")
        return response.choices[0].message.content or ""

    async def verdict_logprobs(self, messages: list[dict], words: list[str]) -> dict[str, float]:
        """log p of each verdict word as the judge's first token, from ``top_logprobs`` (one token generated)."""
        response = await self._client.chat.completions.create(
            model=self.model,
            messages=messages,  # type: ignore[arg-type]
            temperature=0.0,
            max_tokens=1,
            logprobs=True,
            top_logprobs=TOP_LOGPROBS,
        )
        return first_token_words(response, words, "the judge endpoint")


TOP_LOGPROBS = 20  # the most OpenAI's API returns


def first_token_words(response: Any, words: list[str], who: str) -> dict[str, float]:
    """The verdict words' log-probabilities from a chat completion's first-token ``top_logprobs`` (the OpenAI shape,
    which LiteLLM returns too); JudgeNoLogprobs naming ``who`` when it carries none."""
    logprobs = response.choices[0].logprobs if response.choices else None
    content = getattr(logprobs, "content", None) if logprobs is not None else None
    if not content:
        raise JudgeNoLogprobs(
            f"{who} returned no logprobs; it cannot judge in mode 'logprob' (set judge.mode = 'vote')"
        )
    return words_from_top_logprobs([(alt.token, alt.logprob) for alt in content[0].top_logprobs], words)


def words_from_top_logprobs(alternatives: list[tuple[str, float]], words: list[str]) -> dict[str, float]:
    """Fold first-token alternatives into per-word log-probabilities: a token counts for a word when, stripped and
    lower-cased, it is the word or a prefix of it (at least two characters) that no other word shares."""
    found: dict[str, float] = {}
    for token, logprob in alternatives:
        piece = token.strip().lower()
        owners = [w for w in words if piece == w or (len(piece) >= 2 and w.startswith(piece))]
        if len(owners) != 1:
            continue
        word = owners[0]
        found[word] = logprob if word not in found else _logaddexp(found[word], logprob)
    return found


def _logaddexp(a: float, b: float) -> float:
    high = max(a, b)
    return high + math.log(math.exp(a - high) + math.exp(b - high))


LITELLM_LOGGERS = ("LiteLLM", "LiteLLM Router", "LiteLLM Proxy")


class LiteLLMJudgeClient:
    """A LiteLLM model string (``anthropic/claude-...``, ``gemini/...``, ``openai/<model>`` on any OpenAI-compatible
    server with ``base_url``); litellm is imported on first use. LiteLLM's own retries are off (the judge loop
    retries with backoff) and its debug banners are silenced: a failing provider is one line in the log."""

    prefers_votes = True  # judge.mode = auto: vote (logprob on request, for providers that return top_logprobs)

    def __init__(
        self, model: str, *, api_key: str | None = None, base_url: str | None = None, timeout_s: float = 120.0
    ) -> None:
        if importlib.util.find_spec("litellm") is None:
            raise JudgeConfigError(
                f"judge.model={model!r} is read as a LiteLLM model string, but litellm is not installed: "
                "`pip install litellm`, or set judge.base_url to an OpenAI-compatible endpoint, or unset judge.model "
                "to judge with the policy itself"
            )
        self.model = model
        self.name = f"litellm:{model}" + (f"@{base_url}" if base_url else "")
        self._api_key = api_key
        self._base_url = base_url
        self._timeout_s = timeout_s
        self._module: Any = None

    def _litellm(self) -> Any:
        """litellm, imported and quietened on first use."""
        if self._module is None:
            litellm: Any = importlib.import_module("litellm")
            litellm.suppress_debug_info = True  # else every failure prints "Give Feedback / Get Help" to stdout
            if not os.environ.get("LITELLM_LOG"):
                # Its loggers print every call at INFO to stdout through their own handler (under `launch --no-ui`,
                # which logs at INFO): the judge's own lines say what matters. LITELLM_LOG=DEBUG brings them back.
                for name in LITELLM_LOGGERS:
                    logging.getLogger(name).setLevel(logging.WARNING)
            self._module = litellm
        return self._module

    def _options(self) -> dict[str, Any]:
        options: dict[str, Any] = {"num_retries": 0, "timeout": self._timeout_s}
        if self._api_key:
            options["api_key"] = self._api_key
        if self._base_url:
            options["api_base"] = self._base_url
        return options

    async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str:
        response = await self._litellm().acompletion(
            model=self.model, messages=messages, temperature=temperature, max_tokens=max_tokens, **self._options()
        )
        if not response.choices:
            raise RuntimeError(f"{self.name} returned no choices")
        return response.choices[0].message.content or ""

    async def verdict_logprobs(self, messages: list[dict], words: list[str]) -> dict[str, float]:
        """As :meth:`OpenAIJudgeClient.verdict_logprobs`, for providers that return ``top_logprobs`` (OpenAI and
        OpenAI-compatible servers; not Anthropic or Gemini, where judge.mode must be vote)."""
        litellm = self._litellm()
        try:
            response = await litellm.acompletion(
                model=self.model,
                messages=messages,
                temperature=0.0,
                max_tokens=1,
                logprobs=True,
                top_logprobs=TOP_LOGPROBS,
                **self._options(),
            )
        except litellm.UnsupportedParamsError as exc:
            raise JudgeNoLogprobs(
                f"{self.name} does not take logprobs ({exc}); it cannot judge in mode 'logprob' (set judge.mode = "
                "'vote')"
            ) from None
        return first_token_words(response, words, self.name)


class PolicyJudgeClient:
    """The policy backend as its own judge: the chat is rendered with the backend's template and sampled from a
    pinned version (default 0, the frozen base). It shares the backend with serving, so it adds load there."""

    def __init__(self, backend: Backend, *, version: int | None = POLICY_JUDGE_VERSION) -> None:
        self._backend = backend
        self.version = version
        self.name = f"policy:v{version}" if version is not None else "policy:current"

    async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str:
        tokenizer = self._backend.tokenizer()
        prompt = tokenizer.render(messages, add_generation_prompt=True)
        # Leave room for the answer; a prompt that cannot fit is an input problem no retry will fix.
        room = tokenizer.context_length - len(prompt)
        if room < 16:
            raise JudgeInputError(
                f"judge prompt of {len(prompt)} tokens leaves no room in a {tokenizer.context_length} context"
            )
        params = SamplingParams(max_tokens=min(max_tokens, room), temperature=temperature)
        result = await self._backend.sample(prompt, params, version=self.version)
        return result.text

    async def continuation_logprob(self, prefix: str, text: str) -> float:
        """log p(text | prefix) under the judge's version (the channel readout): one teacher-forced pass."""
        tokenizer = self._backend.tokenizer()
        head, tail = tokenizer.encode(prefix), tokenizer.encode(text)
        if not head or not tail:
            raise JudgeInputError("the channel prefix and the scored text must each hold at least one token")
        if len(head) + len(tail) > tokenizer.context_length:
            raise JudgeInputError(f"{len(head) + len(tail)} tokens exceed the judge's {tokenizer.context_length}")
        scored = await self._logprobs(head + tail, start=len(head))
        return float(sum(v for v in scored[len(head) :] if v is not None))

    async def verdict_logprobs(self, messages: list[dict], words: list[str]) -> dict[str, float]:
        """log p of each verdict word as the judge's next token after the rendered chat (the logprob readout)."""
        tokenizer = self._backend.tokenizer()
        prompt = tokenizer.render(messages, add_generation_prompt=True)
        if len(prompt) >= tokenizer.context_length:
            raise JudgeInputError(f"judge prompt of {len(prompt)} tokens fills the {tokenizer.context_length} context")
        candidates = {word: first_token_variants(tokenizer, word) for word in words}
        flat = sorted({t for ids in candidates.values() for t in ids})
        scorer = getattr(self._backend, "next_token_logprobs", None)
        if callable(scorer):  # one forward pass for every candidate
            values = await scorer(prompt, flat, version=self.version)
        else:  # any backend: each candidate appended and teacher-forced (Tinker: prompt logprobs)
            values = [
                float((await self._logprobs([*prompt, token], start=len(prompt)))[-1] or -math.inf) for token in flat
            ]
        by_token = dict(zip(flat, values, strict=True))
        out: dict[str, float] = {}
        for word, ids in candidates.items():
            for token in ids:
                lp = by_token[token]
                out[word] = lp if word not in out else _logaddexp(out[word], lp)
        return out

    async def _logprobs(self, tokens: list[int], *, start: int) -> list[float | None]:
        if self.version in (None, POLICY_JUDGE_VERSION):
            base = self.version == POLICY_JUDGE_VERSION
            return await self._backend.compute_logprobs(tokens, base=base, start=start)
        raise JudgeConfigError("the policy judge scores with the base (version 0) or the current version only")


def first_token_variants(tokenizer: Any, word: str) -> list[int]:
    """The first token of ``word`` as a reply would start it: bare or after a space, lower or capitalised."""
    ids = set()
    for variant in (word, " " + word, word.capitalize(), " " + word.capitalize()):
        encoded = tokenizer.encode(variant)
        if encoded:
            ids.add(int(encoded[0]))
    return sorted(ids)


def make_judge_client(settings: Settings, backend: Backend | None = None) -> JudgeClient:
    """The judge named by ``settings.judge``: base_url + model -> OpenAI-compatible; model alone, or
    ``judge.client = "litellm"`` -> LiteLLM (base_url as its api_base); neither -> the policy backend pinned to the
    base version."""
    judge = settings.judge
    api_key = judge.api_key.get_secret_value() if judge.api_key is not None else None
    if judge.client == "litellm":
        if not judge.model:
            raise JudgeConfigError("judge.client = 'litellm' needs judge.model: a LiteLLM model string")
        return LiteLLMJudgeClient(judge.model, api_key=api_key, base_url=judge.base_url)
    if judge.client == "openai" and not judge.base_url:
        raise JudgeConfigError("judge.client = 'openai' needs judge.base_url (an OpenAI-compatible endpoint)")
    if judge.base_url:
        if not judge.model:
            raise JudgeConfigError(
                f"judge.base_url is set ({judge.base_url}) but judge.model is not: name the model that endpoint serves"
            )
        return OpenAIJudgeClient(judge.model, judge.base_url, api_key)
    if judge.model:
        return LiteLLMJudgeClient(judge.model, api_key=api_key)
    if backend is None:
        raise JudgeConfigError("no judge model is configured and no policy backend was given to judge with")
    return PolicyJudgeClient(backend)


# --- the verdict ---------------------------------------------------------------------------------------------------
@dataclass
class Verdict:
    score: float  # the reward: -1/0/+1 in vote mode, P(+1) - P(-1) (0 below the margin) in channel/logprob mode
    votes: list[int | None] = field(default_factory=list)
    hints: list[str] = field(default_factory=list)
    hint: str | None = None
    hint_votes: list[int | None] = field(default_factory=list)
    reason: str = "judged"
    raw_prm: list[str] = field(default_factory=list)
    raw_hint: list[str] = field(default_factory=list)
    mode: str = "vote"
    log_odds: float | None = None  # channel/logprob: log-odds of progress over correction, before the margin
    probs: dict[str, float] | None = None  # logprob mode: the verdict words' probabilities
    hint_source: str | None = None  # "judge" | "next_state" when a hint was kept

    def to_json(self, *, judge_name: str, next_state_role: str | None, seconds: float | None = None) -> str:
        body: dict[str, Any] = {
            "score": self.score,
            "mode": self.mode,
            "votes": self.votes,
            "hints": self.hints,
            "hint": self.hint,
            "hint_source": self.hint_source,
            "hint_votes": self.hint_votes,
            "prompt_version": PROMPT_VERSION if self.mode == "vote" else VERDICT_PROMPT_VERSION,
            "prompt_hash": prompt_hashes(),
            "judge": judge_name,
            "reason": self.reason,
            "next_state_role": next_state_role,
            "raw": {
                "prm": [clip_middle(r, RAW_REPLY_CHARS) for r in self.raw_prm],
                "hint": [clip_middle(r, RAW_REPLY_CHARS) for r in self.raw_hint],
            },
        }
        if self.log_odds is not None:
            body["log_odds"] = round(self.log_odds, 4)
        if self.probs is not None:
            body["probs"] = {k: round(v, 4) for k, v in self.probs.items()}
        if seconds is not None:
            body["seconds"] = round(seconds, 3)  # the verdict's wall time, judge calls and retries included
        return json.dumps(body, ensure_ascii=False)


def wants_next_state_hint(which: str, verdict: Verdict) -> bool:
    """Whether the user's next message becomes the turn's OPD hint (``judge.next_state_hints``): ``every`` reply;
    ``unhappy``, where the reward is 0 or below (corrections and verdicts under the margin); ``corrections``, where
    the judge leans toward a correction: log-odds below 0, under the margin or not (vote mode, which has none: a
    score below 0)."""
    if which == "every":
        return True
    if which == "unhappy":
        return verdict.score <= 0
    lean = verdict.log_odds if verdict.log_odds is not None else verdict.score
    return lean < 0


def resolve_mode(setting: str, client: object) -> str:
    """The readout a judge client runs: ``judge.mode``, or for ``auto`` the best one it supports (channel, then
    logprob, then vote). Raises JudgeConfigError when the client cannot run the mode asked for."""
    supports = {
        "channel": callable(getattr(client, "continuation_logprob", None)),
        "logprob": callable(getattr(client, "verdict_logprobs", None)),
        "vote": callable(getattr(client, "complete", None)),
    }
    if setting == "auto":
        # A LiteLLM model is most often a strong cloud model (several without logprobs): it reasons, then votes.
        if getattr(client, "prefers_votes", False):
            supports["logprob"] = False
        return next(mode for mode in ("channel", "logprob", "vote") if supports[mode])
    if not supports.get(setting, False):
        name = getattr(client, "name", type(client).__name__)
        raise JudgeConfigError(
            f"judge.mode = {setting!r} is not supported by the judge {name} "
            "(channel needs the policy as judge; logprob needs an endpoint that returns top_logprobs)"
        )
    return setting


@dataclass
class JudgeStats:
    judged: int = 0
    failed: int = 0  # turn attempts that failed (the turn is given back and retried later)
    gave_up: int = 0  # turns completed as judged-failed after max_turn_attempts counted failures
    calls: int = 0
    call_errors: int = 0
    paced_rounds: int = 0  # rounds the judge waited because the trainer had judge.max_ahead turns still to take
    last_error: str | None = None


# --- the loop ------------------------------------------------------------------------------------------------------
class JudgeLoop:
    """Claims ready main-line turns, judges them, completes each once (see the module docstring).

    ``lease_s`` must exceed the time a batch takes to judge (retries included), else another claim could judge a
    turn twice; the second completion would be a harmless no-op.
    """

    def __init__(
        self,
        store: Store,
        client: JudgeClient,
        settings: Settings,
        *,
        consumer: str = JUDGE_CONSUMER,
        batch_size: int = 8,
        lease_s: float = 600.0,
        poll_s: float = 1.0,
        max_tokens: int = 1024,
        call_timeout_s: float = 180.0,
        retry_attempts: int = 4,
        retry_base_s: float = 0.5,
        retry_max_s: float = 8.0,
        max_turn_attempts: int = 3,
        retry_turn_after_s: float = 30.0,
        down_wait_s: float = 5.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        trainer_waiting: Callable[[], Awaitable[int]] | None = None,
    ) -> None:
        if retry_attempts < 1:
            raise ValueError("retry_attempts must be >= 1")
        if max_turn_attempts < 1:
            raise ValueError("max_turn_attempts must be >= 1")
        self.max_turn_attempts = max_turn_attempts
        self.retry_turn_after_s = retry_turn_after_s
        self.down_wait_s = down_wait_s  # first pause while the judge is down; doubles per round that finds it down
        self._down_rounds = 0
        self._said_down = False  # the judge's unavailability is logged once, until it answers again
        # Outage-like failures per turn: the judged count when the turn last failed that way. A later failure counts
        # against the turn only if the judge judged other turns in between (it is up, and this prompt breaks it).
        self._judged_total = 0
        self._unavailable_since: dict[int, int] = {}
        self.store = store
        self.client = client
        self.settings = settings
        self.consumer = consumer
        self.batch_size = batch_size
        self.lease_s = lease_s
        self.poll_s = poll_s
        self.max_tokens = max_tokens
        self.call_timeout_s = call_timeout_s
        self.retry_attempts = retry_attempts
        self.retry_base_s = retry_base_s
        self.retry_max_s = retry_max_s
        self._sleep = sleep
        self._limit = asyncio.Semaphore(settings.judge.max_concurrency)
        self.stats = JudgeStats()
        self.judge_name = str(getattr(client, "name", type(client).__name__))
        self.mode = resolve_mode(settings.judge.mode, client)
        self._mode_chosen = settings.judge.mode == "auto"  # auto may fall back to votes (see judge_turn)
        self.redactor = Redactor.from_settings(settings)  # store.redact: secrets never reach the judge
        # How many judged turns the trainer beside this judge still has to take (TrainerLoop.waiting); None: no
        # trainer in this process, judge everything.
        self.trainer_waiting = trainer_waiting

    @property
    def wants_hints(self) -> bool:
        return self.settings.method in ("opd", "combined")

    async def run_once(self) -> int:
        """Claim one batch and judge it; returns how many turns this call completed (0 also while the trainer has
        ``judge.max_ahead`` judged turns still to take: see that setting)."""
        room = self.batch_size
        # Never fewer than a training batch: the trainer waits for a full one.
        ahead = max(self.settings.judge.max_ahead, self.settings.train.batch_size)
        if self.trainer_waiting is not None and self.settings.judge.max_ahead > 0:
            room = min(room, ahead - await self.trainer_waiting())
            if room <= 0:
                self.stats.paced_rounds += 1
                return 0
        # Newest first: when users talk faster than the judge reads, the trainer wants verdicts on turns the current
        # policy wrote (an old turn's verdict arrives when its sample is too stale to train on).
        turns = await asyncio.to_thread(self.store.claim_ready, self.consumer, room, self.lease_s, newest_first=True)
        if not turns:
            return 0
        outcomes = await asyncio.gather(*(self._judge_and_complete(turn) for turn in turns))
        if "judged" in outcomes:
            self._down_rounds = 0
        elif "unavailable" in outcomes:
            self._down_rounds += 1  # the next turns given back wait longer
        return outcomes.count("judged")

    async def run(self, stop: asyncio.Event) -> None:
        """Judge until ``stop`` is set; waits ``poll_s`` when there is nothing to do. Never dies on an error.

        First takes over the judge's claims: those a previous (crashed) process held are judged again at once."""
        try:
            released = await asyncio.to_thread(self.store.take_over_claims, self.consumer)
        except Exception as exc:  # judging still works; a dead process's claims then wait out their lease
            log.error("cannot take over the judge's earlier claims: %s", exc)
            self.stats.last_error = f"{type(exc).__name__}: {exc}"
            released = 0
        if released:
            log.info("released %d turn(s) a previous process was judging", released)
        while not stop.is_set():
            try:
                judged = await self.run_once()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # e.g. the store is briefly locked: log it and try again next round
                log.exception("judge loop round failed")
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                judged = 0
            if judged == 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.poll_s)

    async def judge_turn(self, turn: TurnRecord) -> Verdict:
        """The verdict for one turn (no store access). Raises JudgeUnavailable when the judge keeps failing."""
        if not turn.next_state:
            return Verdict(score=0, reason="no_next_state", mode=self.mode)
        args: TurnToJudge = (turn.messages, turn.assistant_message, turn.next_state, turn.next_state_role)
        if self.redactor.enabled:
            # store.redact: redact the turn before the prompts clip it, so no secret is cut in half at a clip
            # boundary (and half missed); a long history takes a while, so off the event loop.
            args = await asyncio.to_thread(self.redactor.redact_value, args)
        if self.mode == "vote":
            verdict = await self._vote(args)
        else:
            try:
                verdict = await self._read_verdict(args)
            except JudgeNoLogprobs as exc:
                if not self._mode_chosen:
                    raise JudgeRejected(str(exc)) from exc
                # judge.mode = auto picked logprob for an OpenAI-compatible endpoint that turns out to return none
                # (llama.cpp builds, some gateways): sampled votes work everywhere.
                log.warning("%s; judging with sampled votes from now on", exc)
                self.mode = "vote"
                verdict = await self._vote(args)
        hint_source = self.settings.judge.hint_source
        if verdict.hint is not None:
            verdict.hint_source = "judge"
        elif self.wants_hints and hint_source in ("auto", "next_state"):
            # The user's own next message is the hint: a correction or an instruction is hindsight in the user's
            # words, even where the judge cannot write a hint. Which replies (judge.next_state_hints): a small judge
            # masks many corrections under its margin, so the verdict's sign is read before the margin; a reply it
            # leans to reading as approval is not hindsight about the reply ("Thanks! Next question: ...", "tell me
            # more"), and told it the frozen base model ends its answers sooner, which OPD then distils into a
            # user who never spoke of length (bench/owners.py's owner B).
            next_state = args[2]
            role = turn.next_state_role or (str(next_state[-1].get("role")) if next_state else None)
            if role == "user" and wants_next_state_hint(self.settings.judge.next_state_hints, verdict):
                words = [flatten_content(m.get("content")) for m in next_state if m.get("role") == "user"]
                hint = hint_from_next_state(words[-1]) if words else None
                if hint is not None:
                    verdict.hint, verdict.hints, verdict.hint_source = hint, [hint], "next_state"
        return verdict

    async def _read_verdict(self, args: TurnToJudge) -> Verdict:
        """channel / logprob mode: the verdict from the judge's probabilities (see openclaw_cli.learn.judge_verdict)."""
        _, reply, next_state, next_state_role = args
        margin = self.settings.judge.margin
        reply_text = assistant_text(reply)
        # The next state's own words, as the readouts were measured (no "[user]" labels: the prefix names the role).
        next_text = "\n".join(flatten_content(m.get("content")) for m in next_state)
        if self.mode == "channel":
            text = channel_text(next_text)
            scored = await asyncio.gather(
                *(
                    self._guarded(
                        self.client.continuation_logprob,  # type: ignore[attr-defined]
                        channel_prefix(reply_text, next_state_role, verdict, frame),
                        text,
                    )
                    for frame in range(len(CHANNEL_FRAMES))
                    for verdict in (1, -1)
                )
            )
            log_odds = channel_log_odds(list(zip(scored[::2], scored[1::2], strict=True)))
            return Verdict(
                score=reward_from_log_odds(log_odds, margin), mode="channel", log_odds=log_odds, reason="judged"
            )
        words = list(VERDICT_WORDS)
        user = f"{prm_messages(*args)[1]['content']}"
        # The PRM prompt's context sections, with the one-word question in place of the boxed-vote one.
        user = user.rsplit("\n\n", 1)[0] + "\n\n" + VERDICT_QUESTION
        messages = [{"role": "system", "content": VERDICT_SYSTEM}, {"role": "user", "content": user}]
        logprobs = await self._guarded(self.client.verdict_logprobs, messages, words)  # type: ignore[attr-defined]
        log_odds, probs = verdict_log_odds(logprobs)
        return Verdict(score=reward_from_log_odds(log_odds, margin), mode="logprob", log_odds=log_odds, probs=probs)

    async def _vote(self, args: TurnToJudge) -> Verdict:
        """vote mode: m sampled PRM votes (majority) and, for OPD, m sampled hint answers."""
        m = self.settings.judge.votes
        temperature = self.settings.judge.temperature
        prm_prompt = prm_messages(*args)
        judge_hints = self.wants_hints and self.settings.judge.hint_source in ("auto", "judge")
        hint_prompt = hint_messages(*args) if judge_hints else None
        try:
            # A TaskGroup, not gather: when one call gives up, its siblings are cancelled instead of running on.
            async with asyncio.TaskGroup() as group:
                prm_tasks = [group.create_task(self._call(prm_prompt, temperature)) for _ in range(m)]
                hint_tasks = (
                    [group.create_task(self._call(hint_prompt, temperature)) for _ in range(m)]
                    if hint_prompt is not None
                    else []
                )
        except* (JudgeUnavailable, JudgeRejected) as group_error:
            raise group_error.exceptions[0] from None
        raw_prm = [task.result() for task in prm_tasks]
        raw_hint = [task.result() for task in hint_tasks]
        votes = [parse_vote(text) for text in raw_prm]
        parsed_hints = [parse_hint(text) for text in raw_hint]
        accepted = [h.hint for h in parsed_hints if h.hint is not None]
        return Verdict(
            score=majority(votes),
            votes=votes,
            hints=dedupe_hints(accepted),
            hint=choose_hint(accepted),
            hint_votes=[h.accepted for h in parsed_hints],
            raw_prm=raw_prm,
            raw_hint=raw_hint,
        )

    async def _judge_and_complete(self, turn: TurnRecord) -> str:
        """Judge one turn and record the outcome: "judged", "duplicate" (already done), "unavailable" (given back
        to wait for the judge), "rejected" (given back, counted) or "gave_up" (completed as judged-failed after too many
        counted failures)."""
        started = time.monotonic()
        try:
            verdict = await self.judge_turn(turn)
        except JudgeUnavailable as exc:
            self.stats.failed += 1
            self.stats.last_error = str(exc)
            # A judge that is down says nothing about the turn: uncounted, and the pause grows while it stays down.
            # But if it judged other turns since this one last failed, the failure is this turn's to count.
            judged_before = self._unavailable_since.get(turn.id)
            counted = judged_before is not None and self._judged_total > judged_before
            self._unavailable_since[turn.id] = self._judged_total
            wait = min(self.lease_s, self.down_wait_s * 2 ** min(self._down_rounds, 16), MAX_DOWN_WAIT_S)
            failures = await asyncio.to_thread(
                self.store.release,
                self.consumer,
                turn.id,
                retry_at=time.time() + wait,
                error=str(exc),
                count_failure=counted,
            )
            if counted and failures >= self.max_turn_attempts:
                self._unavailable_since.pop(turn.id, None)
                return await self._give_up(turn, f"{exc} (while the judge answered other turns)", failures)
            if not self._said_down:
                self._said_down = True
                log.warning(
                    "the judge %s is unavailable, so turns wait unjudged (nothing is scored or trained from them; "
                    "serving goes on) and are retried with growing pauses: %s",
                    self.judge_name,
                    exc,
                )
            else:
                log.debug("turn %s left unjudged (judge unavailable), retried in %.0fs: %s", turn.id, wait, exc)
            return "unavailable"
        except Exception as exc:  # rejected by the judge, or a prompt that cannot be built: about this turn
            self.stats.failed += 1
            error = f"{type(exc).__name__}: {exc}"
            self.stats.last_error = f"turn {turn.id}: {error}"
            wait = min(self.lease_s, self.retry_turn_after_s)
            failures = await asyncio.to_thread(
                self.store.release,
                self.consumer,
                turn.id,
                retry_at=time.time() + wait,
                error=error,
                count_failure=True,
            )
            if failures < self.max_turn_attempts:
                log.warning(
                    "turn %s rejected by the judge (%d/%d), retried in %.0fs: %s",
                    turn.id,
                    failures,
                    self.max_turn_attempts,
                    wait,
                    error,
                )
                return "rejected"
            return await self._give_up(turn, error, failures)
        self._judged_total += 1
        self._unavailable_since.pop(turn.id, None)
        if self._said_down:
            self._said_down = False
            log.info("the judge %s answers again", self.judge_name)
        result = verdict.to_json(
            judge_name=self.judge_name, next_state_role=turn.next_state_role, seconds=time.monotonic() - started
        )
        first = await asyncio.to_thread(self.store.complete, self.consumer, turn.id, result, reward=verdict.score)
        if first:
            self.stats.judged += 1
        return "judged" if first else "duplicate"

    async def _give_up(self, turn: TurnRecord, error: str, attempts: int) -> str:
        """Complete a turn the judge keeps rejecting (or failing on) as judged-failed: no score, never trained, counted
        in status."""
        result = json.dumps(
            {
                "score": None,
                "failed": True,
                "reason": "judge_failed",
                "error": clip_middle(error, RAW_REPLY_CHARS),
                "attempts": attempts,
                "judge": self.judge_name,
                "prompt_version": PROMPT_VERSION,
                "next_state_role": turn.next_state_role,
            },
            ensure_ascii=False,
        )
        first = await asyncio.to_thread(self.store.complete, self.consumer, turn.id, result, failed=True)
        if first:
            self.stats.gave_up += 1
            log.error("turn %s judged-failed after %d failed attempts: %s", turn.id, attempts, error)
        return "gave_up" if first else "duplicate"

    async def _call(self, messages: list[dict[str, str]], temperature: float) -> str:
        """One judge completion (vote mode)."""
        return await self._guarded(self.client.complete, messages, temperature=temperature, max_tokens=self.max_tokens)

    async def _guarded(self, call: Callable[..., Awaitable[T]], *args: Any, **kwargs: Any) -> T:
        """One judge call under the concurrency limit, retried with exponential backoff and jitter."""
        for attempt in range(self.retry_attempts):
            async with self._limit:
                self.stats.calls += 1
                try:
                    async with asyncio.timeout(self.call_timeout_s):
                        return await call(*args, **kwargs)
                except JudgeNoLogprobs:
                    raise  # the endpoint's nature, not a failure: asking again cannot help
                except Exception as exc:  # CancelledError is a BaseException and passes through
                    self.stats.call_errors += 1
                    error = f"{type(exc).__name__}: {exc}"
                    if is_rejection(exc):  # the same prompt would be refused again: no point retrying now
                        raise JudgeRejected(f"the judge rejected the prompt: {error}") from exc
                    if attempt + 1 == self.retry_attempts:
                        raise JudgeUnavailable(f"judge call failed {self.retry_attempts} times, last: {error}") from exc
            # Sleep outside the semaphore so a failing call does not hold a slot others could use.
            delay = min(self.retry_max_s, self.retry_base_s * 2**attempt) * random.uniform(0.5, 1.0)
            log.debug("judge call failed (%s); retry %d in %.2fs", error, attempt + 1, delay)
            await self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover
