"""The runnable examples in ``examples/``, each run as a real subprocess against a live loopback proxy.

The policy is the scripted :class:`FakeBackend` on the tiny tokenizer: the examples test the client side (SDK
calls, session headers, the tool_use / tool_result round trips), and a tiny random model would almost never emit a
valid tool call, so the agent's tool calls are scripted in the model's own ``<tool_call>`` markup, which the proxy
turns into real Anthropic ``tool_use`` blocks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.proxy import BackgroundServer, create_app
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store
from openclaw_cli.testing.fake_backend import FakeBackend, MemorySink

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
KEY = "sk-examples-test"


def run_example(script: str, *args: str, api_key: str = KEY) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "OPENCLAW_"))}
    env["OPENCLAW_API_KEY"] = api_key  # the examples' documented fallback for --api-key
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def tool_call(name: str, arguments: dict[str, Any], preface: str = "") -> str:
    return f"{preface}\n<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(api_key=KEY, store={"path": tmp_path / "store.sqlite3"})


# -- chat_openai.py --------------------------------------------------------------------------------------------


@pytest.fixture
def chat_proxy(tiny_tokenizer, settings: Settings) -> Iterator[tuple[FakeBackend, Store, BackgroundServer]]:
    backend = FakeBackend(tiny_tokenizer, ["Paris is the capital of France.", "Paris."])
    with Store(settings.store.path) as store:
        app = create_app(backend, SessionCapture(store, settings), settings)
        with BackgroundServer(app) as server:
            yield backend, store, server


def test_chat_example_runs_two_turns_in_one_session(chat_proxy):
    backend, store, server = chat_proxy
    result = run_example(
        "chat_openai.py",
        "--base-url",
        server.base_url,  # the root URL: the example adds /v1 for the SDK
        "--session-id",
        "chat-test-1",
        "-m",
        "What is the capital of France?",
        "-m",
        "Shorter please.",
        "--end-session",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["assistant> Paris is the capital of France.", "assistant> Paris."]

    turns = list(store.iter_turns(session_ids=["chat-test-1"]))
    assert [(t.turn_index, t.turn_type) for t in turns] == [(0, "main"), (1, "main")]
    # The second request carried the whole history, so the first turn got the user's correction as its next state.
    assert turns[0].next_state == [{"role": "user", "content": "Shorter please."}]
    assert turns[1].messages[-3:] == [
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris is the capital of France."},
        {"role": "user", "content": "Shorter please."},
    ]
    # --end-session closed the session, so the last turn is ready for the judge without waiting for the idle timeout.
    assert [t.status for t in turns] == ["ready", "ready"]
    assert len(backend.calls) == 2


def test_chat_example_streams_from_stdin_and_accepts_the_v1_url(chat_proxy):
    _, store, server = chat_proxy
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_", "OPENCLAW_"))}
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "chat_openai.py"), "--base-url", server.base_url + "/v1", "--stream"],
        input="What is the capital of France?\n",
        capture_output=True,
        text=True,
        timeout=120,
        env={**env, "OPENCLAW_API_KEY": KEY},
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "assistant> Paris is the capital of France.\n"
    (turn,) = store.iter_turns()
    assert turn.stream is True and turn.session_id.startswith("chat-")


def test_chat_example_exits_1_on_a_refused_key(chat_proxy):
    _, _, server = chat_proxy
    result = run_example("chat_openai.py", "--base-url", server.base_url, "-m", "hi", api_key="wrong-key")
    assert result.returncode == 1
    assert "error:" in result.stderr and "invalid API key" in result.stderr


# -- agent_anthropic_tools.py -------------------------------------------------------------------------------------


def agent_proxy(tiny_tokenizer, settings: Settings, replies: list[str]) -> tuple[FakeBackend, MemorySink, Any]:
    backend = FakeBackend(tiny_tokenizer, replies, default_reply="(unscripted)")
    sink = MemorySink()
    return backend, sink, BackgroundServer(create_app(backend, sink, settings))


def test_agent_example_runs_tools_until_end_turn(tiny_tokenizer, settings):
    replies = [
        tool_call("calculator", {"expression": "2 + 3 * 4"}, "First the arithmetic."),
        tool_call("convert_units", {"value": 14, "from_unit": "km", "to_unit": "mi"}),
        "14 km is about 8.6992 miles.",
    ]
    _, sink, server = agent_proxy(tiny_tokenizer, settings, replies)
    with server:
        result = run_example("agent_anthropic_tools.py", "--base-url", server.base_url, "--session-id", "agent-t1")
    assert result.returncode == 0, result.stderr
    # 2 + 3 * 4 = 14; 14 km = 14000 m / 1609.344 m per mile = 8.69919... -> 6 significant digits.
    assert 'tool[1]> calculator({"expression": "2 + 3 * 4"}) -> 14' in result.stdout
    assert 'tool[2]> convert_units({"value": 14, "from_unit": "km", "to_unit": "mi"}) -> 8.6992' in result.stdout
    assert "assistant[3]> 14 km is about 8.6992 miles." in result.stdout
    assert "done in 3 step(s)" in result.stderr

    assert len(sink.exchanges) == 3
    assert {exchange.headers["x-session-id"] for exchange in sink.exchanges} == {"agent-t1"}
    # Each follow-up request answered the previous tool_use with a tool_result holding the tool's output.
    second, third = sink.exchanges[1].request["messages"], sink.exchanges[2].request["messages"]
    assert [m["role"] for m in third] == ["user", "assistant", "user", "assistant", "user"]
    (first_result,) = second[-1]["content"]
    (first_use,) = [block for block in second[-2]["content"] if block["type"] == "tool_use"]
    assert first_result["type"] == "tool_result" and first_result["tool_use_id"] == first_use["id"]
    assert (first_result["content"], first_result["is_error"]) == ("14", False)
    assert third[-1]["content"][0]["content"] == "8.6992"
    assert sink.exchanges[0].request["tools"][0]["name"] == "calculator"


def test_agent_example_reports_tool_errors_to_the_model(tiny_tokenizer, settings):
    replies = [tool_call("calculator", {"expression": "__import__('os')"}), "I cannot compute that."]
    _, sink, server = agent_proxy(tiny_tokenizer, settings, replies)
    with server:
        result = run_example("agent_anthropic_tools.py", "--base-url", server.base_url + "/v1", "Break it")
    assert result.returncode == 0, result.stderr
    (tool_result,) = sink.exchanges[1].request["messages"][-1]["content"]
    assert tool_result["is_error"] is True and "unsupported syntax" in tool_result["content"]


def test_agent_example_stops_at_the_step_cap(tiny_tokenizer, settings):
    replies = [tool_call("calculator", {"expression": f"{n} + 1"}) for n in range(5)]
    _, sink, server = agent_proxy(tiny_tokenizer, settings, replies)
    with server:
        result = run_example("agent_anthropic_tools.py", "--base-url", server.base_url, "--max-steps", "3")
    assert result.returncode == 1
    assert "no final answer within --max-steps 3" in result.stderr
    assert len(sink.exchanges) == 3
