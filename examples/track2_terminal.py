"""Track 2 example: a terminal agent in a confined shell, rewarded by checking the file it leaves behind.

    openclaw train --env examples/track2_terminal.py --steps 20 --max-tokens 128

Each episode gets a fresh temporary directory holding ``data.txt`` (a few numbers, one per line) and a task such as
"write the largest number in data.txt into answer.txt". The agent has one tool, ``shell``, which runs a command
line in that directory through :class:`openclaw_cli.env_training.sandbox.ShellSandbox`: an allowlist of plain text
tools, pipes and ``>``/``>>``/``<`` redirects, every path confined to the directory, a timeout per command, no network
tool, no shell. Read that module's docstring for what the sandbox does NOT protect against: it is a guard rail,
not a security boundary; run a model you do not trust in a container or VM.

Reward (checked after the episode, from the file alone): 1.0 when ``answer.txt`` holds exactly the expected number,
:data:`PARTIAL_REWARD` (0.1) when it exists with anything else, 0 when it does not exist. ``--env-arg max_turns=N``
(default 4) caps the agent's replies; ``--env-arg command_timeout_s=S`` (default 5) caps each command.

A real instruct model solves this with one call (``sort -n data.txt | tail -n 1 > answer.txt``). The tiny test
model does not: the test only checks that episodes run end to end and that the environment's logic is right.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from openclaw_cli.env_training import RolloutContext, Trajectory, call_arguments, function_tool, run_tool_loop
from openclaw_cli.env_training.sandbox import DEFAULT_ALLOWED_COMMANDS, ShellSandbox
from openclaw_cli.types import ToolCall

PARTIAL_REWARD = 0.1
DEFAULT_MAX_TURNS = 4
ANSWER_FILE = "answer.txt"
DATA_FILE = "data.txt"
SYSTEM_PROMPT = (
    "You work in a terminal, in a directory of your own. Run commands with the shell tool. "
    "When the task is done, reply with DONE."
)
TOOLS = [
    function_tool(
        "shell",
        f"Run one command line. Allowed commands: {', '.join(sorted(DEFAULT_ALLOWED_COMMANDS))}. Pipes and > >> < "
        "redirects work; ; && $ and globbing do not.",
        {"command": {"type": "string", "description": "e.g. sort -n data.txt | head -n 1"}},
        ["command"],
    )
]


@dataclass(frozen=True)
class Task:
    instruction: str
    data: list[int]
    expected: str


def make_task(rng: random.Random) -> Task:
    data = [rng.randint(1, 99) for _ in range(rng.randint(4, 8))]
    kind = rng.choice(["largest", "smallest", "count"])
    if kind == "largest":
        return Task(f"Write the largest number in {DATA_FILE} into {ANSWER_FILE}.", data, str(max(data)))
    if kind == "smallest":
        return Task(f"Write the smallest number in {DATA_FILE} into {ANSWER_FILE}.", data, str(min(data)))
    return Task(f"Write how many lines {DATA_FILE} has into {ANSWER_FILE}.", data, str(len(data)))


def check_answer(sandbox: ShellSandbox, expected: str) -> tuple[float, bool]:
    """(reward, solved) from the answer file alone."""
    content = sandbox.read_file(ANSWER_FILE)
    if content is None:
        return 0.0, False
    if content.strip() == expected:
        return 1.0, True
    return PARTIAL_REWARD, False


async def run_shell(sandbox: ShellSandbox, call: ToolCall) -> str:
    if call.name != "shell":
        raise ValueError(f"unknown tool {call.name!r}; the only tool is shell")
    command = call_arguments(call).get("command")
    if not isinstance(command, str):
        raise ValueError("shell needs a 'command' string")
    # Commands block (up to their timeout): off the event loop, so other rollouts keep sampling meanwhile.
    return await asyncio.to_thread(sandbox.run_for_model, command)


async def rollout(ctx: RolloutContext) -> Trajectory:
    task = make_task(ctx.rng)
    max_turns = int(ctx.env_args.get("max_turns", DEFAULT_MAX_TURNS))
    timeout_s = float(ctx.env_args.get("command_timeout_s", 5.0))
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.instruction}]
    with ShellSandbox(timeout_s=timeout_s) as sandbox:
        sandbox.write_file(DATA_FILE, "".join(f"{n}\n" for n in task.data))
        result = await run_tool_loop(ctx, messages, TOOLS, lambda call: run_shell(sandbox, call), max_turns=max_turns)
        reward, solved = check_answer(sandbox, task.expected)
    return ctx.trajectory(
        reward,
        solved=solved,
        info={"instruction": task.instruction, "expected": task.expected, "tool_calls": result.tool_calls},
    )
