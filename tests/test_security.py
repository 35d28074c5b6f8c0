"""Security and bad input at the proxy's edge: the API key on every route, the bind rule on every entry point,
secrets kept out of the store / logs / exports / `config show`, body size, message and tool counts, the in-flight
cap, and the per-request opt-out header."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import openai
import pytest
from api_shapes import assert_anthropic_error, assert_openai_error
from runtime_helpers import became_true
from starlette.routing import Route
from starlette.testclient import TestClient
from starlette.websockets import WebSocketDisconnect
from typer.testing import CliRunner

from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.cli import app as cli_app
from openclaw_cli.commands.export import ExportFilters, ExportFormat, export_turns
from openclaw_cli.proxy import BackgroundServer, ProxyConfigError, create_app
from openclaw_cli.proxy import auth as auth_module
from openclaw_cli.proxy import server as server_module
from openclaw_cli.proxy.auth import OPEN_PATHS, key_matches
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store
from openclaw_cli.testing.fake_backend import FakeBackend, MemorySink

KEY = "proxy-KEY-5f1d0c9e7a"
USER = [{"role": "user", "content": "Hello"}]
OPENAI_OK = {"model": "openclaw", "messages": USER}
ANTHROPIC_OK = {"model": "openclaw", "max_tokens": 16, "messages": USER}
CHAT, MESSAGES, COUNT = "/v1/chat/completions", "/v1/messages", "/v1/messages/count_tokens"


@dataclass
class Proxy:
    backend: FakeBackend
    store: Store
    sink: SessionCapture
    server: BackgroundServer
    app: Any

    @property
    def url(self) -> str:
        return self.server.base_url

    def turn_count(self) -> int:
        return sum(1 for _ in self.store.iter_turns())


@pytest.fixture
def make_proxy(tiny_tokenizer, tmp_path: Path) -> Iterator[Callable[..., Proxy]]:
    made: list[Proxy] = []

    def make(settings: Settings | None = None, *, token_delay_s: float = 0.0, **settings_fields: Any) -> Proxy:
        if settings is None:
            settings = Settings(store={"path": tmp_path / f"store{len(made)}.sqlite3"}, **settings_fields)
        store = Store(settings.store.path)
        sink = SessionCapture(store, settings)
        backend = FakeBackend(tiny_tokenizer, token_delay_s=token_delay_s, default_reply="Hi there.")
        app = create_app(backend, sink, settings)
        proxy = Proxy(backend, store, sink, BackgroundServer(app).start(), app)
        made.append(proxy)
        return proxy

    yield make
    for proxy in made:
        proxy.server.stop()
        proxy.store.close()


# -- the API key on every route ------------------------------------------------------------------------------------

# A valid request per route, for the "right key gets through" half. A route missing here still gets the 401 checks;
# the right-key check then only asserts the key was accepted (any status but 401).
VALID_BODY: dict[str, Any] = {CHAT: OPENAI_OK, MESSAGES: ANTHROPIC_OK, COUNT: {"model": "openclaw", "messages": USER}}
PATH_VALUES = {"model_id": "openclaw", "session_id": "sess-1", "lesson_id": "1"}


def _concrete(path: str) -> str:
    for name, value in PATH_VALUES.items():
        path = path.replace(f"{{{name}:path}}", value).replace(f"{{{name}}}", value)
    assert "{" not in path, f"route {path} has a parameter this test does not know; add it to PATH_VALUES"
    return path


def _leaf_routes(routes: list[Any]) -> Iterator[Route]:
    for route in routes:
        if isinstance(route, Route):
            yield route
        elif hasattr(route, "routes"):
            yield from _leaf_routes(route.routes)
        else:
            raise AssertionError(f"unexpected route type {type(route).__name__}: teach this test about it")


def _route_calls(app: Any) -> list[tuple[str, str]]:
    return [
        (method, _concrete(route.path)) for route in _leaf_routes(app.routes) for method in sorted(route.methods or {})
    ]


def _request(proxy: Proxy, method: str, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    body = VALID_BODY.get(path) if method == "POST" else None
    return httpx.request(method, proxy.url + path, json=body, headers=headers or {}, timeout=30)


def _assert_unauthorized(resp: httpx.Response, path: str, method: str) -> None:
    if method == "HEAD":  # no body to check
        assert resp.status_code == 401
        return
    if path.startswith(MESSAGES):
        assert_anthropic_error(resp, 401, "authentication_error")
    else:
        assert_openai_error(resp, 401, code="invalid_api_key", kind="invalid_request_error")
    assert resp.headers["x-should-retry"] == "false"


def test_every_route_needs_the_key_on_a_public_bind(make_proxy):
    proxy = make_proxy(host="0.0.0.0", api_key=KEY)
    calls = _route_calls(proxy.app)
    assert {path for _, path in calls} >= {CHAT, MESSAGES, COUNT, "/v1/models", "/v1/openclaw/status"}
    wrong_keys = [
        {},
        {"authorization": "Bearer nope"},
        {"x-api-key": KEY[:-1]},
        {"x-api-key": KEY + "x"},
        {"authorization": f"Basic {KEY}"},
        {"authorization": "Bearer"},
    ]
    for method, path in calls:
        if path in OPEN_PATHS:
            continue
        for headers in wrong_keys:
            _assert_unauthorized(_request(proxy, method, path, headers), path, method)
        # the key in the query string is not a way in
        resp = httpx.request(method, f"{proxy.url}{path}?api_key={KEY}", timeout=30)
        _assert_unauthorized(resp, path, method)
    assert proxy.backend.calls == [] and proxy.turn_count() == 0

    served = {*VALID_BODY, "/v1/models", "/v1/models/openclaw", "/v1/openclaw/status"}
    served.add("/v1/openclaw/sessions/sess-1/end")
    for method, path in calls:
        for headers in ({"authorization": f"Bearer {KEY}"}, {"x-api-key": KEY}, {"authorization": f"bearer {KEY}"}):
            resp = _request(proxy, method, path, headers)
            if path in served:
                assert resp.status_code == 200, (method, path, resp.text)
            else:  # a route this test has no valid request for: the key must at least have been accepted
                assert resp.status_code != 401, (method, path)


def test_unknown_paths_do_not_reveal_themselves_without_the_key(make_proxy):
    proxy = make_proxy(host="0.0.0.0", api_key=KEY)
    assert_openai_error(httpx.get(proxy.url + "/v1/nope"), 401)
    assert_anthropic_error(httpx.post(proxy.url + "/v1/messages/batches", json={}), 401, "authentication_error")
    assert_openai_error(httpx.get(proxy.url + "/v1/nope", headers={"x-api-key": KEY}), 404)


def test_liveness_probes_stay_open_and_reveal_nothing(make_proxy):
    proxy = make_proxy(host="0.0.0.0", api_key=KEY)
    assert httpx.get(proxy.url + "/healthz").json() == {"status": "ok"}
    assert httpx.get(proxy.url + "/").json() == {"status": "ok", "service": "openclaw proxy"}
    assert httpx.head(proxy.url + "/").status_code == 200
    assert {"/", "/healthz"} == OPEN_PATHS


def test_keys_are_compared_in_constant_time(monkeypatch):
    seen: list[tuple[bytes, bytes]] = []

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return a == b

    monkeypatch.setattr(auth_module.hmac, "compare_digest", spy)
    assert key_matches("abc", "abc") and not key_matches("abd", "abc") and not key_matches(None, "abc")
    assert seen == [(b"abc", b"abc"), (b"abd", b"abc")]


def test_a_websocket_without_the_key_is_refused(tiny_tokenizer):
    app = create_app(FakeBackend(tiny_tokenizer), MemorySink(), Settings(api_key=KEY))
    with (
        TestClient(app) as client,
        pytest.raises(WebSocketDisconnect) as refused,
        client.websocket_connect("/v1/anything"),
    ):
        pass
    assert refused.value.code == 1008


# -- the bind rule on every entry point ----------------------------------------------------------------------------


@pytest.mark.parametrize("key", [None, "", "   "])
def test_create_app_refuses_a_public_host_without_a_key(tiny_tokenizer, key):
    with pytest.raises(ProxyConfigError, match="needs an API key"):
        create_app(FakeBackend(tiny_tokenizer), MemorySink(), Settings(host="0.0.0.0", api_key=key))
    create_app(FakeBackend(tiny_tokenizer), MemorySink(), Settings(host="0.0.0.0", api_key=KEY))
    create_app(FakeBackend(tiny_tokenizer), MemorySink(), Settings(host="127.0.0.1", api_key=key))


def test_run_server_refuses_before_loading_anything(monkeypatch, tmp_path):
    def must_not_load(settings: Settings) -> None:
        raise AssertionError("the backend was created before the bind check")

    monkeypatch.setattr(server_module, "create_backend", must_not_load)
    settings = Settings(host="192.168.1.20", store={"path": tmp_path / "s.sqlite3"})
    with pytest.raises(ProxyConfigError, match="needs an API key"):
        server_module.run_server(settings)
    assert not (tmp_path / "s.sqlite3").exists()


# -- secrets never stored, logged, exported or shown ---------------------------------------------------------------

SECRETS = {
    "header_auth_token": "hdr-AUTH-tok-0001",
    "cookie": "cookie-SEKRIT-0002",
    "proxy_auth": "proxyauth-0003",
    "goog_key": "goog-KEY-0004",
    "client_secret": "clientsecret-0005",
    "body_api_key": "body-apikey-0006",
    "body_nested": "body-nested-0007",
    "anthropic_meta_key": "meta-apikey-0008",
    "judge_key": "judge-KEY-0009",
    "tinker_key": "tml-TINKER-0010",
    "fireworks_key": "fw_FIREWORKS0011",
}


def _secret_headers() -> dict[str, str]:
    return {
        "authorization": f"Bearer {KEY}",
        "x-auth-token": SECRETS["header_auth_token"],
        "cookie": f"session={SECRETS['cookie']}",
        "proxy-authorization": f"Basic {SECRETS['proxy_auth']}",
        "x-goog-api-key": SECRETS["goog_key"],
        "x-client-secret": SECRETS["client_secret"],
        "x-session-id": "visible-session",
    }


def _assert_no_secret(text: str | bytes, where: str) -> None:
    data = text.encode() if isinstance(text, str) else text
    for name, secret in {**SECRETS, "proxy_key": KEY}.items():
        assert secret.encode() not in data, f"{name} leaked into {where}"


def test_secrets_reach_no_store_log_export_status_or_config_show(make_proxy, tmp_path, caplog, monkeypatch):
    caplog.set_level(logging.DEBUG)
    store_path = tmp_path / "secrets.sqlite3"
    settings = Settings(
        host="0.0.0.0",
        api_key=KEY,
        store={"path": store_path},
        judge={"api_key": SECRETS["judge_key"]},
        tinker={"api_key": SECRETS["tinker_key"]},
        fireworks={"api_key": SECRETS["fireworks_key"]},
    )
    proxy = make_proxy(settings)
    headers = _secret_headers()
    openai_body = {
        **OPENAI_OK,
        "api_key": SECRETS["body_api_key"],
        "metadata": {"note": "kept", "credentials": {"secret": SECRETS["body_nested"]}},
    }
    anthropic_body = {**ANTHROPIC_OK, "metadata": {"user_id": "u-1", "api_key": SECRETS["anthropic_meta_key"]}}
    for body, path in ((openai_body, CHAT), (anthropic_body, MESSAGES)):
        for stream in (False, True):
            resp = httpx.post(proxy.url + path, json={**body, "stream": stream}, headers=headers, timeout=30)
            assert resp.status_code == 200, resp.text
    assert httpx.post(proxy.url + COUNT, json=VALID_BODY[COUNT], headers=headers).status_code == 200
    status = httpx.get(proxy.url + "/v1/openclaw/status", headers=headers)
    assert status.status_code == 200
    _assert_no_secret(status.text, "the status endpoint")

    turns = list(proxy.store.iter_turns())
    assert len(turns) == 4
    for turn in turns:
        assert turn.headers["x-session-id"] == "visible-session"  # harmless headers are still kept
        assert not {"authorization", "x-auth-token", "cookie", "proxy-authorization"} & set(turn.headers)
        assert not {"x-goog-api-key", "x-client-secret"} & set(turn.headers)
    assert turns[0].request["metadata"] == {"note": "kept", "credentials": {}}

    for fmt in ExportFormat:
        out = io.StringIO()
        assert export_turns(proxy.store, fmt, ExportFilters(), out) == 4
        _assert_no_secret(out.getvalue(), f"export --format {fmt.value}")

    proxy.server.stop()
    proxy.store.close()
    for suffix in ("", "-wal", "-shm"):
        file = Path(f"{store_path}{suffix}")
        if file.exists():
            _assert_no_secret(file.read_bytes(), f"the store file {file.name}")

    # Client-side transport logs (httpx/httpcore) are the test's own; everything the proxy logged is checked.
    proxy_logs = "\n".join(
        f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records if not r.name.startswith("http")
    )
    _assert_no_secret(proxy_logs, "the logs")

    monkeypatch.chdir(tmp_path)
    for name, value in (
        ("OPENCLAW_API_KEY", KEY),
        ("OPENCLAW_JUDGE__API_KEY", SECRETS["judge_key"]),
        ("OPENCLAW_TINKER__API_KEY", SECRETS["tinker_key"]),
        ("OPENCLAW_FIREWORKS__API_KEY", SECRETS["fireworks_key"]),
    ):
        monkeypatch.setenv(name, value)
    runner = CliRunner()
    for args in (["config", "show"], ["config", "show", "--json"]):
        result = runner.invoke(cli_app, args, env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output
        assert "**** (set)" in result.output
        _assert_no_secret(result.output, " ".join(args))


# -- size and count limits -----------------------------------------------------------------------------------------


def _chunked(payload: bytes, size: int = 1024) -> Iterator[bytes]:
    for start in range(0, len(payload), size):
        yield payload[start : start + size]


def test_oversized_chunked_bodies_are_413_while_reading(make_proxy):
    proxy = make_proxy(proxy={"max_body_bytes": 2048})
    big_openai = json.dumps({**OPENAI_OK, "pad": "x" * 6000}).encode()
    big_anthropic = json.dumps({**ANTHROPIC_OK, "pad": "x" * 6000}).encode()
    resp = httpx.post(proxy.url + CHAT, content=_chunked(big_openai), timeout=30)
    assert "content-length" not in resp.request.headers and resp.request.headers["transfer-encoding"] == "chunked"
    assert_openai_error(resp, 413, code="request_too_large")
    assert_anthropic_error(
        httpx.post(proxy.url + MESSAGES, content=_chunked(big_anthropic), timeout=30), 413, "request_too_large"
    )
    assert_anthropic_error(
        httpx.post(proxy.url + COUNT, content=_chunked(big_anthropic), timeout=30), 413, "request_too_large"
    )
    small = json.dumps(OPENAI_OK).encode()
    assert httpx.post(proxy.url + CHAT, content=_chunked(small, 7), timeout=30).status_code == 200
    assert len(proxy.backend.calls) == 1


def test_message_and_tool_counts_are_capped(make_proxy):
    proxy = make_proxy(proxy={"max_messages": 3, "max_tools": 1})
    four = [{"role": "user", "content": f"m{i}"} for i in range(4)]
    tool = {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}
    msg = assert_openai_error(httpx.post(proxy.url + CHAT, json={**OPENAI_OK, "messages": four}), 400)
    assert "holds 4 messages; at most 3" in msg and "proxy.max_messages" in msg
    resp = httpx.post(proxy.url + CHAT, json={**OPENAI_OK, "tools": [tool, tool]})
    assert "at most 1 are accepted (proxy.max_tools)" in assert_openai_error(resp, 400)
    assert resp.json()["error"]["param"] == "tools"
    assert_anthropic_error(
        httpx.post(proxy.url + MESSAGES, json={**ANTHROPIC_OK, "messages": four}), 400, "invalid_request_error"
    )
    anthropic_tool = {"name": "a", "input_schema": {"type": "object"}}
    resp = httpx.post(proxy.url + COUNT, json={**VALID_BODY[COUNT], "tools": [anthropic_tool] * 2})
    assert_anthropic_error(resp, 400, "invalid_request_error")
    assert proxy.backend.calls == [] and proxy.turn_count() == 0
    assert httpx.post(proxy.url + CHAT, json={**OPENAI_OK, "messages": four[:3], "tools": [tool]}).status_code == 200


def test_the_in_flight_cap_answers_busy_in_each_format_with_retry_after(make_proxy):
    proxy = make_proxy(proxy={"max_in_flight": 1, "retry_after_s": 3}, token_delay_s=0.05)
    proxy.backend.default_reply = "One two three four five six seven eight nine ten eleven twelve."
    started = threading.Event()
    finished: list[int] = []

    def slow_stream() -> None:
        with httpx.stream("POST", proxy.url + CHAT, json={**OPENAI_OK, "stream": True}, timeout=30) as resp:
            for _ in resp.iter_lines():
                started.set()
            finished.append(resp.status_code)

    worker = threading.Thread(target=slow_stream)
    worker.start()
    assert started.wait(10)
    busy = httpx.post(proxy.url + CHAT, json=OPENAI_OK, timeout=30)
    assert "proxy.max_in_flight" in assert_openai_error(busy, 429, code="rate_limit_exceeded", kind="rate_limit_error")
    assert busy.headers["retry-after"] == "3"
    busy = httpx.post(proxy.url + MESSAGES, json=ANTHROPIC_OK, timeout=30)
    assert_anthropic_error(busy, 529, "overloaded_error")
    assert busy.headers["retry-after"] == "3"
    with pytest.raises(openai.RateLimitError):
        openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0).chat.completions.create(
            model="openclaw", messages=USER
        )
    with pytest.raises(anthropic.OverloadedError):
        anthropic.Anthropic(base_url=proxy.url, api_key="x", max_retries=0).messages.create(
            model="openclaw", max_tokens=5, messages=USER
        )
    # Monitoring and listing answer however busy the proxy is.
    for path in ("/healthz", "/v1/openclaw/status", "/v1/models"):
        assert httpx.get(proxy.url + path, timeout=10).status_code == 200
    worker.join(30)
    assert finished == [200]
    assert httpx.post(proxy.url + CHAT, json=OPENAI_OK, timeout=30).status_code == 200  # the slot came back
    assert len(proxy.backend.calls) == 2


def test_requests_without_the_key_get_401_not_a_slot(make_proxy):
    """The key check runs before the cap: a flood of unauthenticated requests is refused as such and never takes
    the slot a real client needs."""
    proxy = make_proxy(api_key=KEY, proxy={"max_in_flight": 1}, token_delay_s=0.05)
    proxy.backend.default_reply = "One two three four five six seven eight nine ten."
    started = threading.Event()

    def slow_stream() -> None:
        body = {**OPENAI_OK, "stream": True}
        with httpx.stream("POST", proxy.url + CHAT, json=body, headers={"x-api-key": KEY}, timeout=30) as resp:
            for _ in resp.iter_lines():
                started.set()

    worker = threading.Thread(target=slow_stream)
    worker.start()
    assert started.wait(10)
    assert_openai_error(httpx.post(proxy.url + CHAT, json=OPENAI_OK), 401)  # refused for the key, not for load
    assert_openai_error(httpx.post(proxy.url + CHAT, json=OPENAI_OK, headers={"x-api-key": KEY}), 429)
    worker.join(30)
    assert httpx.post(proxy.url + CHAT, json=OPENAI_OK, headers={"x-api-key": KEY}).status_code == 200


# -- opt-out -------------------------------------------------------------------------------------------------------


def test_opted_out_exchanges_are_served_and_never_stored(make_proxy, tmp_path):
    store_path = tmp_path / "optout.sqlite3"
    proxy = make_proxy(Settings(store={"path": store_path}))
    marker = "zebra-opt-out-marker-4711"
    opt_out = {"X-OpenClaw-Opt-Out": "1"}
    body = {**OPENAI_OK, "messages": [{"role": "user", "content": marker}]}
    assert httpx.post(proxy.url + CHAT, json=body, headers=opt_out).json()["choices"][0]["message"]["content"]
    streamed = httpx.post(proxy.url + CHAT, json={**body, "stream": True}, headers={"x-openclaw-opt-out": "true"})
    assert streamed.status_code == 200 and "[DONE]" in streamed.text
    anthropic_body = {**ANTHROPIC_OK, "messages": [{"role": "user", "content": marker}]}
    assert httpx.post(proxy.url + MESSAGES, json=anthropic_body, headers=opt_out).status_code == 200
    assert proxy.turn_count() == 0
    status = httpx.get(proxy.url + "/v1/openclaw/status").json()
    assert status["opted_out"] == 3

    # "0" is not an opt-out: that exchange is stored.
    assert httpx.post(proxy.url + CHAT, json=OPENAI_OK, headers={"x-openclaw-opt-out": "0"}).status_code == 200
    assert became_true(lambda: proxy.turn_count() == 1)
    proxy.server.stop()
    proxy.store.close()
    raw = b"".join(Path(f"{store_path}{s}").read_bytes() for s in ("", "-wal") if Path(f"{store_path}{s}").exists())
    assert marker.encode() not in raw


def test_status_reports_opt_outs_in_process(tiny_tokenizer):
    """The recorder skips the sink for opted-out exchanges without touching it (no sink call at all)."""
    sink = MemorySink(fail_with=RuntimeError("the sink must not be called"))
    app = create_app(FakeBackend(tiny_tokenizer), sink, Settings())
    with TestClient(app) as client:
        resp = client.post(CHAT, json=OPENAI_OK, headers={"x-openclaw-opt-out": "yes"})
        assert resp.status_code == 200
        status = client.get("/v1/openclaw/status").json()
    assert (status["capture_failures"], status["opted_out"], sink.exchanges) == (0, 1, [])
