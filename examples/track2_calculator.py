"""Track 2 example: a tool-calling agent with a calculator, trained by GRPO on its answers.

    openclaw train --env examples/track2_calculator.py --steps 20 --group-size 8 --prompts-per-step 8

The environment is real: each episode draws an arithmetic question whose answer is one digit (0-9), offers a
``calculator`` tool (an AST-based evaluator: numbers, + - * / // % and parentheses, nothing else), runs every tool
call the model makes and feeds the result back, up to ``max_turns`` replies (``--env-arg max_turns=N``, default 3).
The reply that makes no tool call is the answer; its first integer is checked against the true result.

Reward: 1.0 for the right number; :data:`FORMAT_REWARD` (0.2) for a wrong number (the reply at least answers with
a number, as asked); 0 for a reply with no number. With a real instruct model the tool path is what earns the 1.0s.

What the tiny test model can learn: not arithmetic and not tool calls. Its random weights never produce a
well-formed ``<tool_call>`` in a few steps. What it does learn within a handful of GRPO steps is the answer format
(put a digit in the reply instead of blank lines), which lifts the mean reward through the format credit and the
10% of digits that happen to be right; ``tests/test_track2_examples.py`` measures exactly that.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from dataclasses import dataclass

from openclaw_cli.env_training import RolloutContext, Trajectory, call_arguments, function_tool, run_tool_loop
from openclaw_cli.types import ToolCall

FORMAT_REWARD = 0.2
DEFAULT_MAX_TURNS = 3
MAX_EXPRESSION_CHARS = 200
SYSTEM_PROMPT = "Use the calculator tool when it helps. Then reply with just the number."
TOOLS = [
    function_tool(
        "calculator",
        "Evaluate an arithmetic expression with + - * / // % and parentheses.",
        {"expression": {"type": "string", "description": "e.g. (3 + 4) * 2"}},
        ["expression"],
    )
]
_INTEGER = re.compile(r"-?\d+")
_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
}


@dataclass(frozen=True)
class Task:
    question: str
    answer: int


def make_task(rng: random.Random) -> Task:
    """A question whose answer is a single digit: a small answer vocabulary on purpose."""
    if rng.random() < 0.5:
        a = rng.randint(0, 9)
        b = rng.randint(0, 9 - a)
        return Task(f"What is {a} + {b}?", a + b)
    a = rng.randint(0, 9)
    b = rng.randint(0, a)
    return Task(f"What is {a} - {b}?", a - b)


def calculate(expression: str) -> str:
    """The tool: evaluate arithmetic only (no names, calls or attributes reach ``eval``; nothing is eval'd)."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression, mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _evaluate(tree.body)
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _evaluate(node: ast.expr) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        try:
            return _BINARY[type(node.op)](left, right)
        except ZeroDivisionError:
            raise ValueError("division by zero") from None
    raise ValueError(f"unsupported element in expression: {ast.dump(node)[:60]}")


def run_calculator(call: ToolCall) -> str:
    if call.name != "calculator":
        raise ValueError(f"unknown tool {call.name!r}; the only tool is calculator")
    expression = call_arguments(call).get("expression")
    if not isinstance(expression, str):
        raise ValueError("calculator needs an 'expression' string")
    return calculate(expression)


def first_integer(text: str) -> int | None:
    match = _INTEGER.search(text)
    return int(match.group()) if match else None


def score(answer: int, reply: str) -> tuple[float, bool]:
    """(reward, solved) for a final reply."""
    given = first_integer(reply)
    if given is None:
        return 0.0, False
    if given == answer:
        return 1.0, True
    return FORMAT_REWARD, False


async def rollout(ctx: RolloutContext) -> Trajectory:
    task = make_task(ctx.rng)
    messages = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": task.question}]
    max_turns = int(ctx.env_args.get("max_turns", DEFAULT_MAX_TURNS))
    result = await run_tool_loop(ctx, messages, TOOLS, run_calculator, max_turns=max_turns)
    final = result.final.parsed.content if result.answered else ""
    reward, solved = score(task.answer, final)
    return ctx.trajectory(
        reward,
        solved=solved,
        info={"question": task.question, "answer": task.answer, "reply": final, "tool_calls": result.tool_calls},
    )
