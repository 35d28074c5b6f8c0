"""The judge through LiteLLM (judge.client = "litellm", or a model string alone), run for real: against the project's
own proxy serving the tiny model, once as an OpenAI-compatible endpoint (``openai/<model>``) and once as an
Anthropic-compatible one (``anthropic/<model>``). What LiteLLM returns must equal what the openai SDK gets from the
same endpoint; the judge loop reaches verdicts in vote and logprob modes; a bad key, an unreachable provider or one
that never answers leaves the turns unjudged with one log line and nothing on stdout."""

from __future__ import annotations

import asyncio
import logging
import re
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from judge_replies import seed_session
from runtime_helpers import local_proxy_server

from openclaw_cli.learn.judge import (
    JudgeLoop,
    JudgeNoLogprobs,
    LiteLLMJudgeClient,
    OpenAIJudgeClient,
    make_judge_client,
)
from openclaw_cli.learn.judge_verdict import VERDICT_WORDS
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store

# No skip when litellm is missing: `make test` installs it (the clients extra), and a judge path that silently
# stopped being tested is what this file is for.
pytestmark = pytest.mark.timeout(180)

KEY = "sk-judge-test-key"
MODEL = "openclaw-policy"
MESSAGES = [
    {"role": "system", "content": "You grade replies."},
    {"role": "user", "content": "Was the reply good? Answer good or bad."},
]


@pytest.fixture(scope="module")
def endpoint(tiny_model_dir: Path) -> Iterator[str]:
    """The proxy on the tiny model, on 127.0.0.1, requiring KEY: its base URL."""
    settings = Settings(model=str(tiny_model_dir), api_key=KEY, local={"device": "cpu", "seed": 0})
    with local_proxy_server(settings) as (_, _, server):
        yield server.base_url


async def test_litellm_openai_provider_gets_what_the_openai_sdk_gets(endpoint: str) -> None:
    direct = OpenAIJudgeClient(MODEL, f"{endpoint}/v1", KEY)
    through = make_judge_client(
        Settings(judge={"client": "litellm", "model": f"openai/{MODEL}", "base_url": f"{endpoint}/v1", "api_key": KEY})
    )
    assert isinstance(through, LiteLLMJudgeClient) and through.name == f"litellm:openai/{MODEL}@{endpoint}/v1"
    want = await direct.complete(MESSAGES, temperature=0.0, max_tokens=12)
    assert want and await through.complete(MESSAGES, temperature=0.0, max_tokens=12) == want
    words = list(VERDICT_WORDS)
    expected = await direct.verdict_logprobs(MESSAGES, words)
    got = await through.verdict_logprobs(MESSAGES, words)
    assert got.keys() == expected.keys() and got == pytest.approx(expected, abs=1e-6)


async def test_litellm_anthropic_provider_speaks_messages_and_has_no_logprobs(endpoint: str) -> None:
    direct = OpenAIJudgeClient(MODEL, f"{endpoint}/v1", KEY)
    through = LiteLLMJudgeClient(f"anthropic/{MODEL}", api_key=KEY, base_url=endpoint)
    want = await direct.complete(MESSAGES, temperature=0.0, max_tokens=12)
    assert await through.complete(MESSAGES, temperature=0.0, max_tokens=12) == want  # same prompt, same tokens
    with pytest.raises(JudgeNoLogprobs, match=re.escape("judge.mode = 'vote'")):
        await through.verdict_logprobs(MESSAGES, list(VERDICT_WORDS))


@pytest.mark.parametrize(
    ("model", "base", "mode"),
    [("openai", "/v1", "vote"), ("openai", "/v1", "logprob"), ("anthropic", "", "vote"), ("anthropic", "", "auto")],
)
async def test_the_judge_loop_reaches_verdicts_through_litellm(
    endpoint: str, tmp_path: Path, model: str, base: str, mode: str
) -> None:
    settings = Settings(
        method="rl",
        judge={
            "client": "litellm",
            "model": f"{model}/{MODEL}",
            "base_url": endpoint + base,
            "api_key": KEY,
            "mode": mode,
            "votes": 2,
        },
    )
    with Store(tmp_path / "s.sqlite3") as store:
        ids = seed_session(store, ["thanks, that works", "no, I meant the other file"])
        loop = JudgeLoop(store, make_judge_client(settings), settings)
        assert await loop.run_once() == 2, loop.stats
        for turn_id in ids:
            verdict = store.result_of("judge", turn_id)
            assert verdict["judge"] == f"litellm:{model}/{MODEL}@{endpoint}{base}"
            assert verdict["mode"] == ("vote" if mode == "auto" else mode)  # auto: vote for a LiteLLM judge
            assert verdict["score"] in (-1, 0, 1) and verdict["seconds"] > 0
            if verdict["mode"] == "vote":
                # two replies came back (the tiny model may stop at once: an empty reply is an invalid vote)
                assert len(verdict["votes"]) == 2 and len(verdict["raw"]["prm"]) == 2
            else:
                assert set(verdict["probs"]) <= set(VERDICT_WORDS) and "log_odds" in verdict


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers (a provider that hangs)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield server.getsockname()[1]
    stop.set()
    thread.join(2)
    for sock in held:
        sock.close()
    server.close()


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("failure", ["bad key openai", "bad key anthropic", "unreachable", "hangs"])
async def test_a_failing_provider_gives_one_log_line_no_verdict_and_no_stdout(
    endpoint: str,
    silent_port: int,
    tmp_path: Path,
    failure: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    judge: dict[str, Any] = {"client": "litellm", "api_key": KEY, "votes": 3}
    if failure == "bad key openai":
        judge |= {"model": f"openai/{MODEL}", "base_url": f"{endpoint}/v1", "api_key": "sk-wrong"}
    elif failure == "bad key anthropic":
        judge |= {"model": f"anthropic/{MODEL}", "base_url": endpoint, "api_key": "sk-wrong"}
    elif failure == "unreachable":
        judge |= {"model": f"openai/{MODEL}", "base_url": f"http://127.0.0.1:{closed_port()}/v1"}
    else:
        judge |= {"model": f"openai/{MODEL}", "base_url": f"http://127.0.0.1:{silent_port}/v1"}
    settings = Settings(method="rl", judge=judge)
    caplog.set_level(logging.INFO)  # what `openclaw launch --no-ui` logs

    async def no_sleep(_: float) -> None:
        return None

    with Store(tmp_path / "s.sqlite3") as store:
        ids = seed_session(store, ["thanks", "no, shorter", "ok"])
        loop = JudgeLoop(
            store, make_judge_client(settings), settings, retry_attempts=2, call_timeout_s=1.0, sleep=no_sleep
        )
        assert await asyncio.wait_for(loop.run_once(), 60) == 0
        assert [store.result_of("judge", i) for i in ids] == [None, None, None]
        assert loop.stats.failed == 3
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    message = warnings[0].getMessage()
    assert (
        warnings[0].name == "openclaw_cli.learn.judge" and "is unavailable" in message and "serving goes on" in message
    )
    assert "sk-wrong" not in message and KEY not in message
    expected = {
        "bad key openai": "AuthenticationError",
        "bad key anthropic": "AuthenticationError",
        "unreachable": "Connection error",
        "hangs": "TimeoutError",
    }[failure]
    assert expected in message, message
    assert capsys.readouterr().out == ""  # LiteLLM's "Give Feedback / Get Help" banner stays off stdout
