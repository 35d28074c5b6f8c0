"""The OpenAI side of the proxy, driven through the real ``openai`` SDK against a live loopback server.

The backend is the scripted FakeBackend (real tokenizer, scripted token ids, per-token delays) unless a test says
otherwise; one test serves the real tiny-model LocalBackend when it is importable. Also here: unit tests of the
incremental stream splitter, checked against the tokenizer's own ``parse_assistant``.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openclaw_cli.proxy import BackgroundServer
from openclaw_cli.proxy.streaming import AssistantStreamSplitter, ContentPiece, ReasoningPiece, ToolCallPiece
from openclaw_cli.settings import Settings
from openclaw_cli.testing.fake_backend import MemorySink, fake_logprob
from openclaw_cli.tokenizer import parse_assistant_text

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string"}},
            "required": ["expression"],
        },
    },
}
CALL_TEXT = (
    'I will compute it.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3 * 4"}}\n</tool_call>'
)
USER = [{"role": "user", "content": "What is 2 + 3 * 4?"}]


# -- non-streamed ----------------------------------------------------------------------------------------------


def test_plain_reply_usage_and_capture(make_proxy, tiny_tokenizer):
    text = "The capital of France is Paris."
    proxy = make_proxy(text)
    reply = proxy.openai().chat.completions.create(model="openclaw", messages=USER, temperature=0.5, seed=7)

    assert reply.choices[0].message.content == text
    assert reply.choices[0].finish_reason == "stop"
    assert reply.model == "openclaw"
    prompt = tiny_tokenizer.render(USER)
    completion = [*tiny_tokenizer.encode(text), tiny_tokenizer.eos_token_ids[0]]
    assert reply.usage.prompt_tokens == len(prompt)
    assert reply.usage.completion_tokens == len(completion)
    assert reply.usage.total_tokens == len(prompt) + len(completion)

    (call,) = proxy.backend.calls
    assert call.prompt_tokens == prompt
    assert (call.params.temperature, call.params.seed) == (0.5, 7)

    (ex,) = proxy.sink.exchanges
    assert ex.api == "openai" and ex.stream is False and ex.model == "openclaw"
    assert ex.prompt_tokens == prompt
    assert ex.completion_tokens == completion
    assert tiny_tokenizer.decode(ex.completion_tokens) == reply.choices[0].message.content
    assert ex.logprobs == [fake_logprob(i) for i in range(len(completion))]
    assert ex.assistant_message == {"role": "assistant", "content": text}
    assert ex.finish_reason == "stop"
    assert ex.response["choices"][0]["message"]["content"] == text
    assert ex.messages == USER
    assert "authorization" not in ex.headers  # the key the SDK sent never reaches the store
    assert "sk-test-secret" not in json.dumps(ex.headers)


def test_tool_call_round_trip(make_proxy, tiny_tokenizer):
    proxy = make_proxy(CALL_TEXT, "2 + 3 * 4 = 14.")
    client = proxy.openai()
    first = client.chat.completions.create(model="openclaw", messages=USER, tools=[CALCULATOR])

    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content == "I will compute it."
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "2 + 3 * 4"}

    (ex,) = proxy.sink.exchanges
    assert tiny_tokenizer.decode(ex.completion_tokens) == CALL_TEXT
    assert ex.tools == [CALCULATOR]
    assert ex.assistant_message["tool_calls"][0]["id"] == call.id

    # The client sends the call and its result back: the prompt is the template's rendering of exactly that.
    history = [
        *USER,
        choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "14"},
    ]
    second = client.chat.completions.create(model="openclaw", messages=history, tools=[CALCULATOR])
    assert second.choices[0].message.content == "2 + 3 * 4 = 14."
    expected_prompt = tiny_tokenizer.render(history, [CALCULATOR])
    assert proxy.backend.calls[1].prompt_tokens == expected_prompt
    rendered = tiny_tokenizer.decode(expected_prompt)
    assert '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3 * 4"}}\n</tool_call>' in rendered
    assert "<tool_response>\n14\n</tool_response>" in rendered


def test_tool_choice_none_hides_tools(make_proxy, tiny_tokenizer):
    proxy = make_proxy(CALL_TEXT)
    reply = proxy.openai().chat.completions.create(
        model="openclaw", messages=USER, tools=[CALCULATOR], tool_choice="none"
    )
    # No tools offered: the markup is ordinary text and nothing is parsed out of it.
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].message.content == CALL_TEXT
    assert proxy.backend.calls[0].prompt_tokens == tiny_tokenizer.render(USER)


def test_reasoning_is_split_out(make_proxy):
    proxy = make_proxy("<think>\nThe user wants a greeting.\n</think>\n\nHello!")
    message = proxy.openai().chat.completions.create(model="openclaw", messages=USER).choices[0].message
    assert message.content == "Hello!"
    assert message.model_extra["reasoning_content"] == "The user wants a greeting."
    assert proxy.sink.exchanges[0].assistant_message["reasoning_content"] == "The user wants a greeting."


def test_stop_sequence_and_length(make_proxy, tiny_tokenizer):
    proxy = make_proxy("The capital of France is Paris. Thank you!", "Hello! How can I help you today?")
    client = proxy.openai()
    stopped = client.chat.completions.create(model="openclaw", messages=USER, stop=["Paris"])
    assert stopped.choices[0].message.content == "The capital of France is "
    assert stopped.choices[0].finish_reason == "stop"
    assert proxy.backend.calls[0].params.stop == ("Paris",)
    assert proxy.sink.exchanges[0].metadata["stop_sequence"] == "Paris"

    cut = client.chat.completions.create(model="openclaw", messages=USER, max_completion_tokens=3)
    assert cut.choices[0].finish_reason == "length"
    assert cut.usage.completion_tokens == 3
    ids = tiny_tokenizer.encode("Hello! How can I help you today?")[:3]
    assert cut.choices[0].message.content == tiny_tokenizer.decode(ids)


def test_logprobs_report_the_backends_top_alternatives(make_proxy, tiny_tokenizer):
    text = "Hello! How can I help you today?"
    proxy = make_proxy(text, text)
    client = proxy.openai()
    reply = client.chat.completions.create(model="openclaw", messages=USER, logprobs=True, top_logprobs=3)
    entries = reply.choices[0].logprobs.content
    ids = tiny_tokenizer.encode(text)  # the stop token is not reported
    assert [e.token for e in entries] == [tiny_tokenizer.decode([t]) for t in ids]
    assert [e.logprob for e in entries] == [fake_logprob(i) for i in range(len(ids))]
    # The double's alternatives: the sampled token, then the next ids, each 1 nat less likely (fake_top_logprobs).
    for i, (entry, token) in enumerate(zip(entries, ids, strict=True)):
        assert [t.token for t in entry.top_logprobs] == [tiny_tokenizer.decode([token + j]) for j in range(3)]
        assert [t.logprob for t in entry.top_logprobs] == pytest.approx([fake_logprob(i) - j for j in range(3)])
    assert proxy.backend.calls[0].params.top_logprobs == 3
    assert "".join(e.token for e in entries) == text
    streamed = [
        entry
        for chunk in client.chat.completions.create(
            model="openclaw", messages=USER, logprobs=True, top_logprobs=2, stream=True
        )
        for choice in chunk.choices
        if choice.logprobs and choice.logprobs.content
        for entry in choice.logprobs.content
    ]
    assert [len(e.top_logprobs) for e in streamed] == [2] * len(ids)


def test_real_tiny_model_top_logprobs_are_the_samplers_distribution(local_proxy, tiny_tokenizer):
    _, _, server = local_proxy
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    reply = client.chat.completions.create(
        model="openclaw", messages=USER, max_tokens=6, temperature=0, logprobs=True, top_logprobs=4
    )
    for entry in reply.choices[0].logprobs.content:
        alternatives = [t.logprob for t in entry.top_logprobs]
        assert len(alternatives) == 4 and alternatives == sorted(alternatives, reverse=True)
        assert sum(math.exp(lp) for lp in alternatives) <= 1.0 + 1e-4
        # greedy: the sampled token is the most likely one
        assert entry.top_logprobs[0].token == entry.token and entry.logprob == pytest.approx(alternatives[0], abs=1e-5)


def test_n_choices_each_recorded(make_proxy):
    proxy = make_proxy("First answer.", "Second answer.")
    reply = proxy.openai().chat.completions.create(model="openclaw", messages=USER, n=2, seed=10)
    assert sorted(c.message.content for c in reply.choices) == ["First answer.", "Second answer."]
    assert [c.index for c in reply.choices] == [0, 1]
    assert sorted(call.params.seed for call in proxy.backend.calls) == [10, 11]
    assert sorted(ex.choice_index for ex in proxy.sink.exchanges) == [0, 1]


def test_side_model_marks_the_turn(make_proxy):
    proxy = make_proxy("A title.")
    proxy.openai().chat.completions.create(model="openclaw-side", messages=USER)
    (ex,) = proxy.sink.exchanges
    assert ex.model == "openclaw-side" and ex.metadata["turn_type"] == "side"


def test_developer_role_and_content_parts(make_proxy, tiny_tokenizer):
    proxy = make_proxy("ok")
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
    ]
    proxy.openai().chat.completions.create(model="openclaw", messages=messages)
    expected = [{"role": "system", "content": "Be brief."}, messages[1]]
    assert proxy.backend.calls[0].prompt_tokens == tiny_tokenizer.render(expected)
    assert proxy.sink.exchanges[0].messages == expected


# -- streamed --------------------------------------------------------------------------------------------------


def test_stream_text_usage_and_capture(make_proxy, tiny_tokenizer):
    text = "Please answer briefly and politely. Thank you very much!"
    proxy = make_proxy(text)
    chunks = list(
        proxy.openai().chat.completions.create(
            model="openclaw", messages=USER, stream=True, stream_options={"include_usage": True}
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(pieces) > 5  # token by token, not one blob
    received = "".join(pieces)
    assert received == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens == len(tiny_tokenizer.encode(text)) + 1
    assert chunks[-1].usage.prompt_tokens == len(tiny_tokenizer.render(USER))

    (ex,) = proxy.sink.exchanges
    assert ex.stream is True
    assert tiny_tokenizer.decode(ex.completion_tokens) == received
    assert ex.response["choices"][0]["message"]["content"] == received


def test_stream_tool_call_deltas(make_proxy, tiny_tokenizer):
    proxy = make_proxy(CALL_TEXT)
    stream = proxy.openai().chat.completions.create(model="openclaw", messages=USER, tools=[CALCULATOR], stream=True)
    content, calls, finishes = "", [], []
    for chunk in stream:
        delta = chunk.choices[0].delta
        content += delta.content or ""
        calls += delta.tool_calls or []
        finishes += [chunk.choices[0].finish_reason] if chunk.choices[0].finish_reason else []
        assert "<tool_call>" not in (delta.content or "")
    assert content == "I will compute it."
    (call,) = calls
    assert call.index == 0 and call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "calculator"
    assert json.loads(call.function.arguments) == {"expression": "2 + 3 * 4"}
    assert finishes == ["tool_calls"]

    (ex,) = proxy.sink.exchanges
    assert ex.finish_reason == "tool_calls"
    assert ex.assistant_message["tool_calls"][0]["id"] == call.id
    parsed = parse_assistant_text(tiny_tokenizer.decode(ex.completion_tokens))
    assert parsed.content == content
    assert [(c.name, c.arguments) for c in parsed.tool_calls] == [(call.function.name, call.function.arguments)]


def test_stream_reasoning_content(make_proxy):
    proxy = make_proxy("<think>\nCount the letters.\n</think>\n\nThree.")
    reasoning, content = "", ""
    for chunk in proxy.openai().chat.completions.create(model="openclaw", messages=USER, stream=True):
        delta = chunk.choices[0].delta
        reasoning += (delta.model_extra or {}).get("reasoning_content") or ""
        content += delta.content or ""
    assert (reasoning, content) == ("Count the letters.", "Three.")


def test_stream_wire_format_is_exact(make_proxy):
    proxy = make_proxy("Hello!")
    body = {"model": "openclaw", "messages": USER, "stream": True}
    with httpx.stream("POST", proxy.url + "/v1/chat/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        raw = b"".join(resp.iter_bytes())
    frames = raw.split(b"\n\n")
    assert frames[-1] == b"" and frames[-2] == b"data: [DONE]"
    events = [json.loads(f.removeprefix(b"data: ")) for f in frames[:-2]]
    assert all(f.startswith(b"data: {") for f in frames[:-2])
    assert events[0]["object"] == "chat.completion.chunk"
    assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert "".join(e["choices"][0]["delta"].get("content", "") for e in events) == "Hello!"
    assert events[-1]["choices"][0] == {"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}
    assert len({e["id"] for e in events}) == 1


async def test_async_stream_is_incremental(make_proxy):
    text = "Zebras quietly juggle violet kumquats near Oxford, 7 times."  # far from the BPE corpus: many tokens
    proxy = make_proxy(text, token_delay_s=0.04)
    arrivals: list[tuple[float, str]] = []
    async with proxy.async_openai() as client:
        stream = await client.chat.completions.create(model="openclaw", messages=USER, stream=True)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append((time.time(), chunk.choices[0].delta.content))
    (call,) = proxy.backend.calls
    assert "".join(t for _, t in arrivals) == text
    assert call.tokens_produced >= 20
    # The first text reached the client while the backend still had most of the reply to generate.
    assert arrivals[0][0] < call.finished_at - 0.3
    assert arrivals[-1][0] - arrivals[0][0] > 0.3


async def test_async_non_stream_tool_call(make_proxy):
    proxy = make_proxy(CALL_TEXT)
    async with proxy.async_openai() as client:
        reply = await client.chat.completions.create(model="openclaw", messages=USER, tools=[CALCULATOR])
    assert reply.choices[0].message.tool_calls[0].function.name == "calculator"
    assert len(proxy.sink.exchanges) == 1


def test_stream_n2_and_logprobs(make_proxy, tiny_tokenizer):
    proxy = make_proxy("Alpha beta.", "Gamma delta.", token_delay_s=0.005)
    stream = proxy.openai().chat.completions.create(
        model="openclaw", messages=USER, stream=True, n=2, logprobs=True, stream_options={"include_usage": True}
    )
    texts, logprobs = {0: "", 1: ""}, {0: [], 1: []}
    usage = None
    for chunk in stream:
        usage = chunk.usage or usage
        for choice in chunk.choices:
            texts[choice.index] += choice.delta.content or ""
            logprobs[choice.index] += choice.logprobs.content if choice.logprobs else []
    assert sorted(texts.values()) == ["Alpha beta.", "Gamma delta."]
    for index in (0, 1):
        assert [e.logprob for e in logprobs[index]] == [
            fake_logprob(i) for i in range(len(tiny_tokenizer.encode(texts[index])))
        ]
    assert (
        usage.completion_tokens
        == len(tiny_tokenizer.encode("Alpha beta.")) + len(tiny_tokenizer.encode("Gamma delta.")) + 2
    )
    assert sorted(ex.choice_index for ex in proxy.sink.exchanges) == [0, 1]


# -- models, status, sessions ----------------------------------------------------------------------------------


def test_models_status_and_session_end(make_proxy):
    proxy = make_proxy("ok", settings=Settings(proxy={"model_aliases": ["gpt-4o-mini"]}))
    client = proxy.openai()
    names = [m.id for m in client.models.list()]
    assert names == ["openclaw-policy", "openclaw", "openclaw-side", "gpt-4o-mini"]
    assert client.models.retrieve("gpt-4o-mini").id == "gpt-4o-mini"
    client.chat.completions.create(model="gpt-4o-mini", messages=USER)

    status = httpx.get(proxy.url + "/v1/openclaw/status").json()
    assert status["backend"] == "fake" and status["policy_version"] == 0
    assert status["in_flight"] == 0 and status["requests_total"] == 1 and status["captured"] == 1
    assert status["sink"] == {"recorded": 1, "ended": 0}
    assert httpx.get(proxy.url + "/healthz").json() == {"status": "ok"}

    ended = httpx.post(proxy.url + "/v1/openclaw/sessions/abc-123/end").json()
    assert ended == {"session_id": "abc-123", "ended": True}
    assert proxy.sink.ended == ["abc-123"]


def test_policy_version_is_reported_and_stored(make_proxy):
    proxy = make_proxy("one", "two")
    client = proxy.openai()
    client.chat.completions.create(model="openclaw", messages=USER)
    asyncio.run(proxy.backend.publish("after-training"))
    raw = client.chat.completions.with_raw_response.create(model="openclaw", messages=USER)
    assert raw.headers["x-openclaw-policy-version"] == "1"
    assert raw.parse().system_fingerprint == "openclaw-v1"
    assert [ex.version for ex in proxy.sink.exchanges] == [0, 1]


# -- with the real pieces where they exist ---------------------------------------------------------------------


def test_real_session_capture_pairs_turns(make_proxy, tmp_path):
    """Through the real store: a streamed tool call, then the client's follow-up with the tool result, land in one
    session, and the first turn gets the tool result as its next state."""
    sessions = pytest.importorskip("openclaw_cli.capture.sessions")
    store_mod = pytest.importorskip("openclaw_cli.store")
    store = store_mod.Store(tmp_path / "store.sqlite3")
    try:
        proxy = make_proxy(CALL_TEXT, "It is 14.", sink=sessions.SessionCapture(store, Settings()))
        client = proxy.openai()
        stream = client.chat.completions.create(model="openclaw", messages=USER, tools=[CALCULATOR], stream=True)
        content, calls = "", []
        for chunk in stream:
            content += chunk.choices[0].delta.content or "" if chunk.choices else ""
            calls += chunk.choices[0].delta.tool_calls or [] if chunk.choices else []
        sent_back = [{"id": c.id, "type": "function", "function": c.function.model_dump()} for c in calls]
        history = [
            *USER,
            {"role": "assistant", "content": content, "tool_calls": sent_back},
            {"role": "tool", "tool_call_id": calls[0].id, "content": "14"},
        ]
        client.chat.completions.create(model="openclaw", messages=history, tools=[CALCULATOR])

        first, second = store.iter_turns()
        assert first.session_id == second.session_id
        assert (first.turn_type, second.turn_type) == ("main", "main")
        assert first.status == "ready" and first.next_state_role == "tool"
        assert first.next_state[0]["content"] == "14"
        status = httpx.get(proxy.url + "/v1/openclaw/status").json()
        assert status["sink"]["turns"]["total"] == 2
    finally:
        store.close()


@pytest.fixture
def local_proxy(tiny_model_dir: Path) -> Iterator[tuple[Any, MemorySink, BackgroundServer]]:
    from runtime_helpers import local_proxy_server

    pytest.importorskip("openclaw_cli.backends.local")
    with local_proxy_server(Settings(model=str(tiny_model_dir), local={"device": "cpu"})) as served:
        yield served


def test_real_tiny_model_stream_and_plain(local_proxy, tiny_tokenizer):
    _, sink, server = local_proxy
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    plain = client.chat.completions.create(model="openclaw", messages=USER, max_tokens=12, temperature=0)
    received = ""
    for chunk in client.chat.completions.create(
        model="openclaw", messages=USER, max_tokens=12, temperature=0, stream=True
    ):
        if chunk.choices:
            received += chunk.choices[0].delta.content or ""
    first, second = sink.exchanges
    assert first.prompt_tokens == second.prompt_tokens == tiny_tokenizer.render(USER)
    assert len(second.completion_tokens) == second.response["usage"]["completion_tokens"] <= 12
    # Greedy decoding: the same tokens either way, and the stored ids decode to what each client got.
    assert first.completion_tokens == second.completion_tokens
    parsed = parse_assistant_text(tiny_tokenizer.decode(second.completion_tokens), tools_offered=False)
    assert received == parsed.content
    assert (
        plain.choices[0].message.content
        == parse_assistant_text(tiny_tokenizer.decode(first.completion_tokens), tools_offered=False).content
    )
    assert len(second.logprobs) == len(second.completion_tokens)


# -- the stream splitter, unit level ---------------------------------------------------------------------------

SPLIT_CASES = [
    "Plain answer with no markup at all.",
    "Trailing spaces kept   ",
    "\nLeading newline kept",
    "<think>\nweigh options\n</think>\n\nFinal answer.",
    "<think>a</think>b<think>c</think>d",
    CALL_TEXT,
    '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n'
    '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>',
    'Text <tool_call>{"name": "a", "arguments": {}}</tool_call> middle '
    '<tool_call>[{"name": "b", "arguments": {}}, {"name": "c", "parameters": {"y": 2}}]</tool_call> end',
    "Broken <tool_call>not json</tool_call> stays as text",
    '{"name": "calculator", "parameters": {"expression": "1+1"}}',
    "[1] is a footnote, not a call.",
    '{"answer": 42} and then some prose',
    "a < b and <tool but not a call, <thinking> is not a marker",
    'Unclosed <tool_call>{"name": "late", "arguments": {"k": "v"}}',
    "<think>\nplan\n</think>\n\n" + CALL_TEXT,
    "ümlauts and emoji 🎉 survive <think",
]


def _run_splitter(text: str, cuts: list[int], tools: bool = True, starts_in_reasoning: bool = False):
    splitter = AssistantStreamSplitter(
        lambda t: parse_assistant_text(t, tools_offered=True),
        tools_offered=tools,
        starts_in_reasoning=starts_in_reasoning,
    )
    pieces = []
    bounds = [0, *sorted(set(cuts)), len(text)]
    for start, end in itertools.pairwise(bounds):
        pieces += splitter.feed(text[start:end])
    pieces += splitter.finish()
    return splitter, pieces


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_splitter_agrees_with_parse_assistant_for_any_chunking(data):
    text = data.draw(st.sampled_from(SPLIT_CASES))
    cuts = data.draw(st.lists(st.integers(0, len(text)), max_size=12))
    splitter, pieces = _run_splitter(text, cuts)
    expected = parse_assistant_text(text, tools_offered=True)
    got = splitter.result()
    assert got.content == expected.content
    assert got.reasoning == expected.reasoning
    assert [(c.name, c.arguments) for c in got.tool_calls] == [(c.name, c.arguments) for c in expected.tool_calls]
    # The pieces are the whole output, in order.
    assert "".join(p.text for p in pieces if isinstance(p, ContentPiece)) == got.content
    assert "".join(p.text for p in pieces if isinstance(p, ReasoningPiece)) == got.reasoning
    assert [p.index for p in pieces if isinstance(p, ToolCallPiece)] == list(range(len(got.tool_calls)))


def test_splitter_holds_only_a_possible_marker():
    splitter = AssistantStreamSplitter(parse_assistant_text, tools_offered=True)
    assert splitter.feed("Sure, ") == [ContentPiece("Sure,")]  # trailing space waits for more text
    assert splitter.feed("one moment <tool_") == [ContentPiece(" one moment")]
    assert splitter.feed('call>{"name": "f", "arguments": {"a": 1}}') == []
    (piece,) = splitter.feed("</tool_call>")
    assert isinstance(piece, ToolCallPiece) and (piece.call.name, piece.call.arguments) == ("f", '{"a": 1}')
    assert splitter.finish() == []
    assert splitter.result().content == "Sure, one moment"


def test_splitter_streams_prose_that_starts_like_json():
    splitter = AssistantStreamSplitter(parse_assistant_text, tools_offered=True)
    assert splitter.feed("[") == []  # could still be a JSON list of calls
    assert splitter.feed("1] see the note") == [ContentPiece("[1] see the note")]
    splitter = AssistantStreamSplitter(parse_assistant_text, tools_offered=True)
    assert splitter.feed('{"name": "f", "arguments": {}}') == []  # a complete whole-reply call, so far
    assert splitter.feed(" and more") == [ContentPiece('{"name": "f", "arguments": {}} and more')]


def test_splitter_prompt_that_opened_think():
    _, pieces = _run_splitter("working it out</think>\n\nDone.", [5, 20], starts_in_reasoning=True)
    assert pieces == [ReasoningPiece("worki"), ReasoningPiece("ng it out"), ContentPiece("Done.")]


def test_splitter_without_tools_leaves_tool_markup_as_text():
    splitter, _ = _run_splitter(CALL_TEXT, [3, 30], tools=False)
    assert splitter.result().content == CALL_TEXT and splitter.result().tool_calls == []


def test_keepalive_comments_while_the_backend_is_quiet(make_proxy):
    proxy = make_proxy("Slow.", token_delay_s=0.25, settings=Settings(proxy={"keepalive_s": 0.05}))
    with httpx.stream(
        "POST", proxy.url + "/v1/chat/completions", json={"model": "openclaw", "messages": USER, "stream": True}
    ) as resp:
        raw = b"".join(resp.iter_bytes())
    assert raw.count(b": keepalive\n\n") >= 3
    proxy.backend.queue("Slow.")
    stream = proxy.openai().chat.completions.create(model="openclaw", messages=USER, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream) == "Slow."
