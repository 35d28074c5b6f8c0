"""Enforced reply constraints (proxy/constraints.py) through the real openai and anthropic SDKs.

tool_choice required / any / named, one tool call at most (parallel_tool_calls false, disable_parallel_tool_use),
and OpenAI response_format JSON: each checked on plain and streamed requests against a scripted FakeBackend, so the
number of samples drawn (``backend.calls``) and what was captured are exact.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest

from openclaw_cli.proxy import BackgroundServer, create_app
from openclaw_cli.proxy.constraints import ReplyConstraints, json_violation, schema_violation
from openclaw_cli.settings import Settings
from openclaw_cli.testing.fake_backend import FakeBackend, MemorySink
from openclaw_cli.types import ParsedAssistant, ToolCall


def _function(name: str) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"The {name} tool.",
            "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
        },
    }


OPENAI_TOOLS = [_function("search"), _function("calculator")]
ANTHROPIC_TOOLS = [
    {"name": t["function"]["name"], "description": "x", "input_schema": t["function"]["parameters"]}
    for t in OPENAI_TOOLS
]
USER = [{"role": "user", "content": "Find it."}]


def call(name: str, q: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {{"q": "{q}"}}}}\n</tool_call>'


TWO_CALLS = "Two at once.\n" + call("search", "a") + "\n" + call("calculator", "1+1")


@dataclass
class Proxy:
    backend: FakeBackend
    sink: MemorySink
    server: BackgroundServer

    def openai(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=self.server.base_url + "/v1", api_key="sk-test", max_retries=0)

    def anthropic(self) -> anthropic.Anthropic:
        return anthropic.Anthropic(base_url=self.server.base_url, api_key="sk-ant-test", max_retries=0)


@pytest.fixture
def make_proxy(tiny_tokenizer) -> Iterator[Callable[..., Proxy]]:
    servers: list[BackgroundServer] = []

    def make(*replies: str, retries: int = 2, token_delay_s: float = 0.0, keepalive_s: float = 15.0) -> Proxy:
        backend = FakeBackend(tiny_tokenizer, replies, default_reply="(script ran out)", token_delay_s=token_delay_s)
        sink = MemorySink()
        settings = Settings.model_validate({"proxy": {"tool_choice_retries": retries, "keepalive_s": keepalive_s}})
        server = BackgroundServer(create_app(backend, sink, settings)).start()
        servers.append(server)
        return Proxy(backend, sink, server)

    yield make
    for server in servers:
        server.stop()


def openai_stream(proxy: Proxy, **kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """All chunks of a streamed chat completion, and the message they add up to."""
    chunks = list(proxy.openai().chat.completions.create(model="openclaw", stream=True, **kwargs))
    content, calls, finish = "", [], None
    for chunk in chunks:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            calls += [(c.function.name, json.loads(c.function.arguments)) for c in choice.delta.tool_calls or []]
            finish = choice.finish_reason or finish
    return chunks, {"content": content, "calls": calls, "finish": finish}


# -- tool_choice: OpenAI ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_openai_required_resamples_until_a_tool_call(make_proxy, stream):
    proxy = make_proxy("I will not call anything.", "Still no call.", call("calculator", "2*3"))
    kwargs = {"messages": USER, "tools": OPENAI_TOOLS, "tool_choice": "required", "seed": 5}
    if stream:
        chunks, got = openai_stream(proxy, **kwargs)
        assert got["calls"] == [("calculator", {"q": "2*3"})]
        assert got["finish"] == "tool_calls"
        assert len(chunks) > 1
    else:
        reply = proxy.openai().chat.completions.create(model="openclaw", **kwargs)
        (tc,) = reply.choices[0].message.tool_calls
        assert (tc.function.name, json.loads(tc.function.arguments)) == ("calculator", {"q": "2*3"})
        assert reply.choices[0].finish_reason == "tool_calls"
    assert len(proxy.backend.calls) == 3  # two rejected samples, then the one returned
    assert [c.params.seed for c in proxy.backend.calls] == [5, 6, 7]  # each resample is a fresh draw
    (exchange,) = proxy.sink.exchanges  # only the returned sample is captured
    assert exchange.metadata["samples_drawn"] == 3
    assert exchange.stream is stream
    assert exchange.assistant_message["tool_calls"][0]["function"]["name"] == "calculator"


@pytest.mark.parametrize("stream", [False, True])
def test_openai_required_gives_502_in_openai_format_when_no_sample_calls(make_proxy, stream):
    proxy = make_proxy("no", "no", "no", "never reached")
    with pytest.raises(openai.InternalServerError) as info:
        proxy.openai().chat.completions.create(
            model="openclaw", messages=USER, tools=OPENAI_TOOLS, tool_choice="required", stream=stream
        )
    assert info.value.status_code == 502
    assert info.value.response.headers["x-should-retry"] == "false"
    error = info.value.body
    assert error["type"] == "server_error"
    assert error["code"] == "constraint_not_met"
    assert error["param"] == "tool_choice"
    assert "did not produce the required tool call" in error["message"]
    assert "tried 3 samples" in error["message"]
    assert len(proxy.backend.calls) == 3  # 1 + proxy.tool_choice_retries (2)
    assert proxy.sink.exchanges == []


def test_openai_named_function_rejects_a_call_to_another_tool(make_proxy):
    # The named choice shows the model only "search"; a call to "calculator" is not what was asked for.
    proxy = make_proxy(call("calculator", "1"), call("search", "cats"))
    reply = proxy.openai().chat.completions.create(
        model="openclaw",
        messages=USER,
        tools=OPENAI_TOOLS,
        tool_choice={"type": "function", "function": {"name": "search"}},
    )
    assert [c.function.name for c in reply.choices[0].message.tool_calls] == ["search"]
    assert len(proxy.backend.calls) == 2


def test_openai_retries_zero_means_one_sample(make_proxy):
    proxy = make_proxy("no call", call("search", "x"), retries=0)
    with pytest.raises(openai.InternalServerError):
        proxy.openai().chat.completions.create(
            model="openclaw", messages=USER, tools=OPENAI_TOOLS, tool_choice="required"
        )
    assert len(proxy.backend.calls) == 1


def test_openai_auto_is_not_checked(make_proxy):
    proxy = make_proxy("Plain answer.")
    reply = proxy.openai().chat.completions.create(model="openclaw", messages=USER, tools=OPENAI_TOOLS)
    assert reply.choices[0].message.content == "Plain answer."
    assert len(proxy.backend.calls) == 1
    assert "samples_drawn" not in proxy.sink.exchanges[0].metadata


# -- parallel_tool_calls=false ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_openai_parallel_false_returns_only_the_first_call(make_proxy, tiny_tokenizer, stream):
    proxy = make_proxy(TWO_CALLS)
    kwargs = {"messages": USER, "tools": OPENAI_TOOLS, "parallel_tool_calls": False}
    if stream:
        _, got = openai_stream(proxy, **kwargs)
        assert got["calls"] == [("search", {"q": "a"})]
        assert got["content"] == "Two at once."
        assert got["finish"] == "tool_calls"
    else:
        message = proxy.openai().chat.completions.create(model="openclaw", **kwargs).choices[0].message
        assert [(c.function.name, json.loads(c.function.arguments)) for c in message.tool_calls] == [
            ("search", {"q": "a"})
        ]
    (exchange,) = proxy.sink.exchanges
    # The tokens stay what the model wrote (both calls); what the client saw has one, and the metadata says so.
    assert exchange.completion_tokens == [*tiny_tokenizer.encode(TWO_CALLS), tiny_tokenizer.eos_token_ids[0]]
    assert len(exchange.assistant_message["tool_calls"]) == 1
    assert len(exchange.response["choices"][0]["message"]["tool_calls"]) == 1
    assert exchange.metadata["tool_calls_dropped"] == 1
    assert len(proxy.backend.calls) == 1  # nothing to resample


def test_openai_parallel_true_keeps_every_call(make_proxy):
    proxy = make_proxy(TWO_CALLS)
    message = (
        proxy.openai()
        .chat.completions.create(model="openclaw", messages=USER, tools=OPENAI_TOOLS, parallel_tool_calls=True)
        .choices[0]
        .message
    )
    assert [c.function.name for c in message.tool_calls] == ["search", "calculator"]


# -- response_format -------------------------------------------------------------------------------------------------

SCHEMA_FORMAT = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


@pytest.mark.parametrize("stream", [False, True])
def test_openai_json_object_resamples_until_the_reply_parses(make_proxy, stream):
    proxy = make_proxy("Sure! Here it is: {", '```json\n{"a": 1}\n```', ' {"city": "Paris"}\n')
    kwargs = {"messages": USER, "response_format": {"type": "json_object"}}
    if stream:
        _, got = openai_stream(proxy, **kwargs)
        content = got["content"]
    else:
        content = proxy.openai().chat.completions.create(model="openclaw", **kwargs).choices[0].message.content
    assert json.loads(content) == {"city": "Paris"}
    assert len(proxy.backend.calls) == 3  # the half reply and the fenced one are both rejected


def test_openai_json_object_rejects_a_non_object(make_proxy):
    proxy = make_proxy("[1, 2]", "42", '"text"')
    with pytest.raises(openai.InternalServerError) as info:
        proxy.openai().chat.completions.create(model="openclaw", messages=USER, response_format={"type": "json_object"})
    assert "not a JSON object" in info.value.body["message"]
    assert info.value.body["param"] == "response_format"


def test_openai_json_schema_checks_required_keys(make_proxy):
    proxy = make_proxy('{"country": "France"}', '{"city": "Paris"}')
    reply = proxy.openai().chat.completions.create(model="openclaw", messages=USER, response_format=SCHEMA_FORMAT)
    assert json.loads(reply.choices[0].message.content) == {"city": "Paris"}
    assert len(proxy.backend.calls) == 2


def test_openai_json_mode_does_not_apply_to_tool_calls(make_proxy):
    proxy = make_proxy(call("search", "x"))
    reply = proxy.openai().chat.completions.create(
        model="openclaw", messages=USER, tools=OPENAI_TOOLS, response_format={"type": "json_object"}
    )
    assert reply.choices[0].finish_reason == "tool_calls"
    assert len(proxy.backend.calls) == 1


@pytest.mark.parametrize(
    "fmt",
    [
        {"type": "yaml"},
        {"type": "json_schema"},
        {"type": "json_schema", "json_schema": {"name": "a", "schema": 3}},
        {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "no-such-type"}}},
    ],
)
def test_openai_bad_response_format_is_400(make_proxy, fmt):
    proxy = make_proxy("x")
    r = httpx.post(
        proxy.server.base_url + "/v1/chat/completions",
        json={"model": "openclaw", "messages": USER, "response_format": fmt},
        headers={"authorization": "Bearer sk-test"},
    )
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "response_format"
    assert proxy.backend.calls == []


def test_openai_n2_resamples_only_the_failing_choice(make_proxy):
    # Choices are sampled concurrently, but FakeBackend hands out replies in call order: choice 0 gets the first.
    proxy = make_proxy(call("search", "a"), "no call", call("search", "b"))
    reply = proxy.openai().chat.completions.create(
        model="openclaw", messages=USER, tools=OPENAI_TOOLS, tool_choice="required", n=2
    )
    args = [json.loads(c.message.tool_calls[0].function.arguments)["q"] for c in reply.choices]
    assert sorted(args) == ["a", "b"]
    assert len(proxy.backend.calls) == 3
    assert sorted(e.metadata["samples_drawn"] for e in proxy.sink.exchanges) == [1, 2]


def _prompt_text(proxy: Proxy, tiny_tokenizer, index: int = 0) -> str:
    return tiny_tokenizer.decode(proxy.backend.calls[index].prompt_tokens)


def _allowed(mode: str, *names: str) -> dict[str, Any]:
    refs = [{"type": "function", "function": {"name": n}} for n in names]
    return {"type": "allowed_tools", "allowed_tools": {"mode": mode, "tools": refs}}


def test_openai_allowed_tools_required_shows_and_accepts_only_the_listed_tools(make_proxy, tiny_tokenizer):
    proxy = make_proxy(call("calculator", "1"), "No call.", call("search", "x"))
    reply = proxy.openai().chat.completions.create(
        model="openclaw", messages=USER, tools=OPENAI_TOOLS, tool_choice=_allowed("required", "search")
    )
    (tc,) = reply.choices[0].message.tool_calls
    assert (tc.function.name, json.loads(tc.function.arguments)) == ("search", {"q": "x"})
    assert len(proxy.backend.calls) == 3  # a call to an unlisted tool, then no call: both resampled
    prompt = _prompt_text(proxy, tiny_tokenizer)
    assert '"search"' in prompt and '"calculator"' not in prompt


def test_openai_allowed_tools_auto_lets_the_model_answer_in_text(make_proxy, tiny_tokenizer):
    proxy = make_proxy("Just text.")
    reply = proxy.openai().chat.completions.create(
        model="openclaw", messages=USER, tools=OPENAI_TOOLS, tool_choice=_allowed("auto", "calculator")
    )
    assert reply.choices[0].message.content == "Just text." and len(proxy.backend.calls) == 1
    prompt = _prompt_text(proxy, tiny_tokenizer)
    assert '"calculator"' in prompt and '"search"' not in prompt


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        (_allowed("required", "nope"), "names 'nope', which is not in 'tools'"),
        (_allowed("sometimes", "search"), "must be {'mode': 'auto' | 'required'"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}, "at least one tool"),
        ({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [{"name": "x"}]}}, "tools[0] must be"),
    ],
)
def test_openai_bad_allowed_tools_is_400(make_proxy, choice, message):
    proxy = make_proxy("x")
    r = httpx.post(
        proxy.server.base_url + "/v1/chat/completions",
        json={"model": "openclaw", "messages": USER, "tools": OPENAI_TOOLS, "tool_choice": choice},
    )
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert message in r.json()["error"]["message"]
    assert proxy.backend.calls == [] and proxy.sink.exchanges == []


# -- Anthropic -------------------------------------------------------------------------------------------------------


def anthropic_create(proxy: Proxy, stream: bool, **kwargs: Any) -> anthropic.types.Message:
    client = proxy.anthropic()
    args = {"model": "openclaw", "max_tokens": 200, "messages": USER, "tools": ANTHROPIC_TOOLS, **kwargs}
    if not stream:
        return client.messages.create(**args)
    with client.messages.stream(**args) as events:
        kinds = [event.type for event in events]
        message = events.get_final_message()
    assert kinds[0] == "message_start"
    assert kinds[-1] == "message_stop"
    return message


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_any_resamples_until_a_tool_use(make_proxy, stream):
    proxy = make_proxy("No tools for me.", call("search", "dogs"))
    message = anthropic_create(proxy, stream, tool_choice={"type": "any"})
    (block,) = message.content
    assert (block.type, block.name, block.input) == ("tool_use", "search", {"q": "dogs"})
    assert block.id.startswith("toolu_")
    assert message.stop_reason == "tool_use"
    assert len(proxy.backend.calls) == 2
    (exchange,) = proxy.sink.exchanges
    assert exchange.metadata["samples_drawn"] == 2
    assert exchange.stream is stream


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_named_tool_error_is_anthropic_format(make_proxy, stream):
    proxy = make_proxy(call("calculator", "1"), "text", call("calculator", "2"))
    with pytest.raises(anthropic.InternalServerError) as info:
        anthropic_create(proxy, stream, tool_choice={"type": "tool", "name": "search"})
    assert info.value.status_code == 502
    assert info.value.body == {
        "type": "error",
        "error": {"type": "api_error", "message": info.value.body["error"]["message"]},
    }
    assert "instead of the required tool ('search')" in info.value.body["error"]["message"]
    assert len(proxy.backend.calls) == 3


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_disable_parallel_tool_use_keeps_the_first_call(make_proxy, stream):
    proxy = make_proxy(TWO_CALLS)
    message = anthropic_create(proxy, stream, tool_choice={"type": "auto", "disable_parallel_tool_use": True})
    assert [(b.type, getattr(b, "name", None)) for b in message.content] == [("text", None), ("tool_use", "search")]
    assert message.content[0].text == "Two at once."
    (exchange,) = proxy.sink.exchanges
    assert exchange.metadata["tool_calls_dropped"] == 1
    assert [b["type"] for b in exchange.response["content"]] == ["text", "tool_use"]


def test_anthropic_any_with_parallel_disabled_checks_the_visible_call(make_proxy):
    # The first call is the only one the client sees, so it alone decides whether the reply counts.
    proxy = make_proxy(call("nonexistent", "a") + "\n" + call("search", "b"), call("search", "c"))
    message = anthropic_create(proxy, False, tool_choice={"type": "any", "disable_parallel_tool_use": True})
    assert [b.input for b in message.content] == [{"q": "c"}]
    assert len(proxy.backend.calls) == 2


def test_anthropic_auto_streams_token_by_token(make_proxy):
    # Unconstrained requests keep the incremental path (many text deltas), unlike the buffered constrained ones.
    proxy = make_proxy("one two three four five six")
    with proxy.anthropic().messages.stream(model="openclaw", max_tokens=50, messages=USER) as events:
        deltas = [e for e in events if e.type == "content_block_delta"]
    assert len(deltas) > 2


# -- the checks themselves -------------------------------------------------------------------------------------------


def test_violation_rules():
    named = ReplyConstraints(tool_names=frozenset({"search"}))
    search, calc = ToolCall("c1", "search", "{}"), ToolCall("c2", "calculator", "{}")
    assert named.violation(ParsedAssistant("hi")) == "the model did not produce the required tool call"
    assert named.violation(ParsedAssistant("", [search])) is None
    assert "'calculator'" in (named.violation(ParsedAssistant("", [search, calc])) or "")
    single = ReplyConstraints(tool_names=frozenset({"search"}), single_tool_call=True)
    assert single.violation(ParsedAssistant("", [search, calc])) is None  # the client sees only the first
    assert single.visible(ParsedAssistant("", [search, calc])).tool_calls == [search]
    assert json_violation(' {"a": 1} ', "object", None) is None
    assert json_violation("{'a': 1}", "object", None) is not None
    assert json_violation("[]", "schema", None) is None  # json_schema without a schema: parse check only
    assert schema_violation({"a": 1}, {"type": "object", "required": ["b"]}) is not None
    assert schema_violation([1], {"type": "object"}) is not None
    nested = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}}
    assert schema_violation({"n": -1}, nested) is not None  # below the top level: full validation
    assert schema_violation({"n": 3}, nested) is None


# -- a constrained stream that takes a while: keep-alives until the reply is known ---------------------------------

SLOW = {"token_delay_s": 0.01, "keepalive_s": 0.05}  # each sample takes ~0.1-0.3 s: several keep-alive periods


def test_openai_slow_constrained_stream_sends_keepalives_then_the_reply(make_proxy):
    proxy = make_proxy("I will not call anything at all.", call("calculator", "2*3"), **SLOW)
    body = {"model": "openclaw", "messages": USER, "tools": OPENAI_TOOLS, "tool_choice": "required", "stream": True}
    with httpx.stream("POST", proxy.server.base_url + "/v1/chat/completions", json=body, timeout=30) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        frames = resp.read().decode().split("\n\n")
    keepalives = [f for f in frames if f == ": keepalive"]
    data = [f for f in frames if f.startswith("data: ")]
    assert len(keepalives) >= 2 and frames.index(": keepalive") == 0  # the stream opened before the reply was known
    # Keep-alives only while the reply is unknown: every one of them comes before the first data frame.
    first_data = frames.index(data[0])
    assert all(i < first_data for i, f in enumerate(frames) if f == ": keepalive") and data[-1] == "data: [DONE]"
    calls = [c for f in data[:-1] for ch in json.loads(f[6:])["choices"] for c in ch["delta"].get("tool_calls") or []]
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        ("calculator", {"q": "2*3"})
    ]
    (exchange,) = proxy.sink.exchanges
    assert exchange.stream and exchange.metadata["samples_drawn"] == 2

    # The openai SDK reads the same stream (it skips the comments).
    proxy = make_proxy("No.", call("search", "x"), **SLOW)
    _, got = openai_stream(proxy, messages=USER, tools=OPENAI_TOOLS, tool_choice="required")
    assert got["calls"] == [("search", {"q": "x"})] and got["finish"] == "tool_calls"


def test_openai_slow_constrained_stream_that_fails_ends_with_an_error_event(make_proxy):
    proxy = make_proxy("no call here, sorry", "no call here, sorry", "no call here, sorry", **SLOW)
    with pytest.raises(openai.APIError, match="did not produce the required tool call"):
        openai_stream(proxy, messages=USER, tools=OPENAI_TOOLS, tool_choice="required")
    assert len(proxy.backend.calls) == 3 and proxy.sink.exchanges == []


def test_anthropic_slow_constrained_stream_sends_keepalives_then_the_message(make_proxy):
    proxy = make_proxy("No tools for me, not today.", call("search", "dogs"), **SLOW)
    body = {"model": "openclaw", "max_tokens": 200, "messages": USER, "tools": ANTHROPIC_TOOLS}
    with httpx.stream(
        "POST", proxy.server.base_url + "/v1/messages", json={**body, "tool_choice": {"type": "any"}, "stream": True}
    ) as resp:
        assert resp.status_code == 200
        frames = resp.read().decode().split("\n\n")
    assert frames[0] == ": keepalive" and frames.count(": keepalive") >= 2
    events = [f.split("\n")[0] for f in frames if f.startswith("event: ")]
    assert events[0] == "event: message_start" and events[-1] == "event: message_stop"

    message = anthropic_create(make_proxy("Nope.", call("search", "cats"), **SLOW), True, tool_choice={"type": "any"})
    (block,) = message.content
    assert (block.type, block.name, block.input) == ("tool_use", "search", {"q": "cats"})

    failing = make_proxy("no tool use, sorry", "no tool use, sorry", "no tool use, sorry", **SLOW)
    with pytest.raises(anthropic.APIError, match="did not produce the required tool call"):
        anthropic_create(failing, True, tool_choice={"type": "any"})
    assert failing.sink.exchanges == []


def test_a_client_leaving_during_the_keepalives_stops_the_sampling(make_proxy):
    proxy = make_proxy("Zebras quietly juggle violet kumquats near Oxford. " * 6, **SLOW)
    body = {"model": "openclaw", "messages": USER, "tools": OPENAI_TOOLS, "tool_choice": "required", "stream": True}
    with httpx.stream("POST", proxy.server.base_url + "/v1/chat/completions", json=body, timeout=30) as resp:
        assert next(resp.iter_bytes()) == b": keepalive\n\n"
    deadline = time.monotonic() + 10
    while not (proxy.backend.calls and proxy.backend.calls[0].closed_early) and time.monotonic() < deadline:
        time.sleep(0.02)
    (only,) = proxy.backend.calls  # cancelled mid-sample: no resampling after the client left
    assert only.closed_early and proxy.sink.exchanges == []
    status = httpx.get(proxy.server.base_url + "/v1/openclaw/status").json()
    assert status["in_flight"] == 0


# -- Anthropic structured output (output_config.format) -------------------------------------------------------------

CITY_SCHEMA = SCHEMA_FORMAT["json_schema"]["schema"]


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_output_format_resamples_until_the_text_matches_the_schema(make_proxy, stream):
    proxy = make_proxy("Paris, of course.", '{"country": "France"}', '{"city": "Paris"}')
    message = anthropic_create(
        proxy, stream, tools=[], output_config={"format": {"type": "json_schema", "schema": CITY_SCHEMA}}
    )
    (block,) = message.content
    assert block.type == "text" and json.loads(block.text) == {"city": "Paris"}
    assert len(proxy.backend.calls) == 3
    (exchange,) = proxy.sink.exchanges
    assert exchange.metadata["samples_drawn"] == 3


def test_anthropic_output_format_failure_and_bad_formats(make_proxy):
    proxy = make_proxy("no", "no", "no")
    with pytest.raises(anthropic.InternalServerError, match="not valid JSON"):
        anthropic_create(proxy, False, tools=[], extra_body={"output_format": {"type": "json_schema", "schema": {}}})
    assert proxy.sink.exchanges == []
    effort_only = make_proxy("free text is fine")  # Claude Code sends output_config with only an effort level
    message = anthropic_create(effort_only, False, tools=[], output_config={"effort": "high"})
    assert message.content[0].text == "free text is fine"
    for bad in ({"type": "json_object"}, {"type": "json_schema", "schema": {"type": "no-such-type"}}):
        r = httpx.post(
            proxy.server.base_url + "/v1/messages",
            json={"model": "openclaw", "max_tokens": 10, "messages": USER, "output_config": {"format": bad}},
        )
        assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
        assert "output_config.format" in r.json()["error"]["message"]
    assert len(proxy.backend.calls) == 3
