"""The Anthropic side of the proxy, driven through the real ``anthropic`` SDK (and raw HTTP for byte-level checks)
against a live loopback server backed by the scripted FakeBackend."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from api_shapes import anthropic_sse_events as frames

from openclaw_cli.proxy.anthropic_convert import to_openai_messages, to_openai_tools
from openclaw_cli.settings import Settings
from openclaw_cli.testing.fake_backend import ScriptedReply
from openclaw_cli.testing.loopback_proxy import LoopbackProxy as Proxy

CALCULATOR = {
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "input_schema": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}
CALCULATOR_OPENAI = {
    "type": "function",
    "function": {
        "name": "calculator",
        "parameters": CALCULATOR["input_schema"],
        "description": "Evaluate an arithmetic expression.",
    },
}
CALL_TEXT = (
    'I will compute it.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3 * 4"}}\n</tool_call>'
)
THINK_CALL_TEXT = "<think>\nUse the tool.\n</think>\n\n" + CALL_TEXT
USER = [{"role": "user", "content": "What is 2 + 3 * 4?"}]


def post_stream(proxy: Proxy, body: dict[str, Any], path: str = "/v1/messages") -> bytes:
    with httpx.stream("POST", proxy.url + path, json={**body, "stream": True}, timeout=30) as resp:
        assert resp.status_code == 200, resp.read()
        assert resp.headers["content-type"].startswith("text/event-stream")
        return b"".join(resp.iter_bytes())


# -- non-streamed ----------------------------------------------------------------------------------------------


def test_plain_message_usage_and_capture(make_proxy, tiny_tokenizer):
    text = "The capital of France is Paris."
    proxy = make_proxy(text)
    reply = proxy.anthropic().messages.create(
        model="openclaw",
        max_tokens=64,
        system="Be brief.",
        messages=USER,
        metadata={"user_id": "user-42"},
        extra_body={"temperature": 0.3, "top_k": 20},  # this SDK version no longer has these as arguments
    )
    assert reply.type == "message" and reply.role == "assistant" and reply.id.startswith("msg_")
    assert [(b.type, b.text) for b in reply.content] == [("text", text)]
    assert (reply.stop_reason, reply.stop_sequence) == ("end_turn", None)
    rendered = [{"role": "system", "content": "Be brief."}, *USER]
    prompt = tiny_tokenizer.render(rendered)
    completion = [*tiny_tokenizer.encode(text), tiny_tokenizer.eos_token_ids[0]]
    assert (reply.usage.input_tokens, reply.usage.output_tokens) == (len(prompt), len(completion))

    (call,) = proxy.backend.calls
    assert call.prompt_tokens == prompt
    assert (call.params.temperature, call.params.top_k, call.params.max_tokens) == (0.3, 20, 64)

    (ex,) = proxy.sink.exchanges
    assert ex.api == "anthropic" and ex.finish_reason == "end_turn"
    assert ex.messages == rendered
    assert ex.request["metadata"] == {"user_id": "user-42"}
    assert ex.completion_tokens == completion
    assert tiny_tokenizer.decode(ex.completion_tokens) == reply.content[0].text
    assert ex.assistant_message == {"role": "assistant", "content": text}
    assert "x-api-key" not in ex.headers and "sk-ant-test-secret" not in json.dumps(ex.headers)
    assert ex.headers["anthropic-version"]  # the SDK's version header is kept (it is no secret)


def test_tool_use_round_trip(make_proxy, tiny_tokenizer):
    proxy = make_proxy(THINK_CALL_TEXT, "It is 14.")
    client = proxy.anthropic()
    first = client.messages.create(model="openclaw", max_tokens=200, messages=USER, tools=[CALCULATOR])
    assert first.stop_reason == "tool_use"
    thinking, text, tool_use = first.content
    assert (thinking.type, thinking.thinking) == ("thinking", "Use the tool.")
    assert (text.type, text.text) == ("text", "I will compute it.")
    assert tool_use.type == "tool_use" and tool_use.id.startswith("toolu_")
    assert (tool_use.name, tool_use.input) == ("calculator", {"expression": "2 + 3 * 4"})

    history = [
        *USER,
        {"role": "assistant", "content": [block.model_dump(exclude_none=True) for block in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "14"}]},
    ]
    second = client.messages.create(model="openclaw", max_tokens=200, messages=history, tools=[CALCULATOR])
    assert second.content[0].text == "It is 14."

    assistant = {
        "role": "assistant",
        "content": "I will compute it.",
        "tool_calls": [
            {
                "id": tool_use.id,
                "type": "function",
                "function": {"name": "calculator", "arguments": '{"expression": "2 + 3 * 4"}'},
            }
        ],
        "reasoning_content": "Use the tool.",
    }
    expected = [*USER, assistant, {"role": "tool", "tool_call_id": tool_use.id, "content": "14"}]
    assert proxy.backend.calls[1].prompt_tokens == tiny_tokenizer.render(expected, [CALCULATOR_OPENAI])
    first_ex, second_ex = proxy.sink.exchanges
    # What the proxy stored as the reply is exactly what the client's next request carries (prefix matching).
    assert first_ex.assistant_message == assistant == second_ex.messages[1]
    assert first_ex.tools == [CALCULATOR_OPENAI]
    assert tiny_tokenizer.decode(first_ex.completion_tokens) == THINK_CALL_TEXT


def test_stop_sequence_and_max_tokens(make_proxy, tiny_tokenizer):
    proxy = make_proxy("The capital of France is Paris. Thank you!", "Hello! How can I help you today?")
    client = proxy.anthropic()
    stopped = client.messages.create(model="openclaw", max_tokens=64, messages=USER, stop_sequences=["Paris"])
    assert (stopped.stop_reason, stopped.stop_sequence) == ("stop_sequence", "Paris")
    assert stopped.content[0].text == "The capital of France is "
    cut = client.messages.create(model="openclaw", max_tokens=2, messages=USER)
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 2
    assert cut.content[0].text == tiny_tokenizer.decode(tiny_tokenizer.encode("Hello! How can I help you today?")[:2])
    assert [ex.finish_reason for ex in proxy.sink.exchanges] == ["stop_sequence", "max_tokens"]


def test_count_tokens_matches_the_rendered_prompt(make_proxy, tiny_tokenizer):
    proxy = make_proxy()
    counted = proxy.anthropic().messages.count_tokens(
        model="openclaw", system="Be brief.", messages=USER, tools=[CALCULATOR]
    )
    expected = tiny_tokenizer.render([{"role": "system", "content": "Be brief."}, *USER], [CALCULATOR_OPENAI])
    assert counted.input_tokens == len(expected)
    assert proxy.backend.calls == [] and proxy.sink.exchanges == []


def test_claude_code_style_request_is_tolerated(make_proxy, tiny_tokenizer):
    """Bearer auth, beta headers and query, unknown fields, cache_control, a system message mid-list, and the
    model slots pointed at the proxy's names."""
    key = "claude-code-key"
    proxy = make_proxy("Done.", "A short title", settings=Settings(api_key=key))
    body = {
        "model": "openclaw",
        "max_tokens": 32000,
        "system": [
            {"type": "text", "text": "You are a coding agent."},
            {"type": "text", "text": "Follow the repo rules.", "cache_control": {"type": "ephemeral"}},
        ],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": "Fix the bug.", "cache_control": {"type": "ephemeral"}}],
            },
            {"role": "system", "content": "Reminder: be careful."},
            {"role": "user", "content": "Go."},
        ],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "context_management": {"edits": []},
        "output_config": {"effort": "high"},
        "tool_choice": {"type": "auto", "disable_parallel_tool_use": True},
        "tools": [CALCULATOR, {"type": "web_search_20250305", "name": "web_search"}],
    }
    headers = {
        "authorization": f"Bearer {key}",
        "anthropic-version": "2023-06-01",
        "anthropic-beta": "claude-code-20250219,interleaved-thinking-2025-05-14",
        "x-claude-code-session-id": "cc-session-1",
    }
    resp = httpx.post(proxy.url + "/v1/messages?beta=true", json=body, headers=headers, timeout=30)
    assert resp.status_code == 200, resp.text
    assert resp.json()["content"] == [{"type": "text", "text": "Done."}]
    expected = [
        {"role": "system", "content": "You are a coding agent.\n\nFollow the repo rules."},
        {"role": "user", "content": "Fix the bug."},
        {"role": "system", "content": "Reminder: be careful."},
        {"role": "user", "content": "Go."},
    ]
    assert proxy.backend.calls[0].prompt_tokens == tiny_tokenizer.render(expected, [CALCULATOR_OPENAI])
    # Budget: 32000 asked, capped by the server's output cap (a quarter of the 8192-token window, see output_cap).
    assert proxy.backend.calls[0].params.max_tokens == tiny_tokenizer.context_length // 4
    (ex,) = proxy.sink.exchanges
    assert ex.headers["x-claude-code-session-id"] == "cc-session-1"
    assert "authorization" not in ex.headers

    # The SDK with an auth token (Claude Code's ANTHROPIC_AUTH_TOKEN) and the haiku slot set to openclaw-side.
    client = proxy.anthropic(api_key=None, auth_token=key)
    assert "openclaw-side" in [m.id for m in client.models.list()]
    client.messages.create(model="openclaw-side", max_tokens=20, messages=USER)
    assert proxy.sink.exchanges[-1].metadata["turn_type"] == "side"


# -- streamed --------------------------------------------------------------------------------------------------


def test_stream_event_sequence_and_frames(make_proxy, tiny_tokenizer):
    proxy = make_proxy(THINK_CALL_TEXT)
    raw = post_stream(proxy, {"model": "openclaw", "max_tokens": 200, "messages": USER, "tools": [CALCULATOR]})
    events = frames(raw)
    kinds = [name for name, _ in events]
    collapsed = [k for i, k in enumerate(kinds) if i == 0 or k != "content_block_delta" or kinds[i - 1] != k]
    assert collapsed == [
        "message_start",
        "ping",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    start = events[0][1]["message"]
    assert start["content"] == [] and start["stop_reason"] is None and start["role"] == "assistant"
    prompt = tiny_tokenizer.render(USER, [CALCULATOR_OPENAI])
    assert start["usage"]["input_tokens"] == len(prompt)

    blocks: dict[int, dict[str, Any]] = {}
    for name, data in events:
        if name == "content_block_start":
            assert data["index"] == len(blocks)
            blocks[data["index"]] = {"start": data["content_block"], "text": ""}
        elif name == "content_block_delta":
            delta = data["delta"]
            piece = delta.get("thinking", delta.get("text", delta.get("partial_json")))
            blocks[data["index"]]["text"] += piece
            blocks[data["index"]]["delta_type"] = delta["type"]
    assert blocks[0]["start"] == {"type": "thinking", "thinking": "", "signature": ""}
    assert (blocks[0]["delta_type"], blocks[0]["text"]) == ("thinking_delta", "Use the tool.")
    assert blocks[1]["start"] == {"type": "text", "text": ""}
    assert (blocks[1]["delta_type"], blocks[1]["text"]) == ("text_delta", "I will compute it.")
    tool = blocks[2]["start"]
    assert tool["type"] == "tool_use" and tool["name"] == "calculator" and tool["input"] == {}
    assert blocks[2]["delta_type"] == "input_json_delta"
    assert json.loads(blocks[2]["text"]) == {"expression": "2 + 3 * 4"}

    message_delta = events[-2][1]
    completion = proxy.sink.exchanges[0].completion_tokens
    assert message_delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}
    assert message_delta["usage"]["output_tokens"] == len(completion)
    assert tiny_tokenizer.decode(completion) == THINK_CALL_TEXT
    assert proxy.sink.exchanges[0].assistant_message["tool_calls"][0]["id"] == tool["id"]


def test_sdk_stream_matches_non_stream(make_proxy):
    text = "Please answer briefly and politely. Thank you very much!"
    proxy = make_proxy(text, text)
    client = proxy.anthropic()
    plain = client.messages.create(model="openclaw", max_tokens=100, messages=USER)
    with client.messages.stream(model="openclaw", max_tokens=100, messages=USER) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == text and len(pieces) > 5
    assert final.content[0].text == plain.content[0].text == text
    assert final.usage.output_tokens == plain.usage.output_tokens
    assert final.stop_reason == plain.stop_reason == "end_turn"
    streamed = proxy.sink.exchanges[1]
    assert streamed.stream is True and streamed.response["content"] == [{"type": "text", "text": text}]


def test_sdk_stream_tool_use(make_proxy):
    proxy = make_proxy(CALL_TEXT)
    with proxy.anthropic().messages.stream(model="openclaw", max_tokens=100, messages=USER, tools=[CALCULATOR]) as s:
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["text", "tool_use"]
    assert final.content[1].input == {"expression": "2 + 3 * 4"}


async def test_async_stream_is_incremental(make_proxy):
    text = "Zebras quietly juggle violet kumquats near Oxford, 7 times."
    proxy = make_proxy(text, token_delay_s=0.04)
    arrivals: list[float] = []
    received = ""
    async with (
        proxy.async_anthropic() as client,
        client.messages.stream(model="openclaw", max_tokens=100, messages=USER) as stream,
    ):
        async for piece in stream.text_stream:
            arrivals.append(time.time())
            received += piece
    (call,) = proxy.backend.calls
    assert received == text
    assert arrivals[0] < call.finished_at - 0.3  # first text while most of the reply was still being generated
    assert len(arrivals) > 10


async def test_async_create(make_proxy):
    proxy = make_proxy("Hi!")
    async with proxy.async_anthropic() as client:
        reply = await client.messages.create(model="openclaw", max_tokens=10, messages=USER)
    assert reply.content[0].text == "Hi!"


def test_mid_stream_failure_is_an_error_event(make_proxy):
    proxy = make_proxy(ScriptedReply("This reply will break halfway through.", fail_after_tokens=3))
    events = frames(post_stream(proxy, {"model": "openclaw", "max_tokens": 100, "messages": USER}))
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-1] == "error" and "message_stop" not in names
    assert events[-1][1]["error"]["type"] == "api_error"
    assert "scripted failure" in events[-1][1]["error"]["message"]
    assert proxy.sink.exchanges == []


# -- conversion ------------------------------------------------------------------------------------------------


def test_conversion_of_every_block_type():
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}}
    messages = [
        {"role": "user", "content": [{"type": "text", "text": "Look:"}, image]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "Need the tool.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {"path": "/tmp"}},
                {"type": "tool_use", "id": "toolu_2", "name": "cat", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "a.txt"},
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_2",
                    "is_error": True,
                    "content": [{"type": "text", "text": "no such file"}],
                },
                {"type": "text", "text": "Now what?"},
                {"type": "server_tool_use", "id": "srv_1", "name": "web_search", "input": {}},
            ],
        },
    ]
    assert to_openai_messages([{"type": "text", "text": "Sys."}], messages) == [
        {"role": "system", "content": "Sys."},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "Look:"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}},
            ],
        },
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {"id": "toolu_1", "type": "function", "function": {"name": "ls", "arguments": '{"path": "/tmp"}'}},
                {"id": "toolu_2", "type": "function", "function": {"name": "cat", "arguments": "{}"}},
            ],
            "reasoning_content": "Need the tool.",
        },
        {"role": "tool", "tool_call_id": "toolu_1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "toolu_2", "content": "[error] no such file"},
        {"role": "user", "content": "Now what?"},
    ]
    assert to_openai_tools([CALCULATOR, {"type": "bash_20250124", "name": "bash"}]) == [CALCULATOR_OPENAI]


def test_pings_while_the_backend_is_quiet(make_proxy):
    proxy = make_proxy("Slow.", "Slow.", token_delay_s=0.25, settings=Settings(proxy={"keepalive_s": 0.05}))
    names = [name for name, _ in frames(post_stream(proxy, {"model": "openclaw", "max_tokens": 10, "messages": USER}))]
    assert names.count("ping") >= 4 and names[-1] == "message_stop"
    with proxy.anthropic().messages.stream(model="openclaw", max_tokens=10, messages=USER) as stream:
        assert "".join(stream.text_stream) == "Slow."
