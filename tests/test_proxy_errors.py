"""Failures, in each caller's own error format: bad input, size and context limits, unknown models and routes,
backend failures, auth, capture failures, disconnects and the bind rule. After every rejected request the sink
must have recorded nothing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest
from api_shapes import assert_anthropic_error, assert_openai_error
from runtime_helpers import became_true

from openclaw_cli.backend import BackendError
from openclaw_cli.proxy import BackgroundServer, ProxyConfigError, check_bind, create_app
from openclaw_cli.settings import Settings
from openclaw_cli.testing.fake_backend import FakeBackend, MemorySink, ScriptedReply
from openclaw_cli.tokenizer import HFChatTokenizer
from openclaw_cli.types import SampleResult, SamplingParams

USER = [{"role": "user", "content": "Hello"}]
OPENAI_OK = {"model": "openclaw", "messages": USER}
ANTHROPIC_OK = {"model": "openclaw", "max_tokens": 16, "messages": USER}
CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"


# -- bad input -------------------------------------------------------------------------------------------------

OPENAI_BAD = [
    (b"{not json", None, "not valid JSON"),
    (b"[1, 2]", None, "must be a JSON object"),
    (b"", None, "empty"),
    ({"messages": USER}, "model", "missing required parameter 'model'"),
    ({"model": "openclaw"}, "messages", "missing required parameter 'messages'"),
    ({"model": "openclaw", "messages": []}, "messages", "at least one message"),
    ({"model": 7, "messages": USER}, "model", "'model' must be a string"),
    ({**OPENAI_OK, "temperature": "hot"}, "temperature", "must be a number"),
    ({**OPENAI_OK, "temperature": 3}, "temperature", "between 0 and 2"),
    ({**OPENAI_OK, "max_tokens": 0}, "max_tokens", ">= 1"),
    ({**OPENAI_OK, "n": 0}, "n", "between 1 and 16"),
    ({**OPENAI_OK, "stream": "yes"}, "stream", "must be a boolean"),
    ({**OPENAI_OK, "stop": [1]}, "stop", "array of strings"),
    ({**OPENAI_OK, "top_logprobs": 2}, "top_logprobs", "requires 'logprobs'"),
    ({"model": "openclaw", "messages": [{"role": "robot", "content": "x"}]}, "messages[0]", "role must be one of"),
    ({"model": "openclaw", "messages": [{"role": "tool", "content": "x"}]}, "messages[0]", "tool_call_id"),
    ({"model": "openclaw", "messages": ["hi"]}, "messages[0]", "must be an object"),
    ({**OPENAI_OK, "tools": [{"type": "function"}]}, "tools", "tools[0]"),
    (
        {
            **OPENAI_OK,
            "tools": [{"type": "function", "function": {"name": "a"}}],
            "tool_choice": {"function": {"name": "b"}},
        },
        "tool_choice",
        "not in 'tools'",
    ),
]


@pytest.mark.parametrize(("body", "param", "message"), OPENAI_BAD)
def test_openai_bad_input_is_400(make_proxy, body, param, message):
    proxy = make_proxy("never sent")
    text = assert_openai_error(proxy.post(CHAT, body), 400, param=param)
    assert message in text
    assert proxy.sink.exchanges == [] and proxy.backend.calls == []


ANTHROPIC_BAD = [
    (b"{not json", "not valid JSON"),
    ({"model": "openclaw", "messages": USER}, "'max_tokens'"),
    ({**ANTHROPIC_OK, "max_tokens": 0}, ">= 1"),
    ({**ANTHROPIC_OK, "temperature": 1.5}, "between 0 and 1"),
    ({**ANTHROPIC_OK, "messages": []}, "non-empty"),
    ({**ANTHROPIC_OK, "messages": [{"role": "robot", "content": "x"}]}, "role must be 'user' or 'assistant'"),
    ({**ANTHROPIC_OK, "messages": [{"role": "user"}]}, "missing 'content'"),
    ({**ANTHROPIC_OK, "messages": [{"role": "user", "content": [{"text": "x"}]}]}, "with a 'type'"),
    (
        {**ANTHROPIC_OK, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
        "tool_use_id",
    ),
    ({**ANTHROPIC_OK, "system": 5}, "'system' must be"),
    ({**ANTHROPIC_OK, "tool_choice": {"type": "sometimes"}}, "tool_choice.type"),
    ({**ANTHROPIC_OK, "metadata": {"user_id": 5}}, "metadata.user_id"),
]


@pytest.mark.parametrize(("body", "message"), ANTHROPIC_BAD)
def test_anthropic_bad_input_is_400(make_proxy, body, message):
    proxy = make_proxy("never sent")
    assert message in assert_anthropic_error(proxy.post(MESSAGES, body), 400, "invalid_request_error")
    assert proxy.sink.exchanges == [] and proxy.backend.calls == []


def test_unknown_model_is_404_listing_accepted_names(make_proxy):
    proxy = make_proxy(settings=Settings(proxy={"model_aliases": ["claude-sonnet-4-5"]}))
    message = assert_openai_error(proxy.post(CHAT, {**OPENAI_OK, "model": "gpt-5"}), 404, code="model_not_found")
    assert "openclaw-policy, openclaw, openclaw-side, claude-sonnet-4-5" in message
    message = assert_anthropic_error(
        proxy.post(MESSAGES, {**ANTHROPIC_OK, "model": "claude-x"}), 404, "not_found_error"
    )
    assert "'claude-x'" in message and "openclaw-side" in message
    with pytest.raises(openai.NotFoundError):
        openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0).chat.completions.create(
            model="gpt-5", messages=USER
        )
    assert proxy.sink.exchanges == [] and proxy.backend.calls == []


def test_any_model_when_allowed(make_proxy):
    proxy = make_proxy("fine", settings=Settings(proxy={"accept_any_model": True}))
    assert proxy.post(CHAT, {**OPENAI_OK, "model": "whatever"}).json()["model"] == "whatever"


def test_oversized_body_is_413(make_proxy):
    proxy = make_proxy(settings=Settings(proxy={"max_body_bytes": 2048}))
    big = [{"role": "user", "content": "x" * 4096}]
    assert_openai_error(proxy.post(CHAT, {"model": "openclaw", "messages": big}), 413, code="request_too_large")
    assert_anthropic_error(proxy.post(MESSAGES, {**ANTHROPIC_OK, "messages": big}), 413, "request_too_large")

    # Without a Content-Length (chunked upload) the limit is enforced while reading.
    def chunks() -> Iterator[bytes]:
        yield json.dumps({"model": "openclaw", "messages": big}).encode()

    resp = httpx.post(proxy.url + CHAT, content=chunks(), timeout=30)
    assert "content-length" not in resp.request.headers
    assert_openai_error(resp, 413)
    assert proxy.sink.exchanges == [] and proxy.backend.calls == []


def test_context_overflow_is_400_and_budget_is_capped(make_proxy, tiny_tokenizer):
    small = HFChatTokenizer(tiny_tokenizer.hf, context_length=40)
    proxy = make_proxy(backend=FakeBackend(small, ["ok"]))
    long_chat = [{"role": "user", "content": "The quick brown fox jumps over the lazy dog. " * 10}]
    message = assert_openai_error(
        proxy.post(CHAT, {"model": "openclaw", "messages": long_chat}), 400, code="context_length_exceeded"
    )
    n_prompt = len(small.render(long_chat))
    assert f"prompt is too long: {n_prompt} tokens > 39 maximum" in message and "context window is 40 tokens" in message
    message = assert_anthropic_error(
        proxy.post(MESSAGES, {**ANTHROPIC_OK, "messages": long_chat}), 400, "invalid_request_error"
    )
    assert "context window" in message
    assert proxy.backend.calls == []

    # A client budget is capped by the server's output cap (a quarter of the 40-token window: 10), then must fit.
    resp = proxy.post(CHAT, {**OPENAI_OK, "max_tokens": 1000})
    assert resp.status_code == 200
    assert proxy.backend.calls[0].params.max_tokens == 10


def test_a_budget_that_cannot_fit_is_refused_at_once_in_each_api_format(make_proxy, tiny_tokenizer):
    small = HFChatTokenizer(tiny_tokenizer.hf, context_length=40)
    settings = Settings(proxy={"max_output_tokens": 100})
    proxy = make_proxy(backend=FakeBackend(small, ["ok"]), settings=settings)
    n_prompt = len(small.render(USER))
    expected = f"input length and `max_tokens` exceed context limit: {n_prompt} + 100 > 40"
    message = assert_openai_error(
        proxy.post(CHAT, {**OPENAI_OK, "max_tokens": 1000}), 400, code="context_length_exceeded"
    )
    assert expected in message
    message = assert_anthropic_error(
        proxy.post(MESSAGES, {**ANTHROPIC_OK, "max_tokens": 1000}), 400, "invalid_request_error"
    )
    assert expected in message  # Anthropic's own wording, which Claude Code reads to retry with less
    assert proxy.backend.calls == []
    # Without a client budget the default is capped by the room left: nothing to refuse.
    assert proxy.post(CHAT, OPENAI_OK).status_code == 200
    assert proxy.backend.calls[0].params.max_tokens == 40 - n_prompt


# -- backend failures ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
def test_busy_backend_is_503_or_529_with_retry_after(make_proxy, stream):
    busy = BackendError("all sampler slots are busy", retryable=True)
    proxy = make_proxy(ScriptedReply("x", error=busy), ScriptedReply("x", error=busy))
    resp = proxy.post(CHAT, {**OPENAI_OK, "stream": stream})
    assert "all sampler slots are busy" in assert_openai_error(resp, 503, code="overloaded")
    assert resp.headers["retry-after"] == "2"
    assert resp.json()["error"]["type"] == "server_error"
    resp = proxy.post(MESSAGES, {**ANTHROPIC_OK, "stream": stream})
    assert_anthropic_error(resp, 529, "overloaded_error")
    assert resp.headers["retry-after"] == "2"
    assert proxy.sink.exchanges == []


def test_sdks_see_their_own_overload_errors(make_proxy):
    busy = BackendError("busy", retryable=True)
    proxy = make_proxy(ScriptedReply("x", error=busy), ScriptedReply("x", error=busy))
    with pytest.raises(openai.InternalServerError) as oa:
        openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0).chat.completions.create(
            model="openclaw", messages=USER
        )
    assert oa.value.status_code == 503
    with pytest.raises(anthropic.OverloadedError):
        anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0).messages.create(
            model="openclaw", max_tokens=5, messages=USER
        )


def test_permanent_backend_failures(make_proxy):
    broken = BackendError("adapter file is corrupt")
    rejected = BackendError("prompt + max_tokens exceed the model limit", status_code=400)
    proxy = make_proxy(*(ScriptedReply("x", error=e) for e in (broken, broken, rejected, rejected)))
    assert "adapter file is corrupt" in assert_openai_error(proxy.post(CHAT, OPENAI_OK), 502, code="backend_error")
    assert_anthropic_error(proxy.post(MESSAGES, ANTHROPIC_OK), 502, "api_error")
    assert "exceed the model limit" in assert_openai_error(proxy.post(CHAT, OPENAI_OK), 400)
    assert_anthropic_error(proxy.post(MESSAGES, ANTHROPIC_OK), 400, "invalid_request_error")
    assert proxy.sink.exchanges == []


class _CrashingBackend(FakeBackend):
    async def sample(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> SampleResult:
        raise RuntimeError("unexpected bug")


def test_unexpected_exception_is_500_in_format(make_proxy, tiny_tokenizer):
    proxy = make_proxy(backend=_CrashingBackend(tiny_tokenizer))
    assert "unexpected bug" in assert_openai_error(proxy.post(CHAT, OPENAI_OK), 500)
    assert_anthropic_error(proxy.post(MESSAGES, ANTHROPIC_OK), 500, "api_error")
    assert proxy.status()["in_flight"] == 0


def test_mid_stream_failure_openai(make_proxy):
    proxy = make_proxy(ScriptedReply("This reply will break halfway through.", fail_after_tokens=3))
    client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0)
    received = ""
    with pytest.raises(openai.APIError, match="scripted failure"):
        for chunk in client.chat.completions.create(model="openclaw", messages=USER, stream=True):
            received += chunk.choices[0].delta.content or ""
    assert received  # some text arrived before the failure
    assert proxy.sink.exchanges == []
    assert proxy.status()["in_flight"] == 0


def test_capture_failure_never_breaks_the_reply(make_proxy):
    proxy = make_proxy("Still served.", "Also streamed.", sink=MemorySink(fail_with=RuntimeError("disk full")))
    assert proxy.post(CHAT, OPENAI_OK).json()["choices"][0]["message"]["content"] == "Still served."
    with httpx.stream("POST", proxy.url + CHAT, json={**OPENAI_OK, "stream": True}, timeout=30) as resp:
        raw = b"".join(resp.iter_bytes())
    assert raw.endswith(b"data: [DONE]\n\n")
    status = proxy.status()
    assert (status["captured"], status["capture_failures"]) == (0, 2)


# -- disconnects -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body", "api"),
    [
        (CHAT, OPENAI_OK, "openai"),
        (MESSAGES, ANTHROPIC_OK, "anthropic"),
        ("/v1/responses", {"model": "openclaw", "input": "Hello"}, "responses"),
    ],
)
def test_client_disconnect_mid_stream_records_a_partial_side_turn_and_stops_generation(make_proxy, path, body, api):
    long_reply = "Zebras quietly juggle violet kumquats near Oxford. " * 8
    proxy = make_proxy(long_reply, token_delay_s=0.02)
    budget = {"max_output_tokens": 500} if api == "responses" else {"max_tokens": 500}
    with httpx.stream("POST", proxy.url + path, json={**body, **budget, "stream": True}, timeout=30) as resp:
        seen = b""
        for chunk in resp.iter_bytes():
            seen += chunk
            if seen.count(b"\n\n") >= 12:  # several events, some of the reply's text among them: leave now
                break
    (call,) = proxy.backend.calls
    assert became_true(lambda: call.closed_early), "the backend stream was not closed after the client left"
    assert call.tokens_produced < len(proxy.backend.tokenizer().encode(long_reply))
    assert became_true(lambda: len(proxy.sink.exchanges) == 1)
    (partial,) = proxy.sink.exchanges
    # What the client got, kept as a side turn (never trained: the policy did not finish it), and counted.
    assert partial.api == api and partial.finish_reason == "aborted" and partial.stream
    assert partial.metadata["turn_type"] == "side" and partial.metadata["aborted"] is True
    assert 0 < len(partial.completion_tokens) <= call.tokens_produced
    assert long_reply.startswith(partial.assistant_message["content"])
    assert proxy.status()["capture"]["aborted"] == 1
    assert became_true(lambda: proxy.status()["in_flight"] == 0)


def test_client_disconnect_before_a_plain_reply_records_nothing(make_proxy):
    proxy = make_proxy("Zebras quietly juggle violet kumquats near Oxford. " * 4, token_delay_s=0.02)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(proxy.url + CHAT, json=OPENAI_OK, timeout=httpx.Timeout(30, read=0.3))
    (call,) = proxy.backend.calls
    assert became_true(lambda: call.closed_early)
    assert proxy.sink.exchanges == []


# -- auth, routes, bind ----------------------------------------------------------------------------------------


def test_api_key_required_everywhere_but_healthz(make_proxy):
    proxy = make_proxy("ok", "ok", "ok", settings=Settings(api_key="s3cret"))
    assert "missing API key" in assert_openai_error(proxy.post(CHAT, OPENAI_OK), 401, code="invalid_api_key")
    bad = {"authorization": "Bearer wrong"}
    assert assert_openai_error(proxy.post(CHAT, OPENAI_OK, headers=bad), 401) == "invalid API key"
    assert_anthropic_error(
        proxy.post(MESSAGES, ANTHROPIC_OK, headers={"x-api-key": "wrong"}), 401, "authentication_error"
    )
    assert_anthropic_error(proxy.post(MESSAGES + "/count_tokens", ANTHROPIC_OK), 401, "authentication_error")
    assert_openai_error(httpx.get(proxy.url + "/v1/models"), 401)
    assert httpx.get(proxy.url + "/v1/openclaw/status").status_code == 401
    assert httpx.get(proxy.url + "/healthz").status_code == 200
    assert proxy.sink.exchanges == [] and proxy.backend.calls == []

    assert proxy.post(CHAT, OPENAI_OK, headers={"authorization": "Bearer s3cret"}).status_code == 200
    assert proxy.post(MESSAGES, ANTHROPIC_OK, headers={"x-api-key": "s3cret"}).status_code == 200
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=proxy.url + "/v1", api_key="nope", max_retries=0).models.list()
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=proxy.url, api_key="nope", max_retries=0).messages.create(
            model="openclaw", max_tokens=5, messages=USER
        )
    reply = anthropic.Anthropic(base_url=proxy.url, auth_token="s3cret", max_retries=0).messages.create(
        model="openclaw", max_tokens=5, messages=USER
    )
    assert reply.content[0].text == "ok"
    assert proxy.sink.exchanges, "the accepted requests were captured"
    assert all("s3cret" not in json.dumps(ex.headers) for ex in proxy.sink.exchanges)


def test_unknown_route_and_method_in_format(make_proxy):
    proxy = make_proxy()
    assert "/v1/completions" in assert_openai_error(proxy.post("/v1/completions", OPENAI_OK), 404)
    assert_anthropic_error(proxy.post("/v1/messages/batches", ANTHROPIC_OK), 404, "not_found_error")
    assert_openai_error(httpx.get(proxy.url + CHAT), 405)
    assert_anthropic_error(httpx.get(proxy.url + MESSAGES), 405, "invalid_request_error")


def test_session_end_without_support_is_501(make_proxy, tiny_tokenizer):
    class RecordOnly:
        async def record(self, exchange: Any) -> None:
            return None

    server = BackgroundServer(create_app(FakeBackend(tiny_tokenizer), RecordOnly(), Settings())).start()
    try:
        resp = httpx.post(server.base_url + "/v1/openclaw/sessions/x/end")
        assert_openai_error(resp, 501, code="unsupported")
        assert "sink" not in httpx.get(server.base_url + "/v1/openclaw/status").json()
    finally:
        server.stop()


@pytest.mark.parametrize(
    ("host", "key", "allowed"),
    [
        ("127.0.0.1", None, True),
        ("localhost", None, True),
        ("::1", None, True),
        ("127.0.0.2", None, True),
        ("0.0.0.0", None, False),
        ("192.168.1.20", None, False),
        ("my-host.lan", None, False),
        ("0.0.0.0", "", False),
        ("0.0.0.0", "k3y", True),
    ],
)
def test_non_loopback_bind_needs_an_api_key(host, key, allowed):
    settings = Settings(host=host, api_key=key)
    if allowed:
        check_bind(settings)
    else:
        with pytest.raises(ProxyConfigError, match="needs an API key"):
            check_bind(settings)


TOOLLESS_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_tools_a_template_drops_still_count_against_the_context(make_proxy, tiny_tokenizer):
    """Claude Code on SmolLM2 hung: the template dropped its 22 tools, the prompt looked small, no context error came.
    Now the client's tools count as their JSON text, count_tokens agrees, and status warns."""
    import copy

    hf = copy.deepcopy(tiny_tokenizer.hf)
    hf.chat_template = TOOLLESS_TEMPLATE
    small = HFChatTokenizer(hf, context_length=300)
    proxy = make_proxy(backend=FakeBackend(small, ["ok"]))
    tools = [
        {
            "name": f"tool_{i}",
            "description": "Does one thing to a file in the repository, with care. " * 3,
            "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
        }
        for i in range(6)
    ]
    openai_tools = [
        {"type": "function", "function": {"name": t["name"], "description": t["description"], "parameters": {}}}
        for t in tools
    ]
    body = {**ANTHROPIC_OK, "tools": tools}
    counted = proxy.post("/v1/messages/count_tokens", body).json()["input_tokens"]
    n_prompt = len(small.render(USER))
    assert counted > 300 > n_prompt  # the prompt alone would fit; with the tools the client sent it cannot
    message = assert_anthropic_error(proxy.post(MESSAGES, body), 400, "invalid_request_error")
    assert f"prompt is too long: {counted} tokens > 299 maximum" in message and "client's tools" in message
    message = assert_openai_error(
        proxy.post(CHAT, {**OPENAI_OK, "tools": openai_tools}), 400, code="context_length_exceeded"
    )
    assert "client's tools" in message
    assert proxy.backend.calls == []
    status = httpx.get(proxy.url + "/v1/openclaw/status").json()
    assert "drops tool definitions" in status["warnings"][0]
    # Without tools the same request is served.
    assert proxy.post(MESSAGES, ANTHROPIC_OK).status_code == 200


def test_an_image_for_a_text_only_model_is_a_clear_400_in_each_api(make_proxy):
    proxy = make_proxy("never sent")
    png = "iVBORw0KGgo="
    openai_image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{png}"}}
    chat = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, openai_image]}]
    message = assert_openai_error(proxy.post(CHAT, {**OPENAI_OK, "messages": chat}), 400, code="unsupported_content")
    assert message.startswith("messages[0].content[1] is an image (image_url), but the served model reads text only")
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}}
    anthropic_body = {**ANTHROPIC_OK, "messages": [{"role": "user", "content": [block]}]}
    assert "reads text only" in assert_anthropic_error(
        proxy.post(MESSAGES, anthropic_body), 400, "invalid_request_error"
    )
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    chat = [{"role": "user", "content": [audio]}]
    assert "is audio" in assert_openai_error(proxy.post(CHAT, {**OPENAI_OK, "messages": chat}), 400)
    assert proxy.backend.calls == [] and proxy.sink.exchanges == []
