"""What the lesson tests share: a captured exchange as the proxy records one served with lessons, a conversation of
two turns, and a scripted policy that follows a lesson block."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from openclaw_cli.capture import CapturedExchange
from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.learn.lessons import LessonKeeper, load_active
from openclaw_cli.lesson_prompt import INSTRUCTION_HEADER, LessonBook, with_lessons
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store
from openclaw_cli.types import PolicyVersion, SampleResult, SamplingParams

LESSON = "Too wordy. Just give me the key fact."
SHORT = "Paris."
LONG = "The capital of France is Paris, a large and old city on the river Seine with many museums."
MEDIUM = "The capital of France is Paris, on the river Seine."


def served_exchange(tokenizer: Any, messages: list[dict[str, Any]], reply: str, **metadata: Any) -> CapturedExchange:
    served = with_lessons(messages, [item["text"] for item in metadata.get("lessons", [])])
    prompt = tokenizer.render(served)
    completion = tokenizer.encode(reply)
    return CapturedExchange(
        api="openai",
        headers={},
        request={"model": "openclaw-policy", "messages": messages},
        messages=messages,
        tools=None,
        model="openclaw-policy",
        prompt_tokens=prompt,
        completion_tokens=completion,
        logprobs=[-0.3] * len(completion),
        sampling_logprobs=[-0.3] * len(completion),
        version=0,
        finish_reason="stop",
        assistant_message={"role": "assistant", "content": reply},
        response={"id": "x"},
        started_at=1.0,
        first_token_at=1.0,
        finished_at=1.0,
        metadata={"owner": "local", **metadata},
    )


class ScriptedPolicy:
    """Answers SHORT when the prompt holds an instruction block, LONG otherwise; scores a reply -0.2 a token where
    it fits its context (short after an instruction, long without) and -1.5 where it does not, as the base model.
    ``learned``: the current policy (not the base) answers SHORT without the block too, as weights that took the
    lesson in would."""

    name = "scripted"

    def __init__(self, tokenizer: Any, leak: str | None = None) -> None:
        self._tokenizer = tokenizer
        self.learned = False
        self.leak = leak
        self.version = 0
        self.short_anyway = "(short)"  # a question with this mark is answered SHORT anyway, lesson or not
        self.samples = 0  # greedy replies asked for: what lesson trials cost
        # When set, only a lesson block holding this word gets a SHORT reply; any other block gets MEDIUM (a wording
        # the model follows only half-way, as SmolLM2 follows "tl;dr?").
        self.heeded: str | None = None

    def tokenizer(self) -> Any:
        return self._tokenizer

    def current_version(self) -> PolicyVersion:
        return PolicyVersion(self.version, f"v{self.version}")

    async def publish(self, name: str | None = None) -> PolicyVersion:
        return self.current_version()

    async def sample(self, prompt: list[int], params: SamplingParams, version: int | None = None) -> SampleResult:
        self.samples += 1
        text = self._tokenizer.decode(prompt)
        told = INSTRUCTION_HEADER in text
        reply = SHORT if told or (self.learned and version is None) or self.short_anyway in text else LONG
        if told and self.heeded is not None and self.heeded not in text.split(INSTRUCTION_HEADER, 1)[1]:
            reply = MEDIUM
        if told and self.leak and self.leak in text:
            reply = f"{self.leak}. {reply}"
        tokens = self._tokenizer.encode(reply)
        return SampleResult(
            tokens=tokens,
            logprobs=[-0.1] * len(tokens),
            finish_reason="stop",
            version=0,
            text=reply,
        )

    async def compute_logprobs(self, tokens: list[int], *, base: bool = False, start: int = 1) -> list[float | None]:
        context = self._tokenizer.decode(tokens[:start])
        reply = self._tokenizer.decode(tokens[start:])
        told = INSTRUCTION_HEADER in context
        short = len(reply.split()) < 8
        fits = told == short or (short and self.learned and not base)
        value = -0.2 if fits else -1.5
        return [None] * start + [value] * (len(tokens) - start)


def record_conversation(capture: SessionCapture, tokenizer: Any, question: str, reply: str, next_user: str) -> None:
    first = [{"role": "user", "content": question}]
    capture.record_sync(served_exchange(tokenizer, first, reply))
    second = [*first, {"role": "assistant", "content": reply}, {"role": "user", "content": next_user}]
    capture.record_sync(served_exchange(tokenizer, second, reply))


def keeper_with_policy(tmp_path: Path, tokenizer: Any) -> Iterator[tuple[Store, SessionCapture, ScriptedPolicy, Any]]:
    """A lesson keeper over a fresh store and a :class:`ScriptedPolicy` (``lessons.min_shaped = 2``), for a fixture
    to yield: (store, capture, policy, keeper)."""
    store = Store(tmp_path / "store.sqlite3")
    settings = Settings()
    settings.lessons.min_shaped = 2
    policy = ScriptedPolicy(tokenizer)
    keeper = LessonKeeper(store, policy, settings, LessonBook(load_active(store)))  # type: ignore[arg-type]
    yield store, SessionCapture(store, settings), policy, keeper
    store.close()


def record_served(capture: SessionCapture, tokenizer: Any, questions: list[str], lesson: Any, reply: str) -> None:
    """One first-turn exchange per question, each served with ``lesson`` (a stored lesson) and answered ``reply``."""
    served = [{"id": lesson.id, "text": lesson.text}]
    for question in questions:
        capture.record_sync(served_exchange(tokenizer, [{"role": "user", "content": question}], reply, lessons=served))
