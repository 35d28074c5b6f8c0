"""A tool-using agent on the openclaw proxy through the ``anthropic`` SDK.

The model gets two local tools, ``calculator`` (arithmetic) and ``convert_units`` (length and temperature). Each
``tool_use`` block it returns is run here and answered with a ``tool_result`` in the next request, until the model
ends its turn (``end_turn``) or ``--max-steps`` requests were made. Every request carries the same ``X-Session-Id``,
so the proxy files the run as one session and each step's next state is the tool result that followed it: the
signal the judge scores.

    openclaw serve --model Qwen/Qwen3-4B-Instruct-2507 &    # a model trained for tool use
    python examples/agent_anthropic_tools.py "What is 17% of 2,340 km in miles?"

``--base-url`` takes the proxy's root (``http://127.0.0.1:8400``; a trailing ``/v1`` is dropped). The key is
``--api-key``, else ``$OPENCLAW_API_KEY``, else a placeholder. Exit status: 0 when the model finished with an
answer, 1 on an API error, a reply cut at max_tokens, or no answer within ``--max-steps``.
"""

from __future__ import annotations

import argparse
import ast
import json
import operator
import os
import sys
import uuid
from collections.abc import Callable
from typing import Any

import anthropic

DEFAULT_BASE_URL = "http://127.0.0.1:8400"
NO_KEY_PLACEHOLDER = "openclaw-no-key"
DEFAULT_TASK = "What is 2 + 3 * 4 kilometres in miles?"
SYSTEM = "You are a careful assistant. Use the tools for any arithmetic or unit conversion, then answer briefly."


class ToolError(Exception):
    """The tool could not do what was asked; the message goes back to the model as an error result."""


# -- tools -----------------------------------------------------------------------------------------------------

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_EXPONENT = 100  # keeps 9**9**9 from hanging the agent


def calculator(expression: str) -> str:
    """Evaluate arithmetic on numbers only (no names, calls or attributes): the model's text is never executed."""

    def evaluate(node: ast.AST) -> float | int:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            left, right = evaluate(node.left), evaluate(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
                raise ToolError(f"exponent {right} is too large")
            return _BINARY[type(node.op)](left, right)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](evaluate(node.operand))
        raise ToolError(f"unsupported syntax: {ast.dump(node)[:60]}")

    try:
        tree = ast.parse(expression.replace(",", "").replace("^", "**"), mode="eval")
        return _number(evaluate(tree.body))
    except ZeroDivisionError:
        raise ToolError("division by zero") from None
    except SyntaxError:
        raise ToolError(f"not an arithmetic expression: {expression!r}") from None


_METRES_PER = {"m": 1.0, "km": 1000.0, "cm": 0.01, "mi": 1609.344, "ft": 0.3048, "in": 0.0254}


def convert_units(value: float, from_unit: str, to_unit: str) -> str:
    source, target = from_unit.strip().lower(), to_unit.strip().lower()
    if source in ("c", "f") and target in ("c", "f"):
        celsius = value if source == "c" else (value - 32) * 5 / 9
        return _number(celsius if target == "c" else celsius * 9 / 5 + 32)
    if source in _METRES_PER and target in _METRES_PER:
        return _number(value * _METRES_PER[source] / _METRES_PER[target])
    known = ", ".join([*_METRES_PER, "c", "f"])
    raise ToolError(f"cannot convert {from_unit} to {to_unit}; known units: {known}")


def _number(value: float | int) -> str:
    return str(value) if isinstance(value, int) else f"{value:.6g}"


TOOLS: list[dict[str, Any]] = [
    {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression (+ - * / // % ** and parentheses).",
        "input_schema": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. (2 + 3) * 4"}},
            "required": ["expression"],
        },
    },
    {
        "name": "convert_units",
        "description": "Convert a length (m, km, cm, mi, ft, in) or a temperature (c, f).",
        "input_schema": {
            "type": "object",
            "properties": {
                "value": {"type": "number"},
                "from_unit": {"type": "string"},
                "to_unit": {"type": "string"},
            },
            "required": ["value", "from_unit", "to_unit"],
        },
    },
]
HANDLERS: dict[str, Callable[..., str]] = {"calculator": calculator, "convert_units": convert_units}


def run_tool(name: str, arguments: Any) -> tuple[str, bool]:
    """(result text, is_error) for one tool_use block."""
    handler = HANDLERS.get(name)
    if handler is None:
        return f"unknown tool {name!r}; available: {', '.join(HANDLERS)}", True
    if not isinstance(arguments, dict):
        return "tool input must be a JSON object", True
    try:
        return handler(**arguments), False
    except ToolError as exc:
        return str(exc), True
    except (TypeError, ValueError) as exc:  # missing/extra/mistyped arguments from the model
        return f"bad arguments for {name}: {exc}", True


# -- the loop --------------------------------------------------------------------------------------------------


def run_agent(client: anthropic.Anthropic, args: argparse.Namespace) -> int:
    messages: list[dict[str, Any]] = [{"role": "user", "content": args.task}]
    headers = {"X-Session-Id": args.session_id}
    print(f"user> {args.task}")
    for step in range(1, args.max_steps + 1):
        response = client.messages.create(
            model=args.model,
            max_tokens=args.max_tokens,
            system=SYSTEM,
            tools=TOOLS,
            messages=messages,
            extra_headers=headers,
        )
        for block in response.content:
            if block.type == "text" and block.text.strip():
                print(f"assistant[{step}]> {block.text.strip()}")
        messages.append({"role": "assistant", "content": response.content})
        if response.stop_reason == "tool_use":
            results = []
            for block in response.content:
                if block.type != "tool_use":
                    continue
                text, is_error = run_tool(block.name, block.input)
                print(f"tool[{step}]> {block.name}({json.dumps(block.input)}) -> {'ERROR ' if is_error else ''}{text}")
                results.append({"type": "tool_result", "tool_use_id": block.id, "content": text, "is_error": is_error})
            messages.append({"role": "user", "content": results})
            continue
        if response.stop_reason == "max_tokens":
            print(f"error: the reply was cut at --max-tokens {args.max_tokens}", file=sys.stderr)
            return 1
        print(f"[done in {step} step(s), session {args.session_id}]", file=sys.stderr)
        return 0  # end_turn or a stop sequence: the model answered
    print(f"error: no final answer within --max-steps {args.max_steps}", file=sys.stderr)
    return 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("task", nargs="?", default=DEFAULT_TASK, help="What to ask the agent.")
    parser.add_argument("--base-url", default=DEFAULT_BASE_URL, help="The proxy's root URL.")
    parser.add_argument("--api-key", default=None, help="Proxy key (default: $OPENCLAW_API_KEY or a placeholder).")
    parser.add_argument("--model", default="openclaw", help="Any name the proxy serves (default: openclaw).")
    parser.add_argument("--session-id", default=None, help="Session id sent as X-Session-Id (default: random).")
    parser.add_argument("--max-steps", type=int, default=8, help="Most requests before giving up.")
    parser.add_argument("--max-tokens", type=int, default=512)
    args = parser.parse_args(argv)
    args.session_id = args.session_id or f"agent-{uuid.uuid4().hex[:12]}"
    args.api_key = args.api_key or os.environ.get("OPENCLAW_API_KEY") or NO_KEY_PLACEHOLDER
    base = args.base_url.rstrip("/")
    args.base_url = base.removesuffix("/v1")  # the SDK adds /v1/messages itself
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = anthropic.Anthropic(base_url=args.base_url, api_key=args.api_key, max_retries=1)
    try:
        return run_agent(client, args)
    except anthropic.APIError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
