"""The judge: vote and hint parsing, majority, prompts, the judge loop over a real store, and the clients."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from judge_replies import completion_response, seed_session

from openclaw_cli.learn import judge as judge_module
from openclaw_cli.learn.judge import (
    JudgeConfigError,
    JudgeLoop,
    LiteLLMJudgeClient,
    OpenAIJudgeClient,
    PolicyJudgeClient,
    make_judge_client,
)
from openclaw_cli.learn.judge_prompts import (
    HINT_END,
    HINT_START,
    HINT_SYSTEM,
    PRM_SYSTEM,
    PROMPT_VERSION,
    choose_hint,
    clip_middle,
    dedupe_hints,
    majority,
    parse_hint,
    parse_vote,
    prm_messages,
    prompt_hashes,
)
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store
from openclaw_cli.types import SampleResult, SamplingParams


# --- parsing ---------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("reply", "vote"),
    [
        ("The user moves on. \\boxed{1}", 1),
        ("\\boxed{-1}", -1),
        ("Nothing clear. \\boxed{0}", 0),
        ("First I thought \\boxed{-1}, but the test passed: \\boxed{ +1 }", 1),  # last box wins, spaces, +1
        ("I must answer \\boxed{1}, \\boxed{-1} or \\boxed{0}. Verdict: \\boxed{-1}", -1),
        ("\\boxed{\\text{-1}}", -1),  # nested braces
        ("\\boxed{{1}}", 1),
        ("$\\boxed{-1}$", -1),
        ("\\boxed{\u22121}", -1),  # unicode minus sign
        ("\\boxed{1} ... on reflection \\boxed{2}", None),  # the last box is the vote even when it is junk
        ("\\boxed{yes}", None),
        ("\\boxed{1.0}", None),
        ("progress", None),
        ("\\boxed{1} then cut off mid-answer \\boxed{-", None),  # unterminated last box: no vote
        ("", None),
    ],
)
def test_parse_vote(reply: str, vote: int | None) -> None:
    assert parse_vote(reply) == vote


@pytest.mark.parametrize(
    ("votes", "score"),
    [
        ([1, 1, -1], 1),
        ([-1, -1, 1], -1),
        ([1, -1, 0], 0),  # three-way tie
        ([1, -1], 0),
        ([1, 1, 0, 0, -1], 0),  # tie at the top
        ([0, 0, 1], 0),  # majority says ambiguous
        ([-1, None, None], -1),  # invalid votes are ignored, not counted as 0
        ([None, None, None], 0),
        ([], 0),
    ],
)
def test_majority(votes: list[int | None], score: int) -> None:
    assert majority(votes) == score


def test_parse_hint_takes_text_between_markers_only_when_accepted() -> None:
    hint_block = '  "Ask which   file the user means\nbefore editing."  '
    reply = f"Reasoning...\n{HINT_START}\n{hint_block}\n{HINT_END}\n\\boxed{{1}}"
    parsed = parse_hint(reply)
    assert parsed.accepted == 1
    assert parsed.hint == "Ask which file the user means before editing."
    rejected = parse_hint(f"{HINT_START}Ask which file the user means.{HINT_END} \\boxed{{-1}}")
    assert (rejected.accepted, rejected.hint) == (-1, None)
    assert parse_hint("no box at all").accepted is None


def test_parse_hint_length_and_markers() -> None:
    def hint_of(text: str) -> str | None:
        return parse_hint(f"{HINT_START}{text}{HINT_END}\\boxed{{1}}").hint

    assert hint_of("0123456789") is None  # 10 characters: dropped
    assert hint_of("0123456789A") == "0123456789A"  # 11: kept
    assert hint_of("x" * 5000) is None  # a ramble, not a hint
    assert parse_hint(f"{HINT_START}Use the metric system always.\\boxed{{1}}").hint is None  # never closed
    # Quoting the markers in the reasoning does not confuse it: the last start marker opens the hint.
    reply = f"I put it between {HINT_START} and {HINT_END}. {HINT_START}Reply in French.{HINT_END} \\boxed{{1}}"
    assert parse_hint(reply).hint == "Reply in French."


def test_hints_are_deduplicated_and_the_most_frequent_is_chosen() -> None:
    hints = ["Use UTC times.", "Always answer in French, the user's language.", "use utc   TIMES"]
    assert dedupe_hints(hints) == ["Use UTC times.", "Always answer in French, the user's language."]
    assert choose_hint(hints) == "Use UTC times."  # said twice beats longer
    assert choose_hint(["Short hint here.", "A longer and more concrete hint."]) == "A longer and more concrete hint."
    assert choose_hint(["Same length AAA.", "Same length BBB."]) == "Same length AAA."  # then the earliest
    assert choose_hint([]) is None


def test_prm_prompt_shows_reply_tool_calls_and_next_state() -> None:
    history = [{"role": "system", "content": "sys"}, {"role": "user", "content": "List the files"}]
    reply = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "."}'}}],
    }
    next_state = [{"role": "tool", "tool_call_id": "c1", "content": "error: permission denied"}]
    system, user = prm_messages(history, reply, next_state, "tool")
    assert system == {"role": "system", "content": PRM_SYSTEM}
    body = user["content"]
    assert "List the files" in body
    assert '[tool call] ls({"path": "."})' in body
    assert "## Next state (role: tool)\n[tool] error: permission denied" in body


def test_clip_middle_keeps_head_and_tail() -> None:
    assert clip_middle("abc", 3) == "abc"
    assert clip_middle("a" * 10 + "b" * 10, 9) == "aaaaaa\n[... 11 characters omitted ...]\nbbb"


# --- store helpers -------------------------------------------------------------------------------------------------
THANKS = "thanks, that works"
CORRECTION = "no, I meant the other file"
HINT = "Edit the file the user named instead of the first match you find."


_seed = seed_session


class ScriptedJudge:
    """TEST DOUBLE for a judge model: answers from the next state it is shown, never runs a model.

    PRM prompt: +1 for a thank-you, -1 for a correction, 0 otherwise. Hint prompt: a hint for a correction, -1
    otherwise. ``fail_first`` calls raise first; ``delay_s`` makes each call take time (to observe concurrency).
    """

    name = "scripted"

    def __init__(self, *, fail_first: int = 0, always_fail: bool = False, delay_s: float = 0.0) -> None:
        self.calls: list[dict[str, Any]] = []
        self.fail_first = fail_first
        self.always_fail = always_fail
        self.delay_s = delay_s
        self.in_flight = 0
        self.max_in_flight = 0

    async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str:
        self.calls.append({"messages": messages, "temperature": temperature, "max_tokens": max_tokens})
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            if self.delay_s:
                await asyncio.sleep(self.delay_s)
            if self.always_fail or len(self.calls) <= self.fail_first:
                raise ConnectionError("judge endpoint down")
        finally:
            self.in_flight -= 1
        state = messages[1]["content"].split("## Next state", 1)[1]
        if messages[0]["content"] == HINT_SYSTEM:
            return f"{HINT_START}{HINT}{HINT_END}\n\\boxed{{1}}" if CORRECTION in state else "Fine. \\boxed{-1}"
        if THANKS in state:
            return "The user moves on. \\boxed{1}"
        if CORRECTION in state:
            return "The user corrects it. \\boxed{-1}"
        return "\\boxed{0}"


def _settings(method: str = "combined", votes: int = 3, max_concurrency: int = 4) -> Settings:
    return Settings(method=method, judge={"votes": votes, "max_concurrency": max_concurrency, "temperature": 0.6})


def _loop(store: Store, client: Any, settings: Settings, **kwargs: Any) -> JudgeLoop:
    async def no_sleep(_: float) -> None:
        return None

    kwargs.setdefault("sleep", no_sleep)
    return JudgeLoop(store, client, settings, **kwargs)


# --- the loop ------------------------------------------------------------------------------------------------------
async def test_loop_judges_each_turn_once_with_votes_and_hints(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        thanks_id, correction_id, last_id = _seed(store, [THANKS, CORRECTION, None])
        judge = ScriptedJudge()
        loop = _loop(store, judge, _settings("combined", votes=3))
        assert await loop.run_once() == 3
        # 3 PRM + 3 hint calls for each turn with a next state; none for the session's last turn.
        assert len(judge.calls) == 12
        assert {c["temperature"] for c in judge.calls} == {0.6}

        good = store.result_of("judge", thanks_id)
        assert good["score"] == 1 and good["votes"] == [1, 1, 1]
        # No judge hint for approval, and approval is not hindsight: the user's reply is no hint either (the default
        # judge.next_state_hints = "corrections" hints only replies the judge reads as a correction).
        assert good["hint_votes"] == [-1, -1, -1] and good["hint_source"] is None
        assert good["hints"] == [] and good["hint"] is None
        assert good["prompt_version"] == PROMPT_VERSION and good["prompt_hash"] == prompt_hashes()
        assert good["judge"] == "scripted" and good["next_state_role"] == "user"

        bad = store.result_of("judge", correction_id)
        assert bad["score"] == -1 and bad["votes"] == [-1, -1, -1]
        assert bad["hints"] == [HINT] and bad["hint"] == HINT  # three identical hints kept once

        last = store.result_of("judge", last_id)
        assert last["score"] == 0 and last["reason"] == "no_next_state" and last["votes"] == []

        assert [store.get_turn(i).reward for i in (thanks_id, correction_id, last_id)] == [1.0, -1.0, 0.0]

        # Idempotent: nothing left to judge, even once every lease would have run out.
        assert await loop.run_once() == 0
        assert len(judge.calls) == 12
        assert store.claim_ready("judge", 10, 1.0, now=time.time() + 10_000) == []


async def test_rl_method_asks_no_hints(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        (turn_id,) = _seed(store, [CORRECTION])
        judge = ScriptedJudge()
        assert await _loop(store, judge, _settings("rl", votes=1)).run_once() == 1
        assert len(judge.calls) == 1 and judge.calls[0]["messages"][0]["content"] == PRM_SYSTEM
        result = store.result_of("judge", turn_id)
        assert (result["score"], result["hints"], result["hint"], result["hint_votes"]) == (-1, [], None, [])


async def test_retry_with_backoff_then_success(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        (turn_id,) = _seed(store, [THANKS])
        judge = ScriptedJudge(fail_first=2)
        delays: list[float] = []

        async def record_sleep(seconds: float) -> None:
            delays.append(seconds)

        loop = JudgeLoop(store, judge, _settings("rl", votes=1), retry_attempts=4, retry_base_s=1.0, sleep=record_sleep)
        assert await loop.run_once() == 1
        assert len(judge.calls) == 3
        # Exponential with jitter in [0.5, 1] x base * 2**attempt.
        assert len(delays) == 2 and 0.5 <= delays[0] <= 1.0 and 1.0 <= delays[1] <= 2.0
        assert store.result_of("judge", turn_id)["score"] == 1
        assert loop.stats.call_errors == 2 and loop.stats.failed == 0


async def test_a_judge_that_stays_down_leaves_turns_unjudged_and_reclaimable(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        ids = _seed(store, [THANKS, CORRECTION])
        down = ScriptedJudge(always_fail=True)
        loop = _loop(store, down, _settings("combined", votes=3), retry_attempts=3, lease_s=0.2)
        assert await loop.run_once() == 0
        assert loop.stats.failed == 2 and "judge endpoint down" in (loop.stats.last_error or "")
        for turn_id in ids:
            assert store.result_of("judge", turn_id) is None
            assert store.get_turn(turn_id).reward is None
        assert store.claim_ready("trainer", 10, 1.0, after="judge") == []  # the trainer sees nothing
        # Still leased right after the failure (no new judge call), claimable again once the lease runs out.
        calls_before = len(down.calls)
        assert await loop.run_once() == 0
        assert len(down.calls) == calls_before
        await asyncio.sleep(0.3)
        recovered = _loop(store, ScriptedJudge(), _settings("combined", votes=3))
        assert await recovered.run_once() == 2
        assert [store.result_of("judge", i)["score"] for i in ids] == [1, -1]


async def test_judge_calls_respect_the_concurrency_limit(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        _seed(store, [THANKS, CORRECTION, THANKS])
        judge = ScriptedJudge(delay_s=0.02)
        assert await _loop(store, judge, _settings("combined", votes=3, max_concurrency=2)).run_once() == 3
        assert len(judge.calls) == 18
        assert judge.max_in_flight == 2


async def test_run_judges_until_stopped(tmp_path: Path) -> None:
    with Store(tmp_path / "s.sqlite3") as store:
        (turn_id,) = _seed(store, [THANKS])
        stop = asyncio.Event()
        task = asyncio.create_task(_loop(store, ScriptedJudge(), _settings("rl", votes=1), poll_s=0.01).run(stop))
        for _ in range(200):
            if store.result_of("judge", turn_id) is not None:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, timeout=2.0)
        assert store.result_of("judge", turn_id)["score"] == 1


# --- clients -------------------------------------------------------------------------------------------------------
async def test_openai_client_speaks_chat_completions() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return completion_response("judge-m", "\\boxed{1}")

    http = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    client = OpenAIJudgeClient("judge-m", "http://judge.test/v1", "sk-test", http_client=http)
    messages = [{"role": "user", "content": "grade this"}]
    assert await client.complete(messages, temperature=0.6, max_tokens=64) == "\\boxed{1}"
    (request,) = seen
    assert request.url == "http://judge.test/v1/chat/completions"
    assert request.headers["authorization"] == "Bearer sk-test"
    body = json.loads(request.content)
    assert body == {"model": "judge-m", "messages": messages, "temperature": 0.6, "max_tokens": 64}
    await http.aclose()


def test_make_judge_client_picks_by_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    openai_settings = Settings(judge={"model": "judge-m", "base_url": "http://127.0.0.1:9/v1"})
    assert isinstance(make_judge_client(openai_settings, None), OpenAIJudgeClient)

    with pytest.raises(JudgeConfigError, match=r"judge\.model is not"):
        make_judge_client(Settings(judge={"base_url": "http://127.0.0.1:9/v1"}), None)

    real_find_spec = judge_module.importlib.util.find_spec
    monkeypatch.setattr(
        judge_module.importlib.util, "find_spec", lambda name: None if name == "litellm" else real_find_spec(name)
    )
    with pytest.raises(JudgeConfigError, match="pip install litellm"):
        make_judge_client(Settings(judge={"model": "anthropic/claude-x"}), None)

    policy = make_judge_client(Settings(), backend=object())  # type: ignore[arg-type]
    assert isinstance(policy, PolicyJudgeClient) and policy.version == 0
    with pytest.raises(JudgeConfigError, match="no judge model"):
        make_judge_client(Settings(), None)


def test_litellm_client_is_built_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judge_module.importlib.util, "find_spec", lambda name: object())
    client = make_judge_client(Settings(judge={"model": "anthropic/claude-x"}), None)
    assert isinstance(client, LiteLLMJudgeClient) and client.name == "litellm:anthropic/claude-x"


class _RecordingPolicy:
    """TEST DOUBLE for the policy backend: records the prompt ids and version it is asked to sample."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self.requests: list[tuple[list[int], SamplingParams, int | None]] = []

    def tokenizer(self) -> Any:
        return self._tokenizer

    async def sample(self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None) -> Any:
        self.requests.append((prompt_tokens, params, version))
        return SampleResult(tokens=[1], logprobs=[-0.1], finish_reason="stop", version=0, text="ok \\boxed{-1}")


async def test_policy_client_renders_the_chat_and_samples_the_base_version(tiny_tokenizer: Any) -> None:
    backend = _RecordingPolicy(tiny_tokenizer)
    client = make_judge_client(Settings(), backend)  # type: ignore[arg-type]
    messages = prm_messages([{"role": "user", "content": "hi"}], {"role": "assistant", "content": "yo"}, [], None)
    assert await client.complete(messages, temperature=0.6, max_tokens=32) == "ok \\boxed{-1}"
    ((prompt, params, version),) = backend.requests
    assert prompt == tiny_tokenizer.render(messages, add_generation_prompt=True)
    assert version == 0
    assert (params.temperature, params.max_tokens) == (0.6, 32)


async def test_the_judge_waits_while_the_trainer_beside_it_has_max_ahead_turns_to_take(tmp_path: Path) -> None:
    """Verdicts the trainer cannot take in time only cost CPU: the judge stays max_ahead (at least a training
    batch) ahead of the trainer, newest turns first, and judges again as the trainer takes turns."""
    with Store(tmp_path / "s.sqlite3") as store:
        ids = _seed(store, [CORRECTION] * 6)

        async def trainer_waiting() -> int:
            return store.backlog("trainer", after="judge")[0]

        settings = Settings(method="rl", judge={"votes": 1, "max_ahead": 2}, train={"batch_size": 1})
        loop = _loop(store, ScriptedJudge(), settings, trainer_waiting=trainer_waiting)
        assert await loop.run_once() == 2
        assert await loop.run_once() == 0 and loop.stats.paced_rounds == 1
        store.complete("trainer", ids[-1], "{}")
        assert await loop.run_once() == 1
        assert [i for i in ids if store.result_of("judge", i) is not None] == ids[-3:]

        # Never fewer than a training batch (the trainer waits for a full one), and 0 turns pacing off.
        settings.train.batch_size = 2
        settings.judge.max_ahead = 1
        assert await loop.run_once() == 0  # 2 waiting: a full batch for the trainer
        settings.judge.max_ahead = 0
        assert await loop.run_once() == 3
