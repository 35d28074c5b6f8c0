"""Session identity, main/side classification and next-state pairing: the store-side :class:`CaptureSink`.

**Session identity.** The first of: header ``x-session-id``, header ``x-claude-code-session-id``, header
``session_id`` (Codex), the OpenAI body field ``user``, the Responses body field ``prompt_cache_key``, the Anthropic
body field ``metadata.user_id``. That id is the session's *scope*; requests without
one share the inferred scope ``""``. Within a scope, a request is placed by a prefix tree over message history:
every stored turn is indexed (in the database, so nothing grows in memory) by the hash of its canonical history
``messages + assistant reply``; a new request is matched against the hashes of its own message prefixes that end
with an assistant message, and the longest match wins.

**Canonical form** (what the hash sees; see :func:`canonical_message`): role (``developer`` counts as ``system``),
content and tool calls only. Content strings and text parts are the same thing: text parts are joined with a space,
and every run of whitespace becomes one space, trimmed. Non-text parts are kept as sorted JSON without
``cache_control``; reasoning/thinking is dropped (clients rarely echo it). Tool calls are (name, arguments as sorted
compact JSON); tool call ids, ``tool_call_id``, ``name`` and ``type`` are ignored because clients and API
conversions rewrite them.

**Where a request goes.**

- It extends the latest main turn (the *tail*) of an open session: a *continuation* — main turn, same session, and
  the tail gets its next state (the messages after its prefix, e.g. the new user message or the tool results) and
  becomes ``ready``.
- It extends an earlier main turn, or the tail of an ended/expired session: a *fork*. It is recorded as a **new
  session** in the same scope (``parent_session_id`` and ``fork_turn_id`` name the branch point; the new turn's
  ``parent_turn_id`` is that turn and its ``turn_index`` continues from it). The turn it extends keeps the next
  state it already has (or none): one next state per turn, never rewritten.
- It extends a side turn: a side turn in that session.
- It matches nothing: in the inferred scope, a new session (main). In a client-named scope that already has a main
  line, it is side unless it is a fresh conversation (no assistant message yet) with the same system prompt as a
  main line of that scope, which starts a new session (``<id>~2``, ``<id>~3`` …); the first main line of a scope
  uses the client's id itself as the session id.

**Turn type.** ``choice_index > 0`` is always side (only choice 0 may be main-line); then header ``x-turn-type:
main|side`` (or ``exchange.metadata["turn_type"]``); then the model name ``openclaw-side``; else inferred as above,
plus one heuristic: a one-shot request (no assistant message) or a continuation's new user text that asks for a
title/summary/tags of the conversation (or starts with ``### Task:``) is side. Side turns are stored with status
``skipped``: never judged, never trained, never paired. A side turn that matches no session joins the most recently
active session of its scope (or a new one).

**Ending.** ``x-session-done: 1|true`` on a request, :meth:`SessionCapture.end_session`, or no request for
``settings.session_idle_s`` (:meth:`SessionCapture.expire_idle`) close the session: its pending tail becomes ready
with no next state.

**Writing.** :meth:`SessionCapture.record` returns after the commit. Exchanges that arrive while a write is in
progress are written together in the next transaction (group commit), so concurrent requests share one commit; the
hashing is done before the write lock is taken. All state lives in the store: nothing pending is kept in memory.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from openclaw_cli.capture import CapturedExchange, RecordedTurn, TurnType
from openclaw_cli.settings import Settings
from openclaw_cli.store import NewTurn, PrefixMatch, Store, StoreTx
from openclaw_cli.types import Message

# Codex sends its conversation id as a ``session_id`` header (and the same value as ``prompt_cache_key``).
SESSION_HEADERS = ("x-session-id", "x-claude-code-session-id", "session_id")
TURN_TYPE_HEADER = "x-turn-type"
SESSION_DONE_HEADER = "x-session-done"
SIDE_MODEL = "openclaw-side"
INFERRED_SCOPE = ""
_TRUE = frozenset({"1", "true", "yes", "on"})
_HASH_BYTES = 16
_MAX_BATCH = 256  # exchanges per group commit


# --- identity ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SessionIdentity:
    scope: str  # the client's id, or "" when none was given
    source: str  # where it came from: header:x-session-id, openai:user, anthropic:metadata.user_id, inferred


def session_identity(exchange: CapturedExchange) -> SessionIdentity:
    scope, source = client_session_scope(exchange.headers, exchange.request)
    return SessionIdentity(scope, source)


def client_session_scope(headers: Mapping[str, str], request: Mapping[str, Any]) -> tuple[str, str]:
    """The client's own session id and where it came from (see the module docstring), or ("", "inferred");
    ``headers``: a mapping that finds lower-cased names."""
    for name in SESSION_HEADERS:
        value = (headers.get(name) or "").strip()
        if value:
            return value, f"header:{name}"
    user = request.get("user")
    if isinstance(user, str) and user.strip():
        return user.strip(), "openai:user"
    cache_key = request.get("prompt_cache_key")
    if isinstance(cache_key, str) and cache_key.strip():
        return cache_key.strip(), "openai:prompt_cache_key"
    metadata = request.get("metadata")
    if isinstance(metadata, dict):
        user_id = metadata.get("user_id")
        if isinstance(user_id, str) and user_id.strip():
            return user_id.strip(), "anthropic:metadata.user_id"
    return INFERRED_SCOPE, "inferred"


def likely_main_line(headers: Mapping[str, str], turn_type_hint: str | None, messages: Sequence[Message]) -> bool:
    """Before the reply exists, whether a request will be a main-line turn as far as the request alone tells: not
    when marked side (header ``x-turn-type``, the model ``openclaw-side``) or when it reads like an app's background
    task (the last user message, or a one-shot request's short system prompt, asks for a title/summary/tags of the
    conversation). The serving path uses it to keep lessons out of side requests."""
    asked = (headers.get(TURN_TYPE_HEADER) or "").strip().lower()
    if asked in ("main", "side"):
        return asked == "main"
    if turn_type_hint == "side":
        return False
    if not _has_assistant(messages):
        return not looks_auxiliary(_one_shot_texts(messages))
    users = [m for m in messages if m.get("role") == "user"]
    return not (users and looks_auxiliary([_text_of(users[-1])]))


def requested_turn_type(exchange: CapturedExchange) -> tuple[TurnType, str] | None:
    """The turn type the client (or the proxy) asked for explicitly, with the reason; None = infer it."""
    if exchange.choice_index > 0:
        return "side", "choice"
    for asked, reason in (
        (exchange.headers.get(TURN_TYPE_HEADER), "header"),
        (exchange.metadata.get("turn_type"), "metadata"),
    ):
        if isinstance(asked, str) and asked.strip().lower() in ("main", "side"):
            return ("main" if asked.strip().lower() == "main" else "side"), reason
    models = (exchange.model, exchange.request.get("model"), exchange.metadata.get("model"))
    if SIDE_MODEL in models:
        return "side", "model"
    return None


def session_done_requested(exchange: CapturedExchange) -> bool:
    flag = exchange.headers.get(SESSION_DONE_HEADER, "")
    return flag.strip().lower() in _TRUE or bool(exchange.metadata.get("session_done"))


# --- canonical history ---------------------------------------------------------------------------------------------
_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})
_DROPPED_PART_TYPES = frozenset({"thinking", "redacted_thinking", "reasoning"})


def _normalize_text(text: str) -> str:
    return " ".join(text.split())


def _canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


def _without_cache_control(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_cache_control(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_without_cache_control(v) for v in value]
    return value


def _canonical_content(content: Any) -> Any:
    if content is None:
        return ""
    if isinstance(content, str):
        return _normalize_text(content)
    parts = content if isinstance(content, list) else [content]
    out: list[Any] = []
    texts: list[str] = []
    for part in parts:
        if isinstance(part, str):
            texts.append(part)
            continue
        if not isinstance(part, dict):
            texts.append(str(part))
            continue
        kind = part.get("type")
        if kind in _TEXT_PART_TYPES:
            texts.append(str(part.get("text") or ""))
        elif kind in _DROPPED_PART_TYPES:
            continue
        else:
            if texts:
                out.append(_normalize_text(" ".join(texts)))
                texts = []
            out.append(_without_cache_control(part))
    if texts:
        out.append(_normalize_text(" ".join(texts)))
    out = [p for p in out if p != ""]
    if not out:
        return ""
    if len(out) == 1 and isinstance(out[0], str):
        return out[0]
    return out


def _canonical_arguments(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return _normalize_text(arguments)
    return {} if arguments is None else arguments


def _canonical_role(message: Message) -> str:
    role = str(message.get("role") or "").lower()
    return "system" if role == "developer" else role


def canonical_message(message: Message) -> dict[str, Any]:
    """The parts of a message that identify it across requests (see the module docstring)."""
    out: dict[str, Any] = {"role": _canonical_role(message), "content": _canonical_content(message.get("content"))}
    calls = message.get("tool_calls") or []
    if calls:
        canonical_calls = []
        for call in calls:
            function = (call.get("function") or {}) if isinstance(call, dict) else {}
            canonical_calls.append(
                {"name": function.get("name"), "arguments": _canonical_arguments(function.get("arguments"))}
            )
        out["tool_calls"] = canonical_calls
    return out


def _canonical_bytes(message: Message) -> bytes:
    content = message.get("content")
    # Fast path for the common plain-text message; it yields exactly what the general path yields for it.
    if isinstance(content, str) and not message.get("tool_calls"):
        return f"{_canonical_role(message)}\x1f{_normalize_text(content)}".encode()
    canonical = canonical_message(message)
    if isinstance(canonical["content"], str) and "tool_calls" not in canonical:
        return f"{canonical['role']}\x1f{canonical['content']}".encode()
    return _canonical_json(canonical).encode()


# Every request re-sends its whole history, so the chain step of each earlier plain-text message was computed for the
# previous request already: remember it, keyed exactly (previous hash, role, content). Bounded by the characters it
# holds; when full it starts over (a miss only costs the recomputation).
_CHAIN_CACHE_MAX_CHARS = 4_000_000
_chain_cache: dict[tuple[bytes, str, str], bytes] = {}
_chain_cache_chars = 0


def _chain(previous: bytes, message: Message) -> bytes:
    global _chain_cache_chars
    content, role = message.get("content"), message.get("role")
    if not (isinstance(content, str) and isinstance(role, str)) or message.get("tool_calls"):
        return hashlib.blake2b(previous + _canonical_bytes(message), digest_size=_HASH_BYTES).digest()
    key = (previous, role, content)
    digest = _chain_cache.get(key)
    if digest is None:
        digest = hashlib.blake2b(previous + _canonical_bytes(message), digest_size=_HASH_BYTES).digest()
        if _chain_cache_chars + len(content) > _CHAIN_CACHE_MAX_CHARS:
            _chain_cache.clear()
            _chain_cache_chars = 0
        _chain_cache[key] = digest
        _chain_cache_chars += len(content)
    return digest


def history_hashes(messages: Sequence[Message]) -> list[bytes]:
    """``result[k]`` identifies the canonical history ``messages[: k + 1]`` (a hash chain, one step per message:
    ``h[k] = H(h[k-1] + canonical(messages[k]))``, so equal hashes mean equal canonical prefixes)."""
    hashes: list[bytes] = []
    previous = b""
    for message in messages:
        previous = _chain(previous, message)
        hashes.append(previous)
    return hashes


def system_prompt_hash(messages: Sequence[Message]) -> bytes:
    """Identifies a conversation's system prompt; b"" when it has none."""
    if messages and str(messages[0].get("role")).lower() in ("system", "developer"):
        return _chain(b"", messages[0])
    return b""


# --- the auxiliary-request heuristic -------------------------------------------------------------------------------
_TASK_HEADER = re.compile(r"^\s*###\s*task\s*:", re.IGNORECASE)
_AUX_NEAR_CONVERSATION = re.compile(
    r"\b(titles?|summary|summari[sz]e|summari[sz]ing|tags|follow[- ]?ups?)\b[^.\n]{0,60}"
    r"\b(conversation|chat|discussion|transcript|dialog(?:ue)?)\b"
    r"|\b(conversation|chat|discussion|transcript|dialog(?:ue)?)\b[^.\n]{0,60}"
    r"\b(titles?|summary|summari[sz]e|tags)\b",
    re.IGNORECASE,
)
_AUX_SCAN_CHARS = 4000
_TASK_SYSTEM_PROMPT_MAX_CHARS = 1500


def _text_of(message: Message) -> str:
    content = _canonical_content(message.get("content"))
    if isinstance(content, str):
        return content
    return " ".join(p for p in content if isinstance(p, str))


def looks_auxiliary(texts: Sequence[str]) -> bool:
    """Whether an instruction reads like an app's background task (title, summary or tags of a conversation)."""
    for text in texts:
        head = text[:_AUX_SCAN_CHARS]
        if _TASK_HEADER.search(head) or _AUX_NEAR_CONVERSATION.search(head):
            return True
    return False


def _one_shot_texts(messages: Sequence[Message]) -> list[str]:
    # A short system prompt can itself be the background task ("extract a 2-3 word title ..."); a long one is an
    # agent's standing instructions, which may well mention summaries of the conversation without being one.
    systems = [_text_of(m) for m in messages if str(m.get("role")).lower() in ("system", "developer")]
    texts = [text for text in systems if len(text) <= _TASK_SYSTEM_PROMPT_MAX_CHARS]
    users = [m for m in messages if m.get("role") == "user"]
    if users:
        texts.append(_text_of(users[-1]))
    return texts


def _has_assistant(messages: Sequence[Message]) -> bool:
    return any(m.get("role") == "assistant" for m in messages)


# --- placement -----------------------------------------------------------------------------------------------------
@dataclass
class _Placement:
    turn_type: TurnType
    reason: str
    session_id: str | None = None  # None: create a new session
    parent: PrefixMatch | None = None  # the turn this one extends
    pair_with: PrefixMatch | None = None  # continuation: the tail that gets its next state
    next_state: list[Message] | None = None
    fork_of: PrefixMatch | None = None


def _best_match(matches: list[PrefixMatch], lengths: dict[bytes, int], main_only: bool) -> PrefixMatch | None:
    candidates = [m for m in matches if not main_only or m.turn_type == "main"]
    if not candidates:
        return None

    def rank(m: PrefixMatch) -> tuple[int, int, int, int]:
        # Longest history first; then a main turn; then one that can be continued (not a fork); then the newest.
        return (lengths[m.hash], m.turn_type == "main", m.is_tail and m.session_open, m.turn_id)

    return max(candidates, key=rank)


def _lookup(tx: StoreTx, scope: str, lengths: dict[bytes, int], *, main_only: bool) -> list[PrefixMatch]:
    """Stored turns matching the request's prefixes. The longest candidate is tried alone first: a continuation
    matches it, and then the shorter prefixes (every earlier turn of the conversation) need not be fetched."""
    if not lengths:
        return []
    ordered = sorted(lengths, key=lengths.__getitem__, reverse=True)
    longest = tx.find_prefixes(scope, ordered[:1])
    if any(not main_only or m.turn_type == "main" for m in longest):
        return longest
    return longest + tx.find_prefixes(scope, ordered[1:]) if len(ordered) > 1 else longest


@dataclass
class _Prepared:
    """The lock-free part of recording: identity, explicit type, history hashes."""

    exchange: CapturedExchange
    identity: SessionIdentity
    asked: tuple[TurnType, str] | None
    lengths: dict[bytes, int]  # hash of messages[:k] -> k, for prefixes that could equal a stored turn's history
    own_hash: bytes  # hash of messages + the reply: what later requests will extend
    system_hash: bytes


def _prepare(exchange: CapturedExchange) -> _Prepared:
    messages = exchange.messages
    prefix_hashes = history_hashes(messages)
    own_hash = _chain(prefix_hashes[-1] if prefix_hashes else b"", exchange.assistant_message)
    # Only prefixes ending in an assistant reply can equal a stored turn's history, and a match must leave at least
    # one message after it (the next state).
    lengths = {prefix_hashes[k - 1]: k for k in range(1, len(messages)) if messages[k - 1].get("role") == "assistant"}
    has_system = bool(messages) and str(messages[0].get("role")).lower() in ("system", "developer")
    return _Prepared(
        exchange=exchange,
        identity=session_identity(exchange),
        asked=requested_turn_type(exchange),
        lengths=lengths,
        own_hash=own_hash,
        system_hash=prefix_hashes[0] if has_system else b"",
    )


class SessionCapture:
    """The CaptureSink the proxy calls: places each exchange in a session and persists it in one transaction."""

    def __init__(self, store: Store, settings: Settings, *, clock: Callable[[], float] = time.time) -> None:
        self.store = store
        self.idle_s = settings.session_idle_s
        self._clock = clock
        self._queue: list[tuple[CapturedExchange, asyncio.Future[RecordedTurn]]] = []
        self._flusher: asyncio.Task[None] | None = None

    # CaptureSink ----------------------------------------------------------------------------------------------------
    async def record(self, exchange: CapturedExchange) -> RecordedTurn:
        """Persist atomically; returns after the commit (the exchange then survives a process crash).

        Group commit: exchanges that arrive while a write is in progress are written together in the next
        transaction, so concurrent requests share one commit. Once handed over, an exchange is written even if
        the caller is cancelled meanwhile.
        """
        loop = asyncio.get_running_loop()
        if self._flusher is not None and not self._flusher.done() and self._flusher.get_loop() is not loop:
            return await asyncio.to_thread(self.record_sync, exchange)  # another event loop is mid-flush
        future: asyncio.Future[RecordedTurn] = loop.create_future()
        self._queue.append((exchange, future))
        if self._flusher is None or self._flusher.done():
            self._flusher = loop.create_task(self._flush())
        return await future

    async def _flush(self) -> None:
        while self._queue:
            batch, self._queue = self._queue[:_MAX_BATCH], self._queue[_MAX_BATCH:]
            try:
                outcomes = await asyncio.to_thread(self._record_batch, [exchange for exchange, _ in batch])
            except BaseException as exc:
                # The write failed as a whole (or we are being cancelled at shutdown): tell every waiter.
                failure = exc if isinstance(exc, Exception) else RuntimeError("capture stopped before commit")
                waiting = batch if isinstance(exc, Exception) else batch + self._queue
                if not isinstance(exc, Exception):
                    self._queue = []
                for _, future in waiting:
                    if not future.done():
                        future.set_exception(failure)
                if isinstance(exc, Exception):
                    continue
                raise
            for (_, future), outcome in zip(batch, outcomes, strict=True):
                if future.done():  # the caller was cancelled; the turn is stored all the same
                    continue
                if isinstance(outcome, Exception):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

    async def end_session(self, session_id: str) -> bool:
        return await asyncio.to_thread(self.end_session_sync, session_id)

    async def expire_idle(self, now: float | None = None) -> int:
        return await asyncio.to_thread(self.expire_idle_sync, now)

    def stats(self) -> dict[str, Any]:
        counts = self.store.counts()
        sessions = counts["sessions"]
        main, side = counts["turns"].get("main", {}), counts["turns"].get("side", {})
        return {
            "sessions": {
                "total": sum(sessions.values()),
                "open": sessions.get("open", 0),
                "ended": sessions.get("ended", 0),
                "expired": sessions.get("expired", 0),
            },
            "turns": {
                "total": sum(main.values()) + sum(side.values()),
                "main": sum(main.values()),
                "side": sum(side.values()),
                "main_by_status": dict(main),
            },
            "pending": main.get("pending", 0),
            "ready": main.get("ready", 0),
            "last_turn_at": counts["last_turn_at"],
        }

    # synchronous implementations (run in a worker thread) ----------------------------------------------------------
    def record_sync(self, exchange: CapturedExchange) -> RecordedTurn:
        """Persist one exchange in its own transaction (for callers outside asyncio)."""
        (outcome,) = self._record_batch([exchange])
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    def _record_batch(self, exchanges: Sequence[CapturedExchange]) -> list[RecordedTurn | Exception]:
        """Persist exchanges in arrival order in ONE transaction (one commit). Hashing happens before the write
        lock is taken. If any exchange fails, the batch is rolled back and redone one transaction per exchange, so
        a bad exchange fails alone and the others are still stored."""
        prepared: list[_Prepared | Exception] = []
        for exchange in exchanges:
            try:
                prepared.append(_prepare(exchange))
            except Exception as exc:
                prepared.append(exc)
        if len(prepared) > 1 and not any(isinstance(item, Exception) for item in prepared):
            try:
                with self.store.transaction() as tx:
                    return [self._record_in(tx, item, self._clock()) for item in prepared]  # type: ignore[arg-type]
            except Exception:
                pass  # isolate the failure below
        outcomes: list[RecordedTurn | Exception] = []
        for item in prepared:
            if isinstance(item, Exception):
                outcomes.append(item)
                continue
            try:
                with self.store.transaction() as tx:
                    outcomes.append(self._record_in(tx, item, self._clock()))
            except Exception as exc:
                outcomes.append(exc)
        return outcomes

    def _record_in(self, tx: StoreTx, item: _Prepared, now: float) -> RecordedTurn:
        exchange, identity = item.exchange, item.identity
        messages = exchange.messages
        forced_main = item.asked is not None and item.asked[0] == "main"
        matches = _lookup(tx, identity.scope, item.lengths, main_only=forced_main)
        placement = self._place(tx, identity, item.asked, messages, matches, item.lengths, now)
        session_id = placement.session_id or self._new_session(tx, identity, placement.fork_of, now)
        is_main = placement.turn_type == "main"
        parent = placement.parent
        turn_index = (parent.turn_index + 1 if parent else 0) if is_main else -1
        turn_id = tx.insert_turn(
            _new_turn(
                exchange,
                session_id=session_id,
                parent_turn_id=parent.turn_id if parent else None,
                turn_index=turn_index,
                turn_type=placement.turn_type,
                reason=placement.reason,
                now=now,
            )
        )
        tx.add_prefix(identity.scope, item.own_hash, turn_id)
        if placement.pair_with is not None and placement.next_state is not None:
            role = placement.next_state[-1].get("role") if placement.next_state else None
            tx.set_next_state(placement.pair_with.turn_id, placement.next_state, role, now)
        tx.touch_session(
            session_id,
            now,
            main_turn_id=turn_id if is_main else None,
            system_hash=item.system_hash if is_main else None,
        )
        if session_done_requested(exchange):
            tx.close_session(session_id, "ended", now)
        return RecordedTurn(
            session_id=session_id, turn_id=turn_id, turn_type=placement.turn_type, turn_index=turn_index
        )

    def _place(
        self,
        tx: StoreTx,
        identity: SessionIdentity,
        asked: tuple[TurnType, str] | None,
        messages: list[Message],
        matches: list[PrefixMatch],
        lengths: dict[bytes, int],
        now: float,
    ) -> _Placement:
        if asked is not None and asked[0] == "side":
            best = _best_match(matches, lengths, main_only=False)
            home = best.session_id if best else self._side_home(tx, identity, now)
            return _Placement("side", asked[1], session_id=home)
        forced_main = asked is not None
        best = _best_match(matches, lengths, main_only=forced_main)
        if best is not None and best.turn_type == "side":
            return _Placement("side", "side-continuation", session_id=best.session_id)
        if best is not None:
            delta = messages[lengths[best.hash] :]
            delta_user_texts = [_text_of(m) for m in delta if m.get("role") == "user"]
            if not forced_main and looks_auxiliary(delta_user_texts):
                return _Placement("side", "auxiliary", session_id=best.session_id)
            reason = asked[1] if forced_main and asked else "continuation"
            if best.is_tail and best.session_open:
                return _Placement(
                    "main", reason, session_id=best.session_id, parent=best, pair_with=best, next_state=delta
                )
            return _Placement("main", "fork", parent=best, fork_of=best)
        # No stored history matches.
        if forced_main and asked:
            return _Placement("main", asked[1], session_id=self._reusable_session(tx, identity))
        if not _has_assistant(messages) and looks_auxiliary(_one_shot_texts(messages)):
            return _Placement("side", "auxiliary", session_id=self._side_home(tx, identity, now))
        if identity.scope == INFERRED_SCOPE:
            return _Placement("main", "first")
        systems = tx.scope_system_hashes(identity.scope)
        if not systems:
            return _Placement("main", "first", session_id=self._reusable_session(tx, identity))
        if not _has_assistant(messages) and system_prompt_hash(messages) in systems:
            return _Placement("main", "new-conversation")
        return _Placement("side", "off-main-line", session_id=self._side_home(tx, identity, now))

    def _reusable_session(self, tx: StoreTx, identity: SessionIdentity) -> str | None:
        """A client-named open session with no main line yet (only side turns) takes the first main line."""
        if identity.scope == INFERRED_SCOPE:
            return None
        latest = tx.latest_session(identity.scope, open_only=True)
        return latest.id if latest is not None and latest.main_turns == 0 else None

    def _side_home(self, tx: StoreTx, identity: SessionIdentity, now: float) -> str:
        """Where a side turn that extends nothing is filed: the scope's most recently active session."""
        latest = tx.latest_session(identity.scope, open_only=True) or tx.latest_session(identity.scope)
        if latest is not None:
            return latest.id
        return self._new_session(tx, identity, None, now)

    def _new_session(self, tx: StoreTx, identity: SessionIdentity, fork_of: PrefixMatch | None, now: float) -> str:
        session_id = self._fresh_session_id(tx, identity.scope)
        tx.create_session(
            session_id,
            scope=identity.scope,
            id_source=identity.source,
            now=now,
            parent_session_id=fork_of.session_id if fork_of else None,
            fork_turn_id=fork_of.turn_id if fork_of else None,
        )
        return session_id

    @staticmethod
    def _fresh_session_id(tx: StoreTx, scope: str) -> str:
        if scope == INFERRED_SCOPE:
            return f"s-{secrets.token_hex(8)}"
        if tx.get_session(scope) is None:
            return scope
        n = tx.count_sessions(scope) + 1
        while tx.get_session(f"{scope}~{n}") is not None:
            n += 1
        return f"{scope}~{n}"

    def end_session_sync(self, session_id: str) -> bool:
        """Close the session with this id and every open session of the client scope of that name."""
        now = self._clock()
        with self.store.transaction() as tx:
            closed = tx.close_session(session_id, "ended", now)
            for other in tx.open_sessions_in_scope(session_id):
                closed = tx.close_session(other, "ended", now) or closed
        return closed

    def expire_idle_sync(self, now: float | None = None) -> int:
        now = self._clock() if now is None else now
        with self.store.transaction() as tx:
            idle = tx.open_sessions_idle_since(now - self.idle_s)
            for session_id in idle:
                tx.close_session(session_id, "expired", now)
        return len(idle)


def _new_turn(
    exchange: CapturedExchange,
    *,
    session_id: str,
    parent_turn_id: int | None,
    turn_index: int,
    turn_type: TurnType,
    reason: str,
    now: float,
) -> NewTurn:
    return NewTurn(
        session_id=session_id,
        parent_turn_id=parent_turn_id,
        turn_index=turn_index,
        turn_type=turn_type,
        type_reason=reason,
        status="pending" if turn_type == "main" else "skipped",
        api=exchange.api,
        model=exchange.model,
        stream=exchange.stream,
        choice_index=exchange.choice_index,
        messages=list(exchange.messages),
        tools=exchange.tools,
        request=exchange.request,
        response=exchange.response,
        assistant_message=exchange.assistant_message,
        headers=exchange.headers,
        metadata=exchange.metadata,
        prompt_tokens=exchange.prompt_tokens,
        completion_tokens=exchange.completion_tokens,
        logprobs=exchange.logprobs,
        sampling_logprobs=exchange.sampling_logprobs,
        version=exchange.version,
        finish_reason=exchange.finish_reason,
        started_at=exchange.started_at,
        first_token_at=exchange.first_token_at,
        finished_at=exchange.finished_at,
        created_at=now,
    )
