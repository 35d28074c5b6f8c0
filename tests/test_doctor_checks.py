"""`openclaw doctor`'s model checks with the tiny tokenizer: Claude Code's prompt against the context window, tools
in the rendered prompt, and a rendered tool call parsed back; plus the warnings when a template falls short."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from openclaw_cli import backend as registry
from openclaw_cli import cli as cli_module
from openclaw_cli import doctor_checks
from openclaw_cli.backend import Check
from openclaw_cli.doctor_checks import (
    AGENT_HEADROOM_TOKENS,
    DoctorCheck,
    agent_prompt,
    agent_prompt_tokens,
    context_check,
    load_agent_profile,
    load_tokenizer,
    model_checks,
    tool_call_round_trip_check,
    tools_render_check,
)
from openclaw_cli.settings import Settings
from openclaw_cli.tokenizer import HFChatTokenizer
from openclaw_cli.types import ParsedAssistant


def with_context(tokenizer: HFChatTokenizer, context: int) -> HFChatTokenizer:
    return HFChatTokenizer(tokenizer.hf, context_length=context)


class ToolBlindTokenizer(HFChatTokenizer):
    """A template that never shows tools to the model (as SmolLM2's GGUF template does)."""

    def render(self, messages, tools=None, *, add_generation_prompt=True):  # type: ignore[no-untyped-def]
        plain = [{k: v for k, v in m.items() if k != "tool_calls"} for m in messages]
        return super().render(plain, None, add_generation_prompt=add_generation_prompt)


class DeafParserTokenizer(HFChatTokenizer):
    """Renders tool calls fine, but its parser finds none (a markup mismatch between template and parser)."""

    def parse_assistant(self, text: str, *, tools_offered: bool = True) -> ParsedAssistant:
        return ParsedAssistant(content=text, tool_calls=[], reasoning="")


def test_the_packaged_profile_is_claude_codes_first_request() -> None:
    profile = load_agent_profile()
    assert profile["claude_code_version"].startswith("2.")
    assert len(profile["tools"]) == 24 and {"Bash", "Read", "Edit", "Write"} <= {t["name"] for t in profile["tools"]}
    elided = sum(int(n) for n in re.findall(r"\[(\d+) characters of Claude Code", json.dumps(profile)))
    messages, tools = agent_prompt(profile)
    assert len(tools) == 24 and all(t["type"] == "function" for t in tools)
    assert messages[0]["role"] == "system" and messages[0]["content"].startswith("You are a Claude agent")
    assert "x-anthropic-billing-header" not in json.dumps(messages)  # dropped, as the proxy drops it
    restored = json.dumps([messages, tools], ensure_ascii=False)
    assert "characters of Claude Code prompt text elided" not in restored
    assert elided == 58018
    # Each elided string comes back as stand-in prose of exactly the recorded length.
    tiny = {
        "system": "[123 characters of Claude Code prompt text elided]",
        "messages": [{"role": "user", "content": "hi"}],
    }
    (system, user), _ = agent_prompt(tiny)
    assert len(system["content"]) == 123 and system["content"] == doctor_checks.STAND_IN_PROSE[:123]
    assert user == {"role": "user", "content": "hi"}


def test_context_check_warns_exactly_below_prompt_plus_headroom(tiny_tokenizer) -> None:
    needed, dropped = agent_prompt_tokens(tiny_tokenizer)
    assert not dropped and needed > 10_000  # 24 tools and ~58k characters of prose
    enough = context_check(with_context(tiny_tokenizer, needed + AGENT_HEADROOM_TOKENS))
    assert (enough.ok, enough.warning) == (True, False)
    assert f"≈ {needed} tokens" in enough.detail
    short = context_check(with_context(tiny_tokenizer, needed + AGENT_HEADROOM_TOKENS - 1))
    assert (short.ok, short.warning) == (True, True)
    assert "prompt is too long" in short.detail and f"want ≥ {needed + AGENT_HEADROOM_TOKENS}" in short.detail


def test_a_template_that_drops_tools_is_counted_with_them_and_warned_about(tiny_tokenizer) -> None:
    blind = ToolBlindTokenizer(tiny_tokenizer.hf, context_length=1_000_000)
    messages, tools = agent_prompt()
    rendered = len(blind.render(messages, tools))
    as_json = len(blind.encode(json.dumps(tools, ensure_ascii=False)))
    assert agent_prompt_tokens(blind) == (rendered + as_json, True)
    assert "this template drops them" in context_check(blind).detail
    check = tools_render_check(blind)
    assert check.warning and "ignores the tools" in check.detail
    assert tool_call_round_trip_check(blind).warning


def test_tools_render_and_a_tool_call_round_trips_with_the_tiny_template(tiny_tokenizer) -> None:
    assert tools_render_check(tiny_tokenizer) == DoctorCheck(
        "chat template renders tools", True, "tool definitions reach the prompt"
    )
    check = tool_call_round_trip_check(tiny_tokenizer)
    assert (check.ok, check.warning) == (True, False), check.detail


def test_a_parser_that_cannot_read_the_template_is_a_warning(tiny_tokenizer) -> None:
    check = tool_call_round_trip_check(DeafParserTokenizer(tiny_tokenizer.hf))
    assert check.warning and "<tool_call>" in check.detail and "no call" in check.detail


def test_the_tokenizer_loads_from_a_local_model_dir_with_its_context(tiny_model_dir: Path) -> None:
    tokenizer, where = load_tokenizer(Settings(model=str(tiny_model_dir)))
    assert tokenizer is not None and where == str(tiny_model_dir)
    assert tokenizer.context_length == 4096  # max_position_embeddings of the tiny config
    checks = model_checks(Settings(model=str(tiny_model_dir)))
    assert [c.name for c in checks] == [
        "context fits an agent prompt",
        "chat template renders tools",
        "tool call round trip",
    ]
    assert checks[0].warning and not checks[1].warning and not checks[2].warning


def test_nothing_is_downloaded_or_converted_to_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (missing,) = model_checks(Settings(model="nobody-here/no-such-model-0"))
    assert missing.warning and "from local files" in missing.detail and "checks skipped" in missing.detail
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    (skipped,) = model_checks(Settings(model=str(gguf)))
    assert skipped.warning and "converted on first serve" in skipped.detail


def test_doctor_shows_warnings_without_failing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(registry, "diagnose_backend", lambda name, settings: [Check("backend stand-in", True, "test")])
    seen: list[Any] = []

    def fake_model_checks(settings: Settings) -> list[DoctorCheck]:
        seen.append(settings.model)
        return [DoctorCheck("tool call round trip", True, "parses back as no call", warning=True)]

    monkeypatch.setattr(doctor_checks, "model_checks", fake_model_checks)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = CliRunner().invoke(
        cli_module.app,
        ["doctor", "--port", str(port), "--model", "some/model", "--set", f"store.path={tmp_path}/s.sqlite3"],
        env={"COLUMNS": "200"},
    )
    assert result.exit_code == 0, result.output
    assert seen == ["some/model"]
    row = next(line for line in result.stdout.splitlines() if "tool call round trip" in line)
    assert "!" in row and "parses back as no call" in row
    assert "checks passed" in result.stdout
