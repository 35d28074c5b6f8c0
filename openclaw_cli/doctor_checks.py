"""``openclaw doctor`` checks of the model's fitness for agents: context length, tool rendering, tool-call parsing.

- **Context vs a typical agent prompt.** Claude Code's first request (system prompt + 24 tool definitions, recorded
  in ``openclaw_cli/data/claude_code_prompt.json`` with its prose elided) is rebuilt with stand-in prose of the
  elided lengths and counted with the model's own tokenizer and chat template; a context window that cannot hold
  it plus :data:`AGENT_HEADROOM_TOKENS` (a few turns and a reply) is a warning: Claude Code would be told "prompt
  is too long" on its first request or soon after. The count is an estimate (stand-in prose tokenizes close to,
  not exactly like, the real text).
- **Tools render.** The chat template is given one tool; its name and a parameter must appear in the prompt.
- **Tool-call round trip.** An assistant message with a tool call is rendered, the assistant's part of the prompt
  is decoded and parsed back with the tokenizer's ``parse_assistant``; the same function name and arguments must
  come out. A template whose tool-call markup the parser cannot read would serve tool calls as plain text.

These are warnings (:class:`DoctorCheck` with ``warning=True``), not failures: a chat app needs none of them. The
tokenizer is loaded only from files already on this machine (the converted embedded model, a local model dir, or
the Hugging Face cache); the doctor never downloads or converts a model, and says so when it cannot check.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from openclaw_cli.backend import Check

if TYPE_CHECKING:
    from openclaw_cli.backend import ChatTokenizer
    from openclaw_cli.settings import Settings

AGENT_HEADROOM_TOKENS = 4096  # beyond the first prompt: a few tool calls, their results and a reply
PROFILE_RESOURCE = "claude_code_prompt.json"
_ELIDED = re.compile(r"^\[(\d+) characters of Claude Code prompt text elided\]$")
# Stand-in for elided prompt prose: instruction-style English with code words, as agent system prompts are.
STAND_IN_PROSE = (
    "You are an interactive agent that helps users with software engineering tasks. Use the instructions below "
    "and the tools available to you to assist the user. When you run a non-trivial bash command, explain what it "
    "does and why. Prefer editing existing files to creating new ones; never create documentation files unless "
    "asked. Read a file with the Read tool before you edit it, keep changes minimal, and follow the conventions "
    "of the codebase: naming, imports, error handling and tests. If a command fails, read the error, fix the "
    "cause and try again rather than repeating the same call. Use `git status` and `git diff` to review your work "
    "and run the project's tests (for example `pytest -q` or `npm test`) before you say a task is done. "
)
ROUND_TRIP_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a text file from the workspace.",
        "parameters": {
            "type": "object",
            "properties": {"path": {"type": "string", "description": "File path relative to the workspace."}},
            "required": ["path"],
        },
    },
}
ROUND_TRIP_ARGUMENTS = {"path": "notes/todo.txt"}


@dataclass
class DoctorCheck(Check):
    """A Check that may be a warning: shown with "!" and not counted as a failure."""

    warning: bool = False


def warn(name: str, detail: str) -> DoctorCheck:
    return DoctorCheck(name, True, detail, warning=True)


# --- the agent prompt profile --------------------------------------------------------------------------------------
def load_agent_profile() -> dict[str, Any]:
    """The recorded Claude Code request shipped with the package (see the module docstring)."""
    text = resources.files("openclaw_cli.data").joinpath(PROFILE_RESOURCE).read_text(encoding="utf-8")
    return json.loads(text)


def stand_in(length: int) -> str:
    repeats = length // len(STAND_IN_PROSE) + 1
    return (STAND_IN_PROSE * repeats)[:length]


def _restore_elided(value: Any) -> Any:
    if isinstance(value, str):
        match = _ELIDED.match(value)
        return stand_in(int(match.group(1))) if match else value
    if isinstance(value, dict):
        return {k: _restore_elided(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_restore_elided(v) for v in value]
    return value


def agent_prompt(profile: dict[str, Any] | None = None) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools) in OpenAI format, as the proxy renders Claude Code's first request, prose restored."""
    from openclaw_cli.proxy.anthropic_convert import to_openai_messages, to_openai_tools

    profile = _restore_elided(profile if profile is not None else load_agent_profile())
    return to_openai_messages(profile.get("system"), profile["messages"]), to_openai_tools(profile.get("tools"))


def agent_prompt_tokens(tokenizer: ChatTokenizer, profile: dict[str, Any] | None = None) -> tuple[int, bool]:
    """(estimated prompt tokens, whether the template dropped the tools). A template that ignores tools still gets
    them from an agent; they are then counted as their JSON text, the least any tool-aware rendering would take."""
    from openclaw_cli.proxy.completion import dropped_tool_tokens  # what the proxy counts against the context

    messages, tools = agent_prompt(profile)
    dropped = dropped_tool_tokens(tokenizer, tools)
    return len(tokenizer.render(messages, tools)) + dropped, dropped > 0


# --- checks --------------------------------------------------------------------------------------------------------
def context_check(tokenizer: ChatTokenizer, profile: dict[str, Any] | None = None) -> DoctorCheck:
    name = "context fits an agent prompt"
    try:
        needed, tools_dropped = agent_prompt_tokens(tokenizer, profile)
    except Exception as exc:  # a template that rejects the agent's messages is itself the finding
        return warn(name, f"the chat template cannot render Claude Code's prompt: {exc}")
    context = int(tokenizer.context_length)
    counted = " (tools counted as JSON: this template drops them)" if tools_dropped else ""
    detail = (
        f"Claude Code's system prompt + tools ≈ {needed} tokens{counted}; context {context} tokens "
        f"(want ≥ {needed + AGENT_HEADROOM_TOKENS} with room for a few turns)"
    )
    if context < needed + AGENT_HEADROOM_TOKENS:
        return warn(name, f"{detail}: coding agents will hit 'prompt is too long'; use a model with a longer context")
    return DoctorCheck(name, True, detail)


def tools_render_check(tokenizer: ChatTokenizer) -> DoctorCheck:
    name = "chat template renders tools"
    messages = [{"role": "user", "content": "What is in notes/todo.txt?"}]
    try:
        with_tools = tokenizer.decode(tokenizer.render(messages, [ROUND_TRIP_TOOL]))
        without = tokenizer.decode(tokenizer.render(messages, None))
    except Exception as exc:
        return warn(name, f"rendering a request with tools failed: {exc}")
    function = ROUND_TRIP_TOOL["function"]
    if function["name"] not in with_tools or "path" not in with_tools or with_tools == without:
        return warn(name, "the template ignores the tools it is given: the model will not know it can call them")
    return DoctorCheck(name, True, "tool definitions reach the prompt")


def tool_call_round_trip_check(tokenizer: ChatTokenizer) -> DoctorCheck:
    name = "tool call round trip"
    arguments = json.dumps(ROUND_TRIP_ARGUMENTS)
    call = {"id": "call_doctor", "type": "function", "function": {"name": "read_file", "arguments": arguments}}
    prefix_messages = [{"role": "user", "content": "What is in notes/todo.txt?"}]
    assistant = {"role": "assistant", "content": None, "tool_calls": [call]}
    try:
        prefix = tokenizer.decode(tokenizer.render(prefix_messages, [ROUND_TRIP_TOOL], add_generation_prompt=True))
        full = tokenizer.decode(
            tokenizer.render([*prefix_messages, assistant], [ROUND_TRIP_TOOL], add_generation_prompt=False)
        )
    except Exception as exc:
        return warn(name, f"rendering an assistant tool call failed: {exc}")
    if not full.startswith(prefix):
        return warn(
            name, "the template renders the conversation differently once the reply is added; cannot isolate it"
        )
    reply = full[len(prefix) :]
    parsed = tokenizer.parse_assistant(reply)
    got = [(c.name, _json_or_text(c.arguments)) for c in parsed.tool_calls]
    if got != [("read_file", ROUND_TRIP_ARGUMENTS)]:
        shown = reply.strip().replace("\n", " ")[:160]
        return warn(name, f"the template writes tool calls as {shown!r}, which parses back as {got or 'no call'}")
    return DoctorCheck(name, True, "a rendered tool call parses back to the same name and arguments")


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


# --- finding the tokenizer without downloading or converting anything ----------------------------------------------
def local_model_dir(settings: Settings) -> tuple[Path | str | None, str]:
    """Where the model's tokenizer can be loaded from on this machine: a directory or a cached hub id, with a
    description; (None, reason) when it is not available locally."""
    spec = (settings.model or "").strip()
    if not spec:
        try:
            from openclaw_cli.backends.local.model_loading import EMBEDDED_CACHE_SUBDIR, cache_root
        except ImportError as exc:
            return None, f"cannot locate the embedded model ({exc})"
        converted = cache_root() / EMBEDDED_CACHE_SUBDIR
        if (converted / "config.json").is_file():
            return converted, "embedded SmolLM2-135M-Instruct"
        return None, "the embedded model is not converted yet (the first `openclaw serve` does it)"
    local = Path(spec).expanduser()
    if local.is_dir():
        return local, str(local)
    if local.is_file():
        return None, f"{local} is a file (a GGUF is converted on first serve); checks skipped"
    return spec, f"{spec} (Hugging Face cache)"


def load_tokenizer(settings: Settings) -> tuple[ChatTokenizer | None, str]:
    """The model's chat tokenizer from local files only, with its context length from the model config."""
    source, where = local_model_dir(settings)
    if source is None:
        return None, where
    try:
        from transformers import AutoConfig, AutoTokenizer

        from openclaw_cli.tokenizer import HFChatTokenizer

        hf_tokenizer = AutoTokenizer.from_pretrained(str(source), local_files_only=True)
        try:
            config = AutoConfig.from_pretrained(str(source), local_files_only=True)
            context = getattr(config, "max_position_embeddings", None)
        except (OSError, ValueError):
            context = None
        return HFChatTokenizer(hf_tokenizer, context_length=context), where
    except Exception as exc:  # not cached, no chat template, transformers missing: say so, check nothing
        return None, f"cannot load the tokenizer of {where} from local files: {type(exc).__name__}: {exc}"


def model_checks(settings: Settings, tokenizer: ChatTokenizer | None = None) -> list[DoctorCheck]:
    """The three checks above, against ``tokenizer`` or the one :func:`load_tokenizer` finds."""
    where = "given tokenizer"
    if tokenizer is None:
        tokenizer, where = load_tokenizer(settings)
    if tokenizer is None:
        return [warn("model tokenizer", f"{where}; context and tool-call checks skipped")]
    return [context_check(tokenizer), tools_render_check(tokenizer), tool_call_round_trip_check(tokenizer)]
