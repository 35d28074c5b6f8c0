"""The evaluation core: is one policy version better than another? (``openclaw eval`` is its command,
:mod:`openclaw_cli.commands.eval`; the promotion gate, :mod:`openclaw_cli.learn.promotion`, runs it before publishing.)

A held-out set of prompts (the last stored main-line turns, those since a time, or a JSONL file of
``{"messages": [...]}``) is replayed against two policy versions, A and B. The judge then gives every reply an
absolute score (``\\boxed{1|0|-1}``) and every pair of replies a preference. Which reply the judge sees first is
balanced over the set (half the items show A first, half B, in a seeded shuffle) so a judge that favours a position
cannot move the win rate. The result: win rate of B over A (ties count half), mean score per version, and n.

``--plot PATH`` also draws the trainer's reward per step from the store's ``steps`` table as a PNG.

The judge is whatever :func:`openclaw_cli.learn.judge.make_judge_client` builds from the settings; the prompts here are
our own and versioned (:data:`EVAL_PROMPT_VERSION`), so results from different prompt versions are not mixed up.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from openclaw_cli.types import Message, SamplingParams

if TYPE_CHECKING:
    from openclaw_cli.backend import Backend
    from openclaw_cli.store import Store

EVAL_PROMPT_VERSION = "eval-v1"
BASE_SPEC = "base"
LATEST_SPEC = "latest"
# Bounded judge prompts: a long agent history would otherwise cost the judge more than the policy's reply.
MAX_CONTEXT_CHARS = 6000
MAX_REPLY_CHARS = 3000
# Steps-table keys a trainer may use for the mean judged reward of a step, most specific first.
REWARD_METRIC_KEYS = ("reward_mean", "mean_reward", "reward/mean", "train/reward_mean", "reward")


class EvalError(ValueError):
    """Nothing to evaluate, or an input that cannot be used; the message says what to do."""


class JudgeClient(Protocol):
    """The judge interface (engineer F's ``openclaw_cli.learn.judge.JudgeClient``), repeated so tests need no judge."""

    async def complete(self, messages: list[dict[str, Any]], *, temperature: float, max_tokens: int) -> str: ...


@dataclass(frozen=True)
class EvalItem:
    """One held-out prompt: the conversation up to (not including) the reply to be generated."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None
    source: str = ""  # where it came from: "prompts.jsonl:3", "turn:17"


@dataclass(frozen=True)
class PolicyChoice:
    """A version under evaluation: what the user asked for and the servable version number it became."""

    spec: str
    version: int
    checkpoint: str | None = None


@dataclass
class ItemResult:
    source: str
    reply_a: str | None
    reply_b: str | None
    score_a: int | None = None
    score_b: int | None = None
    b_shown_first: bool = False
    preference: str | None = None  # "a" | "b" | "tie" | None (no valid judgement)
    error: str | None = None


@dataclass
class EvalReport:
    prompt_version: str
    a: PolicyChoice
    b: PolicyChoice
    n: int
    win_rate_b: float | None  # (B wins + ties / 2) / judged pairs; None when no pair was judged
    wins_a: int
    wins_b: int
    ties: int
    pairs_judged: int
    mean_score_a: float | None
    mean_score_b: float | None
    scored_a: int
    scored_b: int
    items: list[ItemResult] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# --- prompt sets ---------------------------------------------------------------------------------------------------


def load_prompt_file(path: Path) -> list[EvalItem]:
    """Items from a JSONL file, one ``{"messages": [...], "tools": [...]?}`` per line (blank lines skipped)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EvalError(f"cannot read prompt file {path}: {exc.strerror or exc}") from None
    items: list[EvalItem] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path}:{number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list) or not row["messages"]:
            raise EvalError(f'{where}: each line must be an object with a non-empty "messages" list')
        messages = row["messages"]
        if not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages):
            raise EvalError(f'{where}: every message needs a "role"')
        if messages[-1]["role"] == "assistant":
            raise EvalError(f"{where}: the last message is the assistant's; end on the message it should answer")
        tools = row.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise EvalError(f'{where}: "tools" must be a list')
        items.append(EvalItem(messages=messages, tools=tools, source=where))
    if not items:
        raise EvalError(f"nothing to eval: {path} holds no prompts")
    return items


def load_stored_items(store: Store, *, last: int | None = 50, since: float | None = None) -> list[EvalItem]:
    """The prompts of stored main-line turns (captured since ``since``), the most recent ``last`` of them."""
    if last is not None and last < 1:
        raise EvalError("--last must be at least 1")
    recent: deque[EvalItem] = deque(maxlen=last)
    for turn in store.iter_turns(turn_type="main", since=since):
        if turn.messages:
            recent.append(EvalItem(messages=turn.messages, tools=turn.tools, source=f"turn:{turn.id}"))
    if not recent:
        window = " since the given time" if since is not None else ""
        raise EvalError(
            f"nothing to eval: the store holds no main-line turns{window}; capture some with `openclaw serve` "
            "or pass a JSONL of prompts with --prompts"
        )
    return list(recent)


# --- versions ------------------------------------------------------------------------------------------------------


def list_checkpoints(state_dir: Path) -> list[Path]:
    """Checkpoint directories under ``state_dir``, oldest first (hidden temp dirs of an unfinished save skipped)."""
    if not state_dir.is_dir():
        return []
    found = [p for p in state_dir.iterdir() if p.is_dir() and not p.name.startswith(".")]
    return sorted(found, key=lambda p: (p.stat().st_mtime, p.name))


def resolve_checkpoint(spec: str, state_dir: Path) -> Path | None:
    """Where a version spec's weights are: None for ``base``; the newest checkpoint for ``latest``; a checkpoint
    name under ``state_dir``; or a path to a checkpoint directory."""
    if spec == BASE_SPEC:
        return None
    if spec == LATEST_SPEC:
        found = list_checkpoints(state_dir)
        if not found:
            raise EvalError(
                f"no checkpoints in {state_dir} to evaluate as 'latest'; train first (`openclaw launch`), "
                "or name a checkpoint path"
            )
        return found[-1]
    named = state_dir / spec
    if named.is_dir():
        return named
    as_path = Path(spec).expanduser()
    if as_path.is_dir():
        return as_path
    known = ", ".join(p.name for p in list_checkpoints(state_dir)) or "none"
    raise EvalError(f"unknown version {spec!r}: use base, latest, a checkpoint in {state_dir} ({known}) or a path")


async def serve_choice(backend: Backend, spec: str, checkpoint: Path | None) -> PolicyChoice:
    """Make a version servable (loading its checkpoint) and return the number to pin requests to."""
    if checkpoint is None:
        return PolicyChoice(spec=spec, version=0)
    info = await backend.load_state(str(checkpoint))
    return PolicyChoice(spec=spec, version=info.version, checkpoint=str(checkpoint))


# --- judge prompts (versioned: change EVAL_PROMPT_VERSION when the wording changes) -------------------------------

_SCORE_SYSTEM = (
    "You grade one reply of an AI assistant to a conversation. Judge whether the reply does what the last message "
    "asks, is correct, and follows every instruction given in the conversation.\n"
    "Score 1: a good reply. Score 0: neither clearly good nor clearly bad. Score -1: wrong, unhelpful, off-topic "
    "or ignoring an instruction.\n"
    "Think briefly, then end with exactly one of \\boxed{1}, \\boxed{0} or \\boxed{-1}."
)
_PAIR_SYSTEM = (
    "You compare two replies of AI assistants to the same conversation. Prefer the reply that does what the last "
    "message asks, is correct, and follows every instruction given in the conversation. Ignore which reply comes "
    "first and how long it is.\n"
    "Think briefly, then end with \\boxed{1} if Reply 1 is better, \\boxed{2} if Reply 2 is better, or \\boxed{0} "
    "if they are equally good."
)
_BOXED = re.compile(r"\\boxed\{\s*([^{}]*?)\s*\}")


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else json.dumps(content, ensure_ascii=False)


def render_conversation(messages: Sequence[Message]) -> str:
    """The conversation as plain ``[role] text`` blocks, keeping its end when it is too long."""
    blocks = []
    for message in messages:
        text = _content_text(message.get("content"))
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            text += f"\n(tool call {function.get('name')}: {function.get('arguments')})"
        blocks.append(f"[{message.get('role')}] {text.strip()}")
    rendered = "\n\n".join(blocks)
    if len(rendered) > MAX_CONTEXT_CHARS:
        rendered = "…" + rendered[-MAX_CONTEXT_CHARS:]
    return rendered


def _clip(reply: str) -> str:
    return reply if len(reply) <= MAX_REPLY_CHARS else reply[:MAX_REPLY_CHARS] + "…"


def score_prompt(item: EvalItem, reply: str) -> list[dict[str, Any]]:
    user = f"Conversation:\n{render_conversation(item.messages)}\n\nReply to grade:\n{_clip(reply)}"
    return [{"role": "system", "content": _SCORE_SYSTEM}, {"role": "user", "content": user}]


def pair_prompt(item: EvalItem, first: str, second: str) -> list[dict[str, Any]]:
    user = (
        f"Conversation:\n{render_conversation(item.messages)}\n\nReply 1:\n{_clip(first)}\n\nReply 2:\n{_clip(second)}"
    )
    return [{"role": "system", "content": _PAIR_SYSTEM}, {"role": "user", "content": user}]


def last_boxed(text: str) -> str | None:
    found = _BOXED.findall(text)
    return found[-1] if found else None


def parse_score(text: str) -> int | None:
    value = last_boxed(text)
    return {"1": 1, "+1": 1, "0": 0, "-1": -1}.get(value or "")


def parse_choice(text: str) -> int | None:
    """1 or 2 for the preferred position, 0 for a tie, None when the answer has no valid choice."""
    value = (last_boxed(text) or "").lower()
    return {"1": 1, "2": 2, "0": 0, "tie": 0}.get(value)


def majority(votes: Sequence[int | None]) -> int | None:
    """The most frequent valid vote; a tie between the top votes is 0; no valid vote is None."""
    valid = [v for v in votes if v is not None]
    if not valid:
        return None
    counts = {v: valid.count(v) for v in set(valid)}
    top = max(counts.values())
    leaders = [v for v, c in counts.items() if c == top]
    return leaders[0] if len(leaders) == 1 else 0


def balanced_orders(n: int, seed: int) -> list[bool]:
    """For each item, whether B is shown first: exactly half of the items (rounded down) each way, shuffled."""
    orders = [i % 2 == 1 for i in range(n)]
    random.Random(seed).shuffle(orders)
    return orders


# --- the evaluation ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalOptions:
    max_tokens: int = 256
    temperature: float = 0.0  # greedy: each version gives its most likely reply, so A vs B is not sampling noise
    seed: int = 0
    votes: int = 1  # absolute-score votes per reply (majority)
    judge_temperature: float = 0.6
    judge_max_tokens: int = 512
    concurrency: int = 4


class _Judging:
    """Judge calls with bounded concurrency; failures become invalid votes and are remembered for the report."""

    def __init__(self, client: JudgeClient, options: EvalOptions) -> None:
        self._client = client
        self._options = options
        self._limit = asyncio.Semaphore(options.concurrency)
        self.calls = 0
        self.failures: list[str] = []

    async def ask(self, messages: list[dict[str, Any]]) -> str | None:
        async with self._limit:
            self.calls += 1
            try:
                return await self._client.complete(
                    messages, temperature=self._options.judge_temperature, max_tokens=self._options.judge_max_tokens
                )
            except Exception as exc:  # one failing judge call must not lose the whole evaluation
                self.failures.append(f"{type(exc).__name__}: {exc}")
                return None

    async def score(self, item: EvalItem, reply: str) -> int | None:
        answers = await asyncio.gather(*(self.ask(score_prompt(item, reply)) for _ in range(self._options.votes)))
        return majority([parse_score(a) if a is not None else None for a in answers])

    async def prefer(self, item: EvalItem, reply_a: str, reply_b: str, b_first: bool) -> str | None:
        first, second = (reply_b, reply_a) if b_first else (reply_a, reply_b)
        answer = await self.ask(pair_prompt(item, first, second))
        choice = parse_choice(answer) if answer is not None else None
        if choice is None:
            return None
        if choice == 0:
            return "tie"
        shown_first_won = choice == 1
        return "b" if shown_first_won == b_first else "a"


async def generate_replies(
    backend: Backend, items: Sequence[EvalItem], version: int, options: EvalOptions
) -> list[str | BaseException]:
    """Each item's reply text from one pinned version (an error in place of a reply that could not be made)."""
    tokenizer = backend.tokenizer()
    params = SamplingParams(max_tokens=options.max_tokens, temperature=options.temperature, seed=options.seed)
    limit = asyncio.Semaphore(options.concurrency)

    async def one(item: EvalItem) -> str:
        async with limit:
            prompt = tokenizer.render(item.messages, item.tools)
            result = await backend.sample(prompt, params, version=version)
            return result.text

    return await asyncio.gather(*(one(item) for item in items), return_exceptions=True)


async def judge_replies(
    client: JudgeClient,
    items: Sequence[EvalItem],
    replies_a: Sequence[str | BaseException],
    replies_b: Sequence[str | BaseException],
    a: PolicyChoice,
    b: PolicyChoice,
    options: EvalOptions,
) -> EvalReport:
    """Score every reply, compare every pair (position balanced), and total it up."""
    judging = _Judging(client, options)
    orders = balanced_orders(len(items), options.seed)

    async def one(index: int) -> ItemResult:
        item, ra, rb = items[index], replies_a[index], replies_b[index]
        result = ItemResult(
            source=item.source,
            reply_a=ra if isinstance(ra, str) else None,
            reply_b=rb if isinstance(rb, str) else None,
            b_shown_first=orders[index],
        )
        failed = [f"{name}: {r}" for name, r in (("A", ra), ("B", rb)) if isinstance(r, BaseException)]
        if failed:
            result.error = "; ".join(failed)
        if result.reply_a is not None:
            result.score_a = await judging.score(item, result.reply_a)
        if result.reply_b is not None:
            result.score_b = await judging.score(item, result.reply_b)
        if result.reply_a is not None and result.reply_b is not None:
            result.preference = await judging.prefer(item, result.reply_a, result.reply_b, orders[index])
        return result

    results = list(await asyncio.gather(*(one(i) for i in range(len(items)))))
    if judging.calls and len(judging.failures) == judging.calls:
        raise EvalError(f"every judge call failed; the first error: {judging.failures[0]}")
    return summarize(results, a, b)


def _mean(values: Sequence[int]) -> float | None:
    return sum(values) / len(values) if values else None


def summarize(results: list[ItemResult], a: PolicyChoice, b: PolicyChoice) -> EvalReport:
    wins_a = sum(r.preference == "a" for r in results)
    wins_b = sum(r.preference == "b" for r in results)
    ties = sum(r.preference == "tie" for r in results)
    judged = wins_a + wins_b + ties
    scores_a = [r.score_a for r in results if r.score_a is not None]
    scores_b = [r.score_b for r in results if r.score_b is not None]
    return EvalReport(
        prompt_version=EVAL_PROMPT_VERSION,
        a=a,
        b=b,
        n=len(results),
        win_rate_b=(wins_b + ties / 2) / judged if judged else None,
        wins_a=wins_a,
        wins_b=wins_b,
        ties=ties,
        pairs_judged=judged,
        mean_score_a=_mean(scores_a),
        mean_score_b=_mean(scores_b),
        scored_a=len(scores_a),
        scored_b=len(scores_b),
        items=results,
    )


async def evaluate(
    backend: Backend,
    client: JudgeClient,
    items: Sequence[EvalItem],
    a: PolicyChoice,
    b: PolicyChoice,
    options: EvalOptions | None = None,
) -> EvalReport:
    """Replay ``items`` on versions ``a`` and ``b`` (both already servable) and judge the replies."""
    if not items:
        raise EvalError("nothing to eval: the prompt set is empty")
    options = options or EvalOptions()
    replies_a = await generate_replies(backend, items, a.version, options)
    replies_b = await generate_replies(backend, items, b.version, options)
    if all(isinstance(r, BaseException) for r in [*replies_a, *replies_b]):
        raise EvalError(f"the policy produced no reply at all; the first error: {replies_a[0]}")
    return await judge_replies(client, items, replies_a, replies_b, a, b, options)


# --- reward-over-steps plot ----------------------------------------------------------------------------------------


def reward_series(
    steps: Sequence[tuple[int, int | None, float, dict[str, Any]]], metric: str | None = None
) -> tuple[str, list[int], list[float]]:
    """(metric key, step numbers, values) of the per-step reward in the store's steps table."""
    if not steps:
        raise EvalError("no training steps recorded yet: nothing to plot (the trainer records one per step)")
    keys = [metric] if metric else list(REWARD_METRIC_KEYS)
    seen = sorted({k for _, _, _, m in steps for k in m})
    for key in keys:
        points = [
            (step, float(m[key]))
            for step, _, _, m in steps
            if isinstance(m.get(key), int | float) and math.isfinite(m[key])
        ]
        if points:
            return key, [s for s, _ in points], [v for _, v in points]
    wanted = metric or " / ".join(REWARD_METRIC_KEYS)
    raise EvalError(f"no step records a reward under {wanted}; keys seen: {', '.join(seen) or 'none'}")


def _window_mean(values: Sequence[float], end: int, window: int) -> float:
    chunk = values[max(0, end - window + 1) : end + 1]
    return sum(chunk) / len(chunk)


def plot_reward_over_steps(
    steps: Sequence[tuple[int, int | None, float, dict[str, Any]]], path: Path, metric: str | None = None
) -> str:
    """Draw reward per step (and its running mean) as a PNG at ``path``; returns the metric key plotted."""
    key, xs, ys = reward_series(steps, metric)
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise EvalError("the reward plot needs matplotlib: pip install 'openclaw-cli[eval]'") from None
    # The object API (no pyplot) draws off-screen without touching matplotlib's global backend state.
    figure = Figure(figsize=(7, 4), dpi=100)
    FigureCanvasAgg(figure)
    axes = figure.add_subplot()
    axes.plot(xs, ys, marker="o", markersize=3, linewidth=1, label=key)
    window = max(1, len(ys) // 10)
    if window > 1:
        running = [_window_mean(ys, i, window) for i in range(len(ys))]
        axes.plot(xs, running, linewidth=2, label=f"running mean ({window} steps)")
    axes.axhline(0.0, color="grey", linewidth=0.5)
    axes.set_xlabel("training step")
    axes.set_ylabel("judged reward")
    axes.set_title("Reward over training steps")
    axes.legend(loc="best")
    figure.tight_layout()
    try:
        figure.savefig(path, format="png")
    except OSError as exc:
        raise EvalError(f"cannot write {path}: {exc.strerror or exc}") from None
    return key
