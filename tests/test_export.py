"""``openclaw export``: both formats, every filter, the CLI surface, parsed back."""

from __future__ import annotations

import datetime as dt
import io
import json
import stat
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from openclaw_cli.capture import CapturedExchange
from openclaw_cli.capture.sessions import SessionCapture
from openclaw_cli.commands.export import ExportFilters, ExportFormat, export_turns, parse_since
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store

SYSTEM = {"role": "system", "content": "sys"}
T0 = 1_700_000_000.0


def _exchange(
    messages: list[dict[str, Any]], reply: str, *, headers: dict[str, str], tokens: list[int]
) -> CapturedExchange:
    return CapturedExchange(
        api="openai",
        headers=headers,
        request={"model": "openclaw-policy"},
        messages=messages,
        tools=[{"type": "function", "function": {"name": "f", "parameters": {}}}],
        model="openclaw-policy",
        prompt_tokens=tokens,
        completion_tokens=[tokens[-1] + 1, 2],
        logprobs=[-0.125, -2.5],
        sampling_logprobs=[-0.1, -2.0],
        version=len(tokens),
        finish_reason="stop",
        assistant_message={"role": "assistant", "content": reply},
        response={},
        started_at=0.0,
        first_token_at=0.0,
        finished_at=0.0,
    )


class _Clock:
    now = T0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def populated(tmp_path: Path) -> Path:
    """Session a: two main turns (first ready with reward 1, second pending) and one side turn, at T0..T0+2;
    session b: one main turn at T0+100."""
    path = tmp_path / "store.sqlite3"
    clock = _Clock()
    with Store(path) as store:
        capture = SessionCapture(store, Settings(), clock=clock)
        u1, u2 = {"role": "user", "content": "q1"}, {"role": "user", "content": "q2"}
        first = capture.record_sync(_exchange([SYSTEM, u1], "a1", headers={"x-session-id": "a"}, tokens=[1, 2]))
        clock.now += 1
        capture.record_sync(
            _exchange(
                [SYSTEM, u1, {"role": "assistant", "content": "a1"}, u2],
                "a2",
                headers={"x-session-id": "a"},
                tokens=[3],
            )
        )
        clock.now += 1
        capture.record_sync(
            _exchange([SYSTEM, u1], "t", headers={"x-session-id": "a", "x-turn-type": "side"}, tokens=[4, 5, 6])
        )
        clock.now += 98
        capture.record_sync(_exchange([SYSTEM, u2], "b1", headers={"x-session-id": "b"}, tokens=[7]))
        assert store.complete("judge", first.turn_id, '{"score": 1}', reward=1.0)
    return path


def _export(path: Path, fmt: ExportFormat, **filters: Any) -> list[dict[str, Any]]:
    out = io.StringIO()
    with Store(path, create=False) as store:
        count = export_turns(store, fmt, ExportFilters(**filters), out)
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(rows) == count
    return rows


def test_messages_format(populated: Path) -> None:
    rows = _export(populated, ExportFormat.messages)
    assert [(r["session_id"], r["turn_id"], r["type"], r["status"]) for r in rows] == [
        ("a", 1, "main", "ready"),
        ("a", 2, "main", "pending"),
        ("a", 3, "side", "skipped"),
        ("b", 4, "main", "pending"),
    ]
    first = rows[0]
    assert first["messages"] == [SYSTEM, {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}]
    assert first["next_state"] == [{"role": "user", "content": "q2"}] and first["next_state_role"] == "user"
    assert (first["reward"], first["turn_index"], first["parent_turn_id"], first["version"]) == (1.0, 0, None, 2)
    assert first["tools"][0]["function"]["name"] == "f"
    assert rows[1]["reward"] is None and rows[1]["parent_turn_id"] == 1 and rows[2]["turn_index"] == -1


def test_tokens_format(populated: Path) -> None:
    rows = _export(populated, ExportFormat.tokens)
    first = rows[0]
    assert first["prompt_tokens"] == [1, 2] and first["completion_tokens"] == [3, 2]
    assert first["logprobs"] == [-0.125, -2.5] and first["sampling_logprobs"] == [-0.1, -2.0]
    assert (first["version"], first["reward"], first["type"]) == (2, 1.0, "main")
    assert "messages" not in first
    assert [r["prompt_tokens"] for r in rows] == [[1, 2], [3], [4, 5, 6], [7]]


def test_filters(populated: Path) -> None:
    def ids(**filters: Any) -> list[int]:
        return [r["turn_id"] for r in _export(populated, ExportFormat.tokens, **filters)]

    assert ids(session_ids=("b",)) == [4]
    assert ids(session_ids=("a", "b"), turn_type="main") == [1, 2, 4]
    assert ids(turn_type="side") == [3]
    assert ids(status="pending") == [2, 4]
    assert ids(status="ready", turn_type="main") == [1]
    assert ids(since=T0 + 1) == [2, 3, 4]
    assert ids(since=T0 + 50, session_ids=("a",)) == []


def test_parse_since() -> None:
    assert parse_since("1700000000") == 1_700_000_000.0
    assert parse_since("2h", now=10_000.0) == 10_000.0 - 7200
    assert parse_since("30m", now=10_000.0) == 10_000.0 - 1800
    assert parse_since("7d", now=1e6) == 1e6 - 7 * 86400
    assert parse_since("2023-11-14T22:13:20+00:00") == 1_700_000_000.0
    assert parse_since("2024-01-02") == dt.datetime(2024, 1, 2).timestamp()
    with pytest.raises(ValueError, match="--since"):
        parse_since("yesterday")


def _cli() -> typer.Typer:
    # The real command tree: its group maps CliFailure / SettingsError to one error line and the exit-code policy.
    from openclaw_cli.cli import app

    return app


def test_cli_writes_private_jsonl(populated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "export.jsonl"
    result = CliRunner().invoke(
        _cli(),
        ["export", "--set", f"store.path={populated}", "--format", "tokens", "--type", "main", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["turn_id"] for r in rows] == [1, 2, 4]
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_cli_stdout_with_config_file(populated: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "custom.toml"
    config.write_text(f'[store]\npath = "{populated}"\n')
    result = CliRunner().invoke(
        _cli(), ["export", "--config", str(config), "--session", "a", "--status", "ready", "--since", "1700000000"]
    )
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["turn_id"], r["messages"][-1]["content"]) for r in rows] == [(1, "a1")]


def test_cli_errors_are_clear(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    missing = CliRunner().invoke(_cli(), ["export", "--set", f"store.path={tmp_path / 'none.sqlite3'}"])
    assert missing.exit_code == 1 and "no store at" in missing.output
    assert not (tmp_path / "none.sqlite3").exists()
    bad_since = CliRunner().invoke(_cli(), ["export", "--since", "soon"])
    # Refused input exits 2 in every command (the exit-code policy in openclaw_cli/command_support.py).
    assert bad_since.exit_code == 2 and "--since expects" in bad_since.output
    bad_setting = CliRunner().invoke(_cli(), ["export", "--set", "store.nope=1"])
    assert bad_setting.exit_code == 2 and "store.nope" in bad_setting.output
    for command in (["eval"], ["train"], ["rollback"], ["status"]):
        same = CliRunner().invoke(_cli(), [*command, "--set", "store.nope=1"])
        assert same.exit_code == 2 and "store.nope" in same.output, command
    written = CliRunner().invoke(_cli(), ["export", "-c", str(tmp_path / "absent.toml")])
    assert written.exit_code == 2 and "absent.toml" in written.output
