"""Incremental split of streamed completion text into visible content, reasoning and tool calls.

The non-streamed path splits a finished completion with the tokenizer's ``parse_assistant``. While streaming, the
client must see text as it is generated, yet must never see the raw markup of a tool call or of a reasoning
block. :class:`AssistantStreamSplitter` therefore scans for the markers ``parse_assistant`` understands and:

- holds back any tail of the text that could still be the start of a marker (``<tool_`` may become
  ``<tool_call>``), and emits it as content as soon as it cannot;
- emits reasoning (text inside ``<think>…</think>``) as reasoning deltas;
- buffers a ``<tool_call>`` block until it closes and then hands the block to ``parse_assistant``: a block that
  parses becomes complete tool calls, one that does not is shown verbatim as content (as ``parse_assistant`` does);
- when tools are offered and the reply opens with ``{`` / ``[`` (a Llama-style whole-reply JSON call) or contains
  ``<|python_tag|>``, holds the rest back until it is clearly not a call, or until the end, where
  ``parse_assistant`` decides;
- mirrors ``parse_assistant``'s whitespace rules (reasoning stripped, newlines after ``</think>`` dropped, content
  stripped when the reply has tool calls) by holding trailing whitespace back until more text follows.

The joined output equals ``parse_assistant(full_text)`` (tool call ids aside) for every completion except these
documented cases, where the stream keeps what it already sent: a reply cut off inside ``<think>`` (streamed as
reasoning; the parser would call it content); a bare ``</think>`` with no opening tag when the prompt did not end
in ``<think>`` (text before it was already streamed as content); leading whitespace before content in a reply that
also calls tools; content streamed before a ``<|python_tag|>`` call. Marker detection is plain substring search on
fixed strings; all JSON is read by ``parse_assistant``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from openclaw_cli.tokenizer import PYTHON_TAG, THINK_CLOSE, THINK_OPEN, TOOL_CLOSE, TOOL_OPEN
from openclaw_cli.types import ParsedAssistant, ToolCall

_JSON = json.JSONDecoder()


@dataclass(frozen=True)
class ContentPiece:
    text: str


@dataclass(frozen=True)
class ReasoningPiece:
    text: str


@dataclass(frozen=True)
class ToolCallPiece:
    index: int  # position of the call in this reply, from 0
    call: ToolCall


Piece = ContentPiece | ReasoningPiece | ToolCallPiece


class _Mode(Enum):
    CONTENT = "content"
    REASONING = "reasoning"
    TOOL = "tool"  # inside <tool_call>, waiting for </tool_call>
    HELD = "held"  # maybe a whole-reply JSON / python-tag call: wait


def partial_marker_length(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest tail of ``text`` that is a proper prefix of one of ``markers`` (0 if none)."""
    if not markers:
        return 0
    longest = max(len(m) for m in markers) - 1
    for size in range(min(len(text), longest), 0, -1):
        tail = text[-size:]
        if any(marker.startswith(tail) for marker in markers):
            return size
    return 0


class AssistantStreamSplitter:
    """Feed text deltas in order, then call :meth:`finish` once; each call returns the pieces now safe to send.

    ``parse`` is the tokenizer's ``parse_assistant`` with tools offered (used on complete ``<tool_call>`` blocks and
    on held whole-reply text). ``starts_in_reasoning``: the prompt ended inside an open ``<think>`` (templates that
    put it in the generation prompt), so the completion begins as reasoning.
    """

    def __init__(
        self,
        parse: Callable[[str], ParsedAssistant],
        *,
        tools_offered: bool,
        starts_in_reasoning: bool = False,
    ) -> None:
        self._parse = parse
        self._tools_offered = tools_offered
        self._mode = _Mode.REASONING if starts_in_reasoning else _Mode.CONTENT
        self._think_seen = starts_in_reasoning
        self._hold_released = not tools_offered  # whole-reply holding only matters when tools are offered
        self._buf = ""
        self._tool_scan_from = 0
        self._last_fed = ""
        self._held_json_end: int | None = None  # where a complete JSON value ends in the held text
        self._pending_ws = ""  # trailing content whitespace not sent yet
        self._content_started = False
        self._strip_newlines = False
        self._reasoning_ws = ""
        self._reasoning_started = False
        self._out: list[Piece] = []
        self.content = ""
        self.reasoning = ""
        self.tool_calls: list[ToolCall] = []
        self._finished = False

    # -- public -------------------------------------------------------------------------------------------------

    def feed(self, text: str) -> list[Piece]:
        if self._finished:
            raise RuntimeError("feed() after finish()")
        if text:
            self._buf += text
            self._last_fed = text
            self._drain(final=False)
        return self._take()

    def finish(self) -> list[Piece]:
        if self._finished:
            return []
        self._finished = True
        self._drain(final=True)
        if not self.tool_calls and self._pending_ws:
            self._push(ContentPiece(self._pending_ws))
        self._pending_ws = ""
        return self._take()

    def result(self) -> ParsedAssistant:
        """Everything emitted so far, as one parsed reply (what the client has received)."""
        return ParsedAssistant(content=self.content, tool_calls=list(self.tool_calls), reasoning=self.reasoning)

    # -- state machine ------------------------------------------------------------------------------------------

    def _drain(self, *, final: bool) -> None:
        steps = {
            _Mode.CONTENT: self._drain_content,
            _Mode.REASONING: self._drain_reasoning,
            _Mode.TOOL: self._drain_tool,
            _Mode.HELD: self._drain_held,
        }
        while steps[self._mode](final):
            pass

    def _content_markers(self) -> tuple[str, ...]:
        markers: list[str] = []
        if self._tools_offered:
            markers.append(TOOL_OPEN)
            if not self._hold_released:
                markers.append(PYTHON_TAG)
        if not self._think_seen:
            markers += [THINK_OPEN, THINK_CLOSE]
        return tuple(markers)

    def _drain_content(self, final: bool) -> bool:
        """Returns True when the mode changed (the loop continues), False when waiting for more text."""
        if not self._hold_released and not self._content_started and self._buf.lstrip()[:1] in ("{", "["):
            self._mode = _Mode.HELD
            return True
        markers = self._content_markers()
        found_at, found = -1, ""
        for marker in markers:
            at = self._buf.find(marker)
            if at != -1 and (found_at == -1 or at < found_at):
                found_at, found = at, marker
        if found:
            self._emit_content(self._buf[:found_at])
            rest = self._buf[found_at + len(found) :]
            if found == TOOL_OPEN:
                self._buf, self._tool_scan_from, self._mode = rest, 0, _Mode.TOOL
            elif found == PYTHON_TAG:
                self._buf, self._mode = found + rest, _Mode.HELD
            elif found == THINK_OPEN:
                self._buf, self._think_seen, self._mode = rest, True, _Mode.REASONING
            else:  # a bare </think>: the model closed a block the prompt opened; nothing to send for the tag
                self._buf, self._think_seen = rest, True
                self._after_think()
            return True
        keep = 0 if final else partial_marker_length(self._buf, markers)
        self._emit_content(self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _drain_reasoning(self, final: bool) -> bool:
        at = self._buf.find(THINK_CLOSE)
        if at != -1:
            self._emit_reasoning(self._buf[:at])
            self._buf = self._buf[at + len(THINK_CLOSE) :]
            self._reasoning_ws = ""
            self._think_seen = True
            self._mode = _Mode.CONTENT
            self._after_think()
            return True
        keep = 0 if final else partial_marker_length(self._buf, (THINK_CLOSE,))
        self._emit_reasoning(self._buf[: len(self._buf) - keep])
        self._buf = self._buf[len(self._buf) - keep :]
        return False

    def _drain_tool(self, final: bool) -> bool:
        at = self._buf.find(TOOL_CLOSE, self._tool_scan_from)
        if at != -1:
            block = TOOL_OPEN + self._buf[:at] + TOOL_CLOSE
            self._buf = self._buf[at + len(TOOL_CLOSE) :]
            self._mode = _Mode.CONTENT
            self._finish_block(block)
            return True
        if final:  # unclosed at the end: parse_assistant reads the block to the end of the text
            block, self._buf = TOOL_OPEN + self._buf, ""
            self._mode = _Mode.CONTENT
            self._finish_block(block)
            return True
        self._tool_scan_from = max(0, len(self._buf) - len(TOOL_CLOSE) + 1)
        return False

    def _drain_held(self, final: bool) -> bool:
        if not final:
            if self._held_cannot_be_call():
                self._hold_released = True
                self._mode = _Mode.CONTENT
                return True
            return False
        parsed = self._parse(self._buf)
        if parsed.tool_calls:
            self._buf, self._pending_ws = "", ""  # a reply with calls has its content stripped
            self._emit_content(parsed.content)
            for call in parsed.tool_calls:
                self._push_call(call)
            self._mode = _Mode.CONTENT
            return False
        # Not a call after all: treat the held text as ordinary text (think / tool blocks still recognised).
        self._hold_released = True
        self._mode = _Mode.CONTENT
        return True

    def _held_cannot_be_call(self) -> bool:
        """Early release for replies that start like JSON but cannot be a whole-reply call, so prose such as
        ``[1] see …`` still streams incrementally."""
        lead = self._buf.lstrip()
        if lead.startswith(PYTHON_TAG) or PYTHON_TAG.startswith(lead):
            return False
        opener, after = lead[:1], lead[1:].lstrip()
        if after and ((opener == "[" and after[0] != "{") or (opener == "{" and after[0] != '"')):
            return True
        if self._held_json_end is None:
            if "}" not in self._last_fed and "]" not in self._last_fed:
                return False  # a JSON value can only complete on a closing bracket
            try:
                _, end = _JSON.raw_decode(lead)
            except json.JSONDecodeError:
                return False
            self._held_json_end = len(self._buf) - len(lead) + end  # the held buffer only grows, so this stays valid
        return bool(self._buf[self._held_json_end :].strip())

    # -- emission -----------------------------------------------------------------------------------------------

    def _finish_block(self, block: str) -> None:
        parsed = self._parse(block)
        if parsed.tool_calls:
            for call in parsed.tool_calls:
                self._push_call(call)
        else:
            self._emit_content(block)  # not a valid call: shown as written

    def _after_think(self) -> None:
        # parse_assistant drops newlines at the start of the reply once a think block is removed.
        if not self._content_started:
            self._pending_ws = self._pending_ws.lstrip("\n")
            self._strip_newlines = not self._pending_ws

    def _emit_content(self, text: str) -> None:
        if not text:
            return
        if self._strip_newlines:
            text = text.lstrip("\n")
            if not text:
                return
            self._strip_newlines = False
        text = self._pending_ws + text
        core = text.rstrip()
        if core:
            self._push(ContentPiece(core))
            self._content_started = True
        self._pending_ws = text[len(core) :]

    def _emit_reasoning(self, text: str) -> None:
        if not self._reasoning_started:
            text = text.lstrip()
            if not text:
                return
            self._reasoning_started = True
        text = self._reasoning_ws + text
        core = text.rstrip()
        if core:
            self._push(ReasoningPiece(core))
        self._reasoning_ws = text[len(core) :]

    def _push_call(self, call: ToolCall) -> None:
        self._push(ToolCallPiece(len(self.tool_calls), call))

    def _push(self, piece: Piece) -> None:
        if isinstance(piece, ContentPiece):
            self.content += piece.text
        elif isinstance(piece, ReasoningPiece):
            self.reasoning += piece.text
        else:
            self.tool_calls.append(piece.call)
        self._out.append(piece)

    def _take(self) -> list[Piece]:
        out, self._out = self._out, []
        return out
