"""A policy backend that goes down and comes back: while it is down every request gets 503 (OpenAI) or 529
overloaded_error (Anthropic) in its own format with Retry-After, status shows the outage, nothing is captured; once
it answers again serving resumes by itself, and SDK clients that retry ride through the outage."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import openai
import pytest

from openclaw_cli.backend import BackendError
from openclaw_cli.proxy import BackgroundServer, create_app
from openclaw_cli.settings import Settings
from openclaw_cli.testing.fake_backend import FakeBackend, MemorySink
from openclaw_cli.types import SampleResult, SamplingParams, StreamEvent

pytestmark = pytest.mark.timeout(60)

USER = [{"role": "user", "content": "Hello"}]
CHAT, MESSAGES = "/v1/chat/completions", "/v1/messages"


class FlakyBackend(FakeBackend):
    """Fails every sampling call with ``failure`` while ``down`` is true (optionally only the next ``fail_next``
    calls), like a sampler whose server crashed or is restarting; answers normally otherwise."""

    def __init__(self, tokenizer: Any, failure: BaseException, **kwargs: Any) -> None:
        super().__init__(tokenizer, default_reply="back again", **kwargs)
        self.failure = failure
        self.down = True
        self.fail_next: int | None = None
        self.attempts = 0

    def _check(self) -> None:
        self.attempts += 1
        if self.fail_next is not None:
            self.down = self.fail_next > 0
            self.fail_next -= 1
        if self.down:
            raise self.failure

    async def sample(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> SampleResult:
        self._check()
        return await super().sample(prompt_tokens, params, version)

    def stream(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        async def events() -> AsyncIterator[StreamEvent]:
            self._check()  # the failure surfaces on the first read, as a real stream's would
            async for event in super(FlakyBackend, self).stream(prompt_tokens, params, version):
                yield event

        return events()


@pytest.fixture
def serve(tiny_tokenizer: Any) -> Iterator[Any]:
    servers: list[BackgroundServer] = []

    def start(failure: BaseException, retry_after_s: int = 2) -> tuple[FlakyBackend, MemorySink, str]:
        backend = FlakyBackend(tiny_tokenizer, failure)
        sink = MemorySink()
        settings = Settings(proxy={"retry_after_s": retry_after_s})
        server = BackgroundServer(create_app(backend, sink, settings)).start()
        servers.append(server)
        return backend, sink, server.base_url

    yield start
    for server in servers:
        server.stop()


def post(url: str, path: str, stream: bool) -> httpx.Response:
    if path == CHAT:
        body: dict[str, Any] = {"model": "openclaw", "messages": USER, "stream": stream}
    else:
        body = {"model": "openclaw", "max_tokens": 16, "messages": USER, "stream": stream}
    return httpx.post(url + path, json=body, timeout=30)


DOWN = [
    pytest.param(BackendError("sampler restarting", retryable=True), "sampler restarting", id="retryable-BackendError"),
    pytest.param(ConnectionRefusedError(111, "Connection refused"), "ConnectionRefusedError", id="connection-refused"),
    pytest.param(TimeoutError("sampler did not answer"), "TimeoutError", id="timeout"),
]


@pytest.mark.parametrize(("failure", "mentions"), DOWN)
def test_backend_down_is_503_or_529_in_format_then_recovers(serve: Any, failure: BaseException, mentions: str) -> None:
    backend, sink, url = serve(failure)
    for stream in (False, True):
        resp = post(url, CHAT, stream)
        assert resp.status_code == 503 and resp.headers["retry-after"] == "2"
        error = resp.json()["error"]
        assert (error["type"], error["code"]) == ("server_error", "overloaded") and mentions in error["message"]
        resp = post(url, MESSAGES, stream)
        assert resp.status_code == 529 and resp.headers["retry-after"] == "2"
        assert resp.json() == {
            "type": "error",
            "error": {"type": "overloaded_error", "message": resp.json()["error"]["message"]},
        }
        assert mentions in resp.json()["error"]["message"]
    health = httpx.get(url + "/v1/openclaw/status", timeout=10).json()["backend_health"]
    assert (health["ok"], health["consecutive_failures"], health["failures"]) == (False, 4, 4)
    assert mentions in health["last_error"] and health["last_success_at"] is None
    assert sink.exchanges == []

    backend.down = False  # the sampler is back: the very next requests are served and captured
    assert post(url, CHAT, False).json()["choices"][0]["message"]["content"] == "back again"
    with httpx.stream(
        "POST", url + MESSAGES, json={"model": "openclaw", "max_tokens": 16, "messages": USER, "stream": True}
    ) as r:
        raw = b"".join(r.iter_bytes())
    assert r.status_code == 200 and b"event: message_stop" in raw
    status = httpx.get(url + "/v1/openclaw/status", timeout=10).json()
    assert status["backend_health"]["ok"] and status["backend_health"]["consecutive_failures"] == 0
    assert status["backend_health"]["failures"] == 4 and status["in_flight"] == 0
    assert len(sink.exchanges) == 2


def test_a_bug_in_the_backend_stays_a_500(serve: Any) -> None:
    _, _, url = serve(RuntimeError("unexpected bug"))
    resp = post(url, CHAT, False)
    assert resp.status_code == 500 and "retry-after" not in resp.headers


def test_sdk_clients_retry_through_a_short_outage(serve: Any) -> None:
    backend, sink, url = serve(BackendError("sampler restarting", retryable=True), retry_after_s=0)
    backend.fail_next = 2  # down for two attempts, then back
    started = time.monotonic()
    reply = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=3).chat.completions.create(
        model="openclaw", messages=USER
    )
    assert reply.choices[0].message.content == "back again" and backend.attempts == 3
    backend.fail_next = 2
    message = anthropic.Anthropic(base_url=url, api_key="x", max_retries=3).messages.create(
        model="openclaw", max_tokens=16, messages=USER
    )
    assert message.content[0].text == "back again" and backend.attempts == 6  # type: ignore[union-attr]
    assert time.monotonic() - started < 20 and len(sink.exchanges) == 2
