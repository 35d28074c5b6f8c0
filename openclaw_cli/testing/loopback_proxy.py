"""The proxy app on a loopback port over a :class:`~openclaw_cli.testing.fake_backend.FakeBackend`, with the real
SDK clients pointed at it: what the API tests share (the ``make_proxy`` fixture in ``tests/conftest.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from openclaw_cli.proxy import BackgroundServer
from openclaw_cli.testing.fake_backend import FakeBackend

OPENAI_TEST_KEY = "sk-test-secret"
ANTHROPIC_TEST_KEY = "sk-ant-test-secret"


@dataclass
class LoopbackProxy:
    backend: FakeBackend
    sink: Any  # a MemorySink, or whatever the test captured into
    server: BackgroundServer

    @property
    def url(self) -> str:
        return self.server.base_url

    def openai(self) -> Any:
        import openai

        return openai.OpenAI(base_url=self.url + "/v1", api_key=OPENAI_TEST_KEY, max_retries=0)

    def async_openai(self) -> Any:
        import openai

        return openai.AsyncOpenAI(base_url=self.url + "/v1", api_key=OPENAI_TEST_KEY, max_retries=0)

    def anthropic(self, **kwargs: Any) -> Any:
        import anthropic

        kwargs.setdefault("api_key", ANTHROPIC_TEST_KEY)
        return anthropic.Anthropic(base_url=self.url, max_retries=0, **kwargs)

    def async_anthropic(self) -> Any:
        import anthropic

        return anthropic.AsyncAnthropic(base_url=self.url, api_key=ANTHROPIC_TEST_KEY, max_retries=0)

    def post(self, path: str, body: Any, **kwargs: Any) -> httpx.Response:
        """A raw request: ``body`` as JSON, or as the exact bytes when it is bytes."""
        if isinstance(body, bytes):
            return httpx.post(self.url + path, content=body, timeout=30, **kwargs)
        return httpx.post(self.url + path, json=body, timeout=30, **kwargs)

    def status(self, **kwargs: Any) -> dict[str, Any]:
        return httpx.get(self.url + "/v1/openclaw/status", timeout=10, **kwargs).json()
