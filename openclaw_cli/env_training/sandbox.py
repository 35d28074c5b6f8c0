"""A confined shell for terminal-agent environments: one temporary directory, an allowlist of commands, no shell.

What it does:

- **No shell.** The command line is split by our own tokenizer (quotes and backslashes as in sh); only ``|``,
  ``>``, ``>>`` and ``<`` are understood, and ``;``, ``&``, ``&&``, ``||``, subshells, here-docs, fd redirects,
  variables (``$``) and command substitution (backticks) are refused. No globbing: ``*`` is a literal character.
- **Allowlist.** Each pipeline stage must be one of :data:`DEFAULT_ALLOWED_COMMANDS` (plain text tools; nothing that
  runs other programs, reaches the network, or creates links), looked up in ``/usr/bin:/bin`` only.
- **Confined paths.** The working directory is the sandbox root. Every argument that looks like a path (contains
  ``/`` or ``..``; for options, the part after ``=`` or after the option letter) and every redirect target must
  resolve, symlinks followed, inside the root; else the command is refused. Redirect targets are opened with
  ``O_NOFOLLOW``; a plain file name that is a symlink must point inside too.
- **Limits.** A wall-clock timeout for the whole pipeline (each stage in its own process group, killed on timeout),
  and per process ``ulimit`` on CPU seconds, file size and address space. Output shown to the model is truncated.
- **Clean environment.** ``PATH=/usr/bin:/bin``, ``HOME`` = the root, nothing else inherited.

What it does NOT protect against (it is a guard rail for a policy that types shell commands, not a security
boundary): commands run as your user with your file permissions and with no kernel isolation (no namespaces,
seccomp, cgroups or chroot); an allowed tool with an option the path heuristic does not recognise could read or
write outside the root; nothing stops network access at the OS level (the allowlist just holds no network tool);
the ``ulimit`` caps are per process and approximate (file size in the shell's block units). Use a container or VM
(e.g. ``docker run --network none``, gVisor, firejail) for a model you do not trust.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

DEFAULT_ALLOWED_COMMANDS = frozenset(
    {
        "cat", "cp", "cut", "echo", "grep", "head", "ls", "mkdir", "mv", "printf", "pwd", "rm", "sort", "tail",
        "touch", "tr", "uniq", "wc",
    }
)  # fmt: skip
SAFE_PATH = "/usr/bin:/bin"
_OPERATORS = ("|", ">>", ">", "<")  # longest first
_REFUSED_CHARS = {";": "';'", "&": "'&'", "(": "subshells", ")": "subshells", "`": "command substitution"}


class SandboxRefused(ValueError):
    """The command was not run; the message (shown to the model) says why."""


@dataclass
class CommandResult:
    exit_code: int | None  # None when the pipeline was killed on timeout
    stdout: str
    stderr: str
    timed_out: bool = False

    def for_model(self, max_chars: int) -> str:
        status = "timed out (killed)" if self.timed_out else f"exit code {self.exit_code}"
        parts = [status]
        if self.stdout:
            parts.append(_clip(self.stdout, max_chars))
        if self.stderr:
            parts.append("stderr:\n" + _clip(self.stderr, max_chars))
        return "\n".join(parts)


@dataclass
class Pipeline:
    stages: list[list[str]]
    stdin_path: Path | None = None
    stdout_path: Path | None = None
    append: bool = False


@dataclass
class _Token:
    text: str
    operator: bool = False
    glued_to_previous: bool = False  # an operator right after a word, no space between (to spot 2>)


@dataclass
class ShellSandbox:
    """See the module docstring. ``root`` defaults to a fresh temporary directory, removed by :meth:`close`."""

    root: Path | None = None
    allowed_commands: frozenset[str] = DEFAULT_ALLOWED_COMMANDS
    timeout_s: float = 5.0
    max_output_chars: int = 4000
    max_file_bytes: int = 1_000_000
    memory_bytes: int = 512 * 1024 * 1024
    _owned: tempfile.TemporaryDirectory[str] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.root is None:
            self._owned = tempfile.TemporaryDirectory(prefix="openclaw-sandbox-")
            self.root = Path(self._owned.name)
        self.root = Path(self.root).resolve()
        if not self.root.is_dir():
            raise ValueError(f"sandbox root {self.root} is not a directory")

    @property
    def base(self) -> Path:
        assert self.root is not None  # set in __post_init__
        return self.root

    def close(self) -> None:
        if self._owned is not None:
            self._owned.cleanup()
            self._owned = None

    def __enter__(self) -> ShellSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- files (for the environment's own set-up and checks) ---------------------------------------------------

    def confine(self, raw: str) -> Path:
        """The absolute path ``raw`` names (relative to the root), refused unless it lies inside the root."""
        candidate = Path(raw).expanduser() if raw.startswith("~") else Path(raw)
        resolved = (self.base / candidate).resolve()
        if resolved != self.base and self.base not in resolved.parents:
            raise SandboxRefused(f"path {raw!r} is outside the sandbox directory")
        return resolved

    def write_file(self, name: str, content: str) -> Path:
        path = self.confine(name)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        return path

    def read_file(self, name: str) -> str | None:
        path = self.confine(name)
        return path.read_text(errors="replace") if path.is_file() else None

    # -- commands -------------------------------------------------------------------------------------------

    def parse(self, command: str) -> Pipeline:
        """Check ``command`` against every rule; raises :class:`SandboxRefused` with the reason."""
        tokens = _tokenize(command)
        if not tokens:
            raise SandboxRefused("empty command")
        pipeline = Pipeline(stages=[[]])
        i = 0
        while i < len(tokens):
            token = tokens[i]
            if not token.operator:
                pipeline.stages[-1].append(token.text)
                i += 1
                continue
            current = pipeline.stages[-1]
            if token.glued_to_previous and current and current[-1].isdigit() and token.text != "|":
                raise SandboxRefused("file-descriptor redirects (like 2>) are not supported")
            if token.text == "|":
                if not current or pipeline.stdout_path is not None:
                    raise SandboxRefused("'|' needs a command on both sides (and output redirects go last)")
                pipeline.stages.append([])
                i += 1
                continue
            if i + 1 >= len(tokens) or tokens[i + 1].operator:
                raise SandboxRefused(f"'{token.text}' needs a file name after it")
            target = self.confine(tokens[i + 1].text)
            if token.text == "<":
                if len(pipeline.stages) > 1 or pipeline.stdin_path is not None:
                    raise SandboxRefused("'<' is only supported once, on the first command")
                pipeline.stdin_path = target
            else:
                if pipeline.stdout_path is not None:
                    raise SandboxRefused("only one output redirect is supported")
                pipeline.stdout_path, pipeline.append = target, token.text == ">>"
            i += 2
        for stage in pipeline.stages:
            if not stage:
                raise SandboxRefused("a pipeline stage has no command")
            self._check_stage(stage)
        return pipeline

    def run(self, command: str) -> CommandResult:
        """Run one command line; raises :class:`SandboxRefused` when it breaks a rule (nothing runs then)."""
        pipeline = self.parse(command)
        return self._execute(pipeline)

    def run_for_model(self, command: str) -> str:
        """What a shell tool shows the model: the result, or why the command was refused."""
        try:
            return self.run(command).for_model(self.max_output_chars)
        except SandboxRefused as exc:
            return f"refused: {exc}"

    # -- internals ------------------------------------------------------------------------------------------

    def _check_stage(self, stage: list[str]) -> None:
        name = stage[0]
        if "/" in name or name not in self.allowed_commands:
            allowed = ", ".join(sorted(self.allowed_commands))
            raise SandboxRefused(f"command {name!r} is not allowed; allowed commands: {allowed}")
        for argument in stage[1:]:
            for path in _path_candidates(argument):
                self.confine(path)
            if not argument.startswith("-") and (self.base / argument).is_symlink():
                self.confine(argument)  # a plain name that is a link (planted from outside) must point inside

    def _execute(self, pipeline: Pipeline) -> CommandResult:
        env = {"PATH": SAFE_PATH, "HOME": str(self.base), "LC_ALL": "C.UTF-8"}
        wrapper = [
            "/bin/sh",
            "-c",
            # Limits for this process only; a shell that lacks one (e.g. -v on some systems) skips it.
            f"ulimit -t {max(1, int(self.timeout_s) + 1)} 2>/dev/null; "
            f"ulimit -f {max(1, self.max_file_bytes // 512)} 2>/dev/null; "
            f"ulimit -v {max(1, self.memory_bytes // 1024)} 2>/dev/null; "
            'exec "$@"',
            "sandbox",
        ]
        with tempfile.TemporaryFile() as stdout_sink, tempfile.TemporaryFile() as stderr_sink:
            return self._execute_into(pipeline, wrapper, env, stdout_sink, stderr_sink)

    def _execute_into(
        self,
        pipeline: Pipeline,
        wrapper: list[str],
        env: dict[str, str],
        stdout_sink: IO[bytes],
        stderr_sink: IO[bytes],
    ) -> CommandResult:
        processes: list[subprocess.Popen[bytes]] = []
        opened: list[int] = []
        try:
            stdin: IO[bytes] | int = subprocess.DEVNULL
            if pipeline.stdin_path is not None:
                stdin = os.open(pipeline.stdin_path, os.O_RDONLY | os.O_NOFOLLOW)
                opened.append(stdin)
            final_out: IO[bytes] | int = stdout_sink
            if pipeline.stdout_path is not None:
                flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | (os.O_APPEND if pipeline.append else os.O_TRUNC)
                final_out = os.open(pipeline.stdout_path, flags, 0o644)
                opened.append(final_out)
            for index, stage in enumerate(pipeline.stages):
                if shutil.which(stage[0], path=SAFE_PATH) is None:
                    raise SandboxRefused(f"command {stage[0]!r} is not installed on this machine")
                last = index == len(pipeline.stages) - 1
                process = subprocess.Popen(
                    # The bare name: sh finds it on the clean PATH, and error messages show "wc", not "/usr/bin/wc".
                    [*wrapper, *stage],
                    cwd=self.base,
                    env=env,
                    stdin=stdin,
                    stdout=final_out if last else subprocess.PIPE,
                    stderr=stderr_sink,
                    start_new_session=True,
                )
                processes.append(process)
                if process.stdout is not None:
                    stdin = process.stdout  # the next stage reads it; our copy is closed below
            timed_out = self._wait(processes)
            stdout_sink.seek(0)
            stderr_sink.seek(0)
            return CommandResult(
                exit_code=None if timed_out else processes[-1].returncode,
                stdout=_read_some(stdout_sink, self.max_output_chars),
                stderr=_read_some(stderr_sink, self.max_output_chars),
                timed_out=timed_out,
            )
        except OSError as exc:  # e.g. the redirect target is a directory or a symlink (O_NOFOLLOW)
            return CommandResult(exit_code=1, stdout="", stderr=f"sandbox: {exc.strerror or exc}")
        finally:
            for process in processes:
                if process.poll() is None:
                    _kill(process)
                if process.stdout is not None:
                    process.stdout.close()
            for fd in opened:
                os.close(fd)

    def _wait(self, processes: list[subprocess.Popen[bytes]]) -> bool:
        deadline = time.monotonic() + self.timeout_s
        for process in processes:
            if process.stdout is not None:
                process.stdout.close()  # the next stage holds the pipe; this lets a writer see EPIPE if it exits
        for process in processes:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for p in processes:
                    _kill(p)
                return True
        return False


def _kill(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def _read_some(handle: IO[bytes], max_chars: int) -> str:
    data = handle.read(max_chars * 4 + 1)  # enough bytes for max_chars characters of UTF-8
    return data.decode("utf-8", errors="replace")


def _clip(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + f"\n[... truncated to {max_chars} characters]"


def _path_candidates(argument: str) -> Iterable[str]:
    """The parts of an argument that could name a file: the argument, or an option's value."""
    value = argument
    if argument.startswith("-"):
        if "=" in argument:
            value = argument.split("=", 1)[1]
        else:
            starts = [i for i, ch in enumerate(argument) if ch in "./~" and i > 0]
            if not starts:
                return []
            value = argument[starts[0] :]
    if "/" in value or value == ".." or value.startswith(("../", "~")) or "/.." in value:
        return [value]
    return []


def _tokenize(command: str) -> list[_Token]:
    """Words and operators of an sh-like command line; quotes make anything literal."""
    tokens: list[_Token] = []
    word: list[str] = []
    in_word = False
    i, n = 0, len(command)

    def finish_word() -> None:
        nonlocal in_word
        if in_word:
            tokens.append(_Token("".join(word)))
            word.clear()
            in_word = False

    while i < n:
        ch = command[i]
        if ch in " \t\n":
            finish_word()
            i += 1
        elif ch == "'":
            end = command.find("'", i + 1)
            if end == -1:
                raise SandboxRefused("unterminated single quote")
            word.append(command[i + 1 : end])
            in_word = True
            i = end + 1
        elif ch == '"':
            i += 1
            while i < n and command[i] != '"':
                if command[i] == "\\" and i + 1 < n and command[i + 1] in '"\\$`':
                    i += 1
                elif command[i] in "$`":
                    raise SandboxRefused("variables and command substitution are not supported")
                word.append(command[i])
                i += 1
            if i >= n:
                raise SandboxRefused("unterminated double quote")
            in_word = True
            i += 1
        elif ch == "\\":
            if i + 1 < n:
                word.append(command[i + 1])
            in_word = True
            i += 2
        elif ch == "$":
            raise SandboxRefused("variables and command substitution are not supported")
        elif ch in _REFUSED_CHARS:
            raise SandboxRefused(f"{_REFUSED_CHARS[ch]} not supported: run one command (or one pipeline) at a time")
        elif command.startswith("<<", i):
            raise SandboxRefused("here-documents are not supported")
        elif any(command.startswith(op, i) for op in _OPERATORS):
            op = next(op for op in _OPERATORS if command.startswith(op, i))
            was_glued = in_word
            finish_word()
            tokens.append(_Token(op, operator=True, glued_to_previous=was_glued))
            i += len(op)
        else:
            word.append(ch)
            in_word = True
            i += 1
    finish_word()
    return tokens
