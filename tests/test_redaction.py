"""store.redact: what is found and replaced, what is left alone, and where it applies (judge prompts, cloud
training, export), with the stored turn itself kept verbatim so its token ids stay consistent."""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from openclaw_cli.capture.redaction import ALL_KINDS, Redactor, enabled_kinds, withhold_from_training
from openclaw_cli.commands.export import ExportFilters, ExportFormat, export_turns
from openclaw_cli.learn.judge import JudgeLoop
from openclaw_cli.learn.trainer_loop import TrainerLoop
from openclaw_cli.settings import Settings, SettingsError, load_settings
from openclaw_cli.store import Store, TurnRecord
from openclaw_cli.testing.store_turns import new_turn

EMAIL = "jane.doe+work@mail.example.co.uk"
OPENAI_KEY = "sk-proj-Abc123Def456Ghi789Jkl012"
ANTHROPIC_KEY = "sk-ant-api03-AAAAbbbbCCCCdddd1234-_x"
TINKER_KEY = "tml-0123456789abcdefXYZ"
FIREWORKS_KEY = "fw_3ZkQ9x7Lm2Np4Rt6Vw8Y"
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
GITHUB_TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"
RANDOM_TOKEN = "Zx8Qw2Lp9Rt4Vb7Nm3Kc6Hj1Gf5Ds0Ae"  # 33 random-looking base62 characters
PHONE_US = "(415) 555-0132"
PHONE_INTL = "+44 20 7946 0958"
SECRETS = [EMAIL, OPENAI_KEY, ANTHROPIC_KEY, TINKER_KEY, FIREWORKS_KEY, AWS_KEY, GITHUB_TOKEN, RANDOM_TOKEN]


@pytest.fixture
def redactor() -> Redactor:
    return Redactor(ALL_KINDS)


# -- settings ------------------------------------------------------------------------------------------------------


def test_the_setting_takes_a_bool_or_a_list_of_kinds(monkeypatch):
    assert enabled_kinds(Settings().store.redact) == ()
    assert enabled_kinds(Settings(store={"redact": True}).store.redact) == ("email", "api_key", "phone")
    assert enabled_kinds(Settings(store={"redact": ["phone", "email"]}).store.redact) == ("email", "phone")
    monkeypatch.setenv("OPENCLAW_STORE__REDACT", '["api_key"]')
    assert enabled_kinds(load_settings().store.redact) == ("api_key",)
    with pytest.raises(SettingsError, match=r"store\.redact"):
        load_settings({"store": {"redact": ["ssn"]}})
    assert not Redactor().enabled and Redactor(["email"]).enabled


# -- detection -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"mail {EMAIL}, thanks", "mail [REDACTED_EMAIL], thanks"),
        (f"key={OPENAI_KEY}", "key=[REDACTED_API_KEY]"),
        (f"export ANTHROPIC_API_KEY={ANTHROPIC_KEY}", "export ANTHROPIC_API_KEY=[REDACTED_API_KEY]"),
        (f"tinker {TINKER_KEY} fireworks {FIREWORKS_KEY}", "tinker [REDACTED_API_KEY] fireworks [REDACTED_API_KEY]"),
        (f"aws_access_key_id = {AWS_KEY}", "aws_access_key_id = [REDACTED_API_KEY]"),
        (f"token {GITHUB_TOKEN}.", "token [REDACTED_API_KEY]."),
        (f"the value {RANDOM_TOKEN} here", "the value [REDACTED_API_KEY] here"),
        ('{"client_secret": "s3cr3tValue99"}', '{"client_secret": "[REDACTED_API_KEY]"}'),
        ("PASSWORD='hunter2hunter2'", "PASSWORD='[REDACTED_API_KEY]'"),
        ("Authorization: Bearer abcDEF123456ghiJKL", "Authorization: [REDACTED_API_KEY]"),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N", "jwt [REDACTED_API_KEY]"),
        (
            "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\nIBAAK\n-----END RSA PRIVATE KEY-----\nafter",
            "[REDACTED_API_KEY]\nafter",
        ),
        (f"call {PHONE_US} or {PHONE_INTL}.", "call [REDACTED_PHONE] or [REDACTED_PHONE]."),
        ("cell 415-555-0132", "cell [REDACTED_PHONE]"),
    ],
)
def test_each_kind_is_replaced_by_its_placeholder(redactor, text, expected):
    assert redactor.redact_text(text) == expected


@pytest.mark.parametrize(
    "text",
    [
        "commit 3f786850e387550fdab836ed7e6dc881de23001b",  # git SHA-1 (lower-case hex)
        "sha256 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
        "session c52ca2c4-5ad0-4922-bed7-2040f853322c",  # UUID
        "/home/user/projects/MyProject2/src/main/java/App.java",
        "class InFlightLimitMiddleware2 in openclaw_cli/proxy/limits.py",
        "ThisIsAVeryLongCamelCaseIdentifier1234",
        "on 2026-05-01 at 12:30, build 1714567890, ip 192.168.1.20, version 2.1.197",
        "max_tokens=2048 and tokens = tokenizer.encode(text)",
        "the password is stored in the vault",
        "see https://example.com/docs?page=2 for details",
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk",
        "ratio 3.14159 and +5 points",
    ],
)
def test_ordinary_text_is_left_alone(redactor, text):
    assert redactor.redact_text(text) == text
    assert redactor.find(text) == set()


def test_only_the_enabled_kinds_are_touched():
    text = f"{EMAIL} {OPENAI_KEY} {PHONE_US}"
    assert Redactor(["email"]).redact_text(text) == f"[REDACTED_EMAIL] {OPENAI_KEY} {PHONE_US}"
    assert Redactor(["api_key", "phone"]).redact_text(text) == f"{EMAIL} [REDACTED_API_KEY] [REDACTED_PHONE]"
    assert Redactor(["phone"]).find(text) == {"phone"}
    assert Redactor(ALL_KINDS).find(text) == {"email", "api_key", "phone"}
    assert Redactor().redact_text(text) == text


def test_structures_keep_roles_ids_names_and_valid_json_arguments(redactor):
    arguments = json.dumps({"to": EMAIL, "api_key": OPENAI_KEY})
    message = {
        "role": "assistant",
        "content": [{"type": "text", "text": f"writing to {EMAIL}"}],
        "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "send", "arguments": arguments}}],
    }
    out = redactor.redact_value(message)
    assert out["role"] == "assistant" and out["tool_calls"][0]["id"] == "call_1"
    assert out["tool_calls"][0]["function"]["name"] == "send"
    assert out["content"][0]["text"] == "writing to [REDACTED_EMAIL]"
    assert json.loads(out["tool_calls"][0]["function"]["arguments"]) == {
        "to": "[REDACTED_EMAIL]",
        "api_key": "[REDACTED_API_KEY]",
    }
    assert message["content"][0]["text"] == f"writing to {EMAIL}"  # a copy: the input is untouched


def test_hostile_input_costs_linear_time(redactor):
    hostile = "".join(
        (
            "a" * 200_000,
            "@" + "b." * 50_000,
            "+1" + "2" * 100_000,
            "Ab1/" * 50_000,
            "token=" * 20_000,
            "-----BEGIN PRIVATE KEY-----" * 200,
            "x@" * 100_000,
        )
    )
    started = time.perf_counter()
    redactor.redact_text(hostile)
    redactor.find(hostile)
    assert time.perf_counter() - started < 20  # about 2 s on a slow shared CPU; quadratic would take hours


# -- where it applies ----------------------------------------------------------------------------------------------


def _secret_turn(store: Store) -> TurnRecord:
    with store.transaction() as tx:
        tx.create_session("s", scope="s", id_source="test", now=100.0)
        turn_id = tx.insert_turn(
            new_turn(
                status="pending",
                user_text=f"My key is {OPENAI_KEY}; mail me at {EMAIL}",
                reply_text=f"Noted, I will call {PHONE_US}.",
                tools=[{"type": "function", "function": {"name": "t", "description": "x", "parameters": {}}}],
            )
        )
        tx.set_next_state(turn_id, [{"role": "user", "content": f"also {TINKER_KEY}"}], "user", 101.0)
    turn = store.get_turn(turn_id)
    assert turn is not None
    return turn


SecretAndClean = tuple[Store, TurnRecord, TurnRecord]


@pytest.fixture
def secret_and_clean(tmp_path: Path) -> Iterator[SecretAndClean]:
    """A store with :func:`_secret_turn` and a clean turn ("what is 2+2?" / "4"), closed after the test."""
    store = Store(tmp_path / "s.sqlite3")
    secret = _secret_turn(store)
    with store.transaction() as tx:
        clean_id = tx.insert_turn(new_turn(user_text="what is 2+2?", reply_text="4"))
    clean = store.get_turn(clean_id)
    assert clean is not None
    yield store, secret, clean
    store.close()


class RecordingJudge:
    name = "recording"

    def __init__(self) -> None:
        self.prompts: list[list[dict[str, Any]]] = []

    async def complete(self, messages: list[dict], *, temperature: float, max_tokens: int) -> str:
        self.prompts.append(messages)
        return "Looks good. \\boxed{1}"


@pytest.mark.parametrize("method", ["rl", "combined"])
async def test_judge_prompts_are_redacted_and_the_stored_turn_is_not(tmp_path, method):
    store = Store(tmp_path / "s.sqlite3")
    turn = _secret_turn(store)
    judge = RecordingJudge()
    settings = Settings(method=method, judge={"votes": 2}, store={"redact": True})
    verdict = await JudgeLoop(store, judge, settings).judge_turn(turn)
    assert verdict.score == 1
    assert len(judge.prompts) == (2 if method == "rl" else 4)
    sent = json.dumps(judge.prompts)
    for secret in (OPENAI_KEY, EMAIL, PHONE_US, TINKER_KEY):
        assert secret not in sent
    for placeholder in ("[REDACTED_API_KEY]", "[REDACTED_EMAIL]", "[REDACTED_PHONE]"):
        assert placeholder in sent
    again = store.get_turn(turn.id)
    assert again is not None and again.messages == turn.messages and OPENAI_KEY in again.messages[0]["content"]

    plain = RecordingJudge()
    await JudgeLoop(store, plain, Settings(judge={"votes": 1})).judge_turn(turn)
    assert OPENAI_KEY in json.dumps(plain.prompts)  # off by default: the judge sees the turn as it was
    store.close()


def test_turns_with_secrets_are_withheld_from_cloud_trainers_only(secret_and_clean: SecretAndClean):
    _, secret, clean_turn = secret_and_clean
    on = Settings(store={"redact": True})
    assert withhold_from_training(secret, on, "tinker") and withhold_from_training(secret, on, "fireworks")
    assert not withhold_from_training(secret, on, "local")  # nothing leaves the machine
    assert not withhold_from_training(clean_turn, on, "tinker")
    assert not withhold_from_training(secret, Settings(), "tinker")  # redaction off
    assert withhold_from_training(secret, Settings(store={"redact": ["phone"]}), "tinker")  # the reply has a phone
    assert not withhold_from_training(secret, Settings(store={"redact": []}), "tinker")


async def test_the_trainer_skips_withheld_turns_when_building_samples(secret_and_clean: SecretAndClean):
    store, secret, clean = secret_and_clean
    clean_id = clean.id
    cloud = SimpleNamespace(name="tinker", publish=None)
    trainer = TrainerLoop(store, cloud, Settings(store={"redact": True}))  # type: ignore[arg-type]
    samples, _, unusable = await trainer._samples([secret, clean])
    assert [s.turn_id for s in samples] == [clean_id] and unusable == 1
    local = SimpleNamespace(name="local", publish=None)
    trainer = TrainerLoop(store, local, Settings(store={"redact": True}))  # type: ignore[arg-type]
    samples, _, unusable = await trainer._samples([secret, clean])
    assert [s.turn_id for s in samples] == [secret.id, clean_id] and unusable == 0


def test_export_redacts_messages_and_leaves_out_token_rows_with_secrets(secret_and_clean: SecretAndClean):
    store, secret, clean = secret_and_clean
    clean_id = clean.id
    redactor = Redactor(ALL_KINDS)
    out = io.StringIO()
    assert export_turns(store, ExportFormat.messages, ExportFilters(), out, redactor=redactor) == 2
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert rows[0]["messages"][0]["content"] == "My key is [REDACTED_API_KEY]; mail me at [REDACTED_EMAIL]"
    assert rows[0]["messages"][1]["content"] == "Noted, I will call [REDACTED_PHONE]."
    assert rows[0]["next_state"] == [{"role": "user", "content": "also [REDACTED_API_KEY]"}]
    out = io.StringIO()
    assert export_turns(store, ExportFormat.tokens, ExportFilters(), out, redactor=redactor) == 1
    assert [json.loads(line)["turn_id"] for line in out.getvalue().splitlines()] == [clean_id]
    out = io.StringIO()  # redaction off: the export is verbatim
    assert export_turns(store, ExportFormat.messages, ExportFilters(), out) == 2
    assert OPENAI_KEY in out.getvalue()
    assert store.get_turn(secret.id).messages == secret.messages  # type: ignore[union-attr]


def test_export_command_honours_the_setting(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from openclaw_cli.cli import app

    store_path = tmp_path / "s.sqlite3"
    store = Store(store_path)
    _secret_turn(store)
    store.close()
    monkeypatch.chdir(tmp_path)
    Path("openclaw.toml").write_text(f'[store]\npath = "{store_path}"\nredact = true\n')
    result = CliRunner().invoke(app, ["export", "--format", "messages"])
    assert result.exit_code == 0, result.output
    assert "[REDACTED_API_KEY]" in result.stdout and OPENAI_KEY not in result.stdout


async def test_a_secret_at_the_judge_prompts_clip_boundary_is_not_half_sent(tmp_path):
    from openclaw_cli.learn.judge_prompts import REPLY_CHARS

    head = REPLY_CHARS * 2 // 3  # clip_middle keeps this many leading characters of a long reply
    reply = "x" * (head - 14) + " " + OPENAI_KEY + " " + "y" * REPLY_CHARS  # the clip cuts the key after 13 chars
    store = Store(tmp_path / "s.sqlite3")
    with store.transaction() as tx:
        tx.create_session("s", scope="s", id_source="test", now=100.0)
        turn_id = tx.insert_turn(new_turn(status="pending", reply_text=reply))
        tx.set_next_state(turn_id, [{"role": "user", "content": "thanks"}], "user", 101.0)
    turn = store.get_turn(turn_id)
    judge = RecordingJudge()
    await JudgeLoop(store, judge, Settings(judge={"votes": 1}, store={"redact": ["api_key"]})).judge_turn(turn)
    sent = json.dumps(judge.prompts)
    # the placeholder is what the clip cuts now (it starts where the key did); no fragment of the key is left
    assert "sk-proj" not in sent and "x [REDACTED_" in sent
    plain = RecordingJudge()
    await JudgeLoop(store, plain, Settings(judge={"votes": 1})).judge_turn(turn)
    assert OPENAI_KEY[:13] in json.dumps(plain.prompts) and OPENAI_KEY not in json.dumps(plain.prompts)
    store.close()
