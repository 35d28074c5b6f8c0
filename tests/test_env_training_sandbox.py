"""The terminal sandbox: what it runs, what it refuses (and that refused commands leave no trace)."""

from __future__ import annotations

from pathlib import Path

import pytest

from openclaw_cli.env_training.sandbox import SandboxRefused, ShellSandbox


@pytest.fixture
def sandbox(tmp_path: Path):
    root = tmp_path / "root"
    root.mkdir()
    with ShellSandbox(root, timeout_s=2.0) as box:
        box.write_file("data.txt", "5\n17\n3\n")
        yield box


def test_pipelines_and_redirects_run_inside_the_root(sandbox: ShellSandbox) -> None:
    result = sandbox.run("sort -n data.txt | tail -n 1 > answer.txt")
    assert result.exit_code == 0 and result.stdout == ""
    assert sandbox.read_file("answer.txt") == "17\n"
    assert sandbox.run("echo 'a;b $c' \"d e\" >> answer.txt").exit_code == 0
    assert sandbox.read_file("answer.txt") == "17\na;b $c d e\n"
    assert sandbox.run("grep 1 < data.txt").stdout == "17\n"
    assert sandbox.run("pwd").stdout.strip() == str(sandbox.base)
    failed = sandbox.run("wc -l missing.txt")
    assert failed.exit_code == 1 and "missing.txt" in failed.stderr


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("curl http://example.com", "command 'curl' is not allowed"),
        ("python3 -c 'print(1)'", "command 'python3' is not allowed"),
        ("/bin/cat data.txt", "command '/bin/cat' is not allowed"),
        ("sort -n data.txt | sh", "command 'sh' is not allowed"),
        ("ls; rm data.txt", "';' not supported"),
        ("ls && rm data.txt", "'&' not supported"),
        ("echo $(rm data.txt)", "variables and command substitution"),
        ("echo `rm data.txt`", "command substitution"),
        ("cat data.txt 2> err.txt", "file-descriptor redirects"),
        ("cat << EOF", "here-documents"),
    ],
)
def test_disallowed_commands_are_refused(sandbox: ShellSandbox, command: str, reason: str) -> None:
    with pytest.raises(SandboxRefused, match=reason):
        sandbox.run(command)
    assert sandbox.read_file("data.txt") == "5\n17\n3\n"
    assert sandbox.run_for_model(command).startswith("refused: ")


@pytest.mark.parametrize(
    "command",
    [
        "cat ../outside.txt",
        "cat /etc/passwd",
        "cp data.txt ../copied.txt",
        "echo leaked > ../outside.txt",
        "sort -o../outside.txt data.txt",  # an option with the path glued on
        "sort --output=/tmp/outside.txt data.txt",
        "ls sub/../..",
        "cat ~/.bashrc",
    ],
)
def test_path_escapes_are_refused(sandbox: ShellSandbox, command: str) -> None:
    outside = sandbox.base.parent / "outside.txt"
    outside.write_text("secret\n")
    with pytest.raises(SandboxRefused, match="outside the sandbox directory"):
        sandbox.run(command)
    assert outside.read_text() == "secret\n"
    assert not (sandbox.base.parent / "copied.txt").exists()


def test_a_symlink_planted_inside_cannot_be_followed_out(sandbox: ShellSandbox) -> None:
    outside = sandbox.base.parent / "outside.txt"
    outside.write_text("secret\n")
    (sandbox.base / "link.txt").symlink_to(outside)  # the sandbox itself offers no way to make one
    with pytest.raises(SandboxRefused, match="outside the sandbox"):
        sandbox.run("echo x > link.txt")
    with pytest.raises(SandboxRefused, match="outside the sandbox"):
        sandbox.run("cat link.txt")
    assert outside.read_text() == "secret\n"


def test_commands_time_out(tmp_path: Path) -> None:
    with ShellSandbox(timeout_s=0.3) as box:
        box.write_file("log.txt", "line\n")
        result = box.run("tail -f log.txt")
        assert result.timed_out and result.exit_code is None
        assert box.run_for_model("tail -f log.txt").startswith("timed out (killed)")
        root = box.base
    assert not root.exists()  # close() removes the temporary directory it made
