"""Session identity, prefix-tree inference, main/side classification, next-state pairing, ending and expiry."""

from __future__ import annotations

import asyncio
import copy
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openclaw_cli.capture import CapturedExchange
from openclaw_cli.capture.sessions import (
    SessionCapture,
    canonical_message,
    history_hashes,
    looks_auxiliary,
    session_identity,
)
from openclaw_cli.settings import Settings
from openclaw_cli.store import Store

SYSTEM = {"role": "system", "content": "You are a coding agent. Use tools when useful."}
IDLE_S = 600.0


class Clock:
    def __init__(self, start: float = 1_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now


def make_exchange(
    messages: list[dict[str, Any]],
    reply: str | None = "ok",
    *,
    tool_calls: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
    request_extra: dict[str, Any] | None = None,
    model: str = "openclaw-policy",
    api: str = "openai",
    choice_index: int = 0,
    metadata: dict[str, Any] | None = None,
) -> CapturedExchange:
    assistant: dict[str, Any] = {"role": "assistant", "content": reply}
    if tool_calls:
        assistant["tool_calls"] = tool_calls
    request = {"model": model, "messages": copy.deepcopy(messages), **(request_extra or {})}
    return CapturedExchange(
        api=api,  # type: ignore[arg-type]
        headers=headers or {},
        request=request,
        messages=copy.deepcopy(messages),
        tools=None,
        model=model,
        prompt_tokens=[11, 12, 13],
        completion_tokens=[21, 22],
        logprobs=[-0.5, -0.25],
        sampling_logprobs=[-0.4, -0.2],
        version=3,
        finish_reason="tool_calls" if tool_calls else "stop",
        assistant_message=assistant,
        response={"id": "resp"},
        started_at=1.0,
        first_token_at=1.5,
        finished_at=2.0,
        choice_index=choice_index,
        metadata=metadata or {},
    )


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def store(tmp_path: Path):
    with Store(tmp_path / "store.sqlite3") as opened:
        yield opened


@pytest.fixture
def capture(store: Store, clock: Clock) -> SessionCapture:
    return SessionCapture(store, Settings(session_idle_s=IDLE_S), clock=clock)


# --- identity ------------------------------------------------------------------------------------------------------
def test_identity_precedence_header_then_claude_header_then_user_then_metadata() -> None:
    msgs = [{"role": "user", "content": "hi"}]
    both = make_exchange(
        msgs,
        headers={"x-session-id": "hdr", "x-claude-code-session-id": "cc"},
        request_extra={"user": "u1", "metadata": {"user_id": "m1"}},
    )
    assert (session_identity(both).scope, session_identity(both).source) == ("hdr", "header:x-session-id")
    claude = make_exchange(msgs, headers={"x-claude-code-session-id": "cc"}, request_extra={"user": "u1"})
    assert session_identity(claude).scope == "cc"
    user = make_exchange(msgs, request_extra={"user": "u1", "metadata": {"user_id": "m1"}})
    assert (session_identity(user).scope, session_identity(user).source) == ("u1", "openai:user")
    meta = make_exchange(msgs, api="anthropic", request_extra={"metadata": {"user_id": "m1"}})
    assert session_identity(meta).source == "anthropic:metadata.user_id"
    assert session_identity(make_exchange(msgs, headers={"x-session-id": "  "})).scope == ""


async def test_explicit_ids_name_the_session(capture: SessionCapture) -> None:
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    by_header = await capture.record(make_exchange(msgs, headers={"x-session-id": "abc"}))
    by_user = await capture.record(make_exchange(msgs, request_extra={"user": "alice"}))
    by_meta = await capture.record(make_exchange(msgs, api="anthropic", request_extra={"metadata": {"user_id": "m"}}))
    assert (by_header.session_id, by_user.session_id, by_meta.session_id) == ("abc", "alice", "m")
    assert {by_header.turn_type, by_user.turn_type, by_meta.turn_type} == {"main"}
    assert capture.store.get_session("abc").id_source == "header:x-session-id"  # type: ignore[union-attr]


# --- canonical form ------------------------------------------------------------------------------------------------
def test_canonical_form_ignores_what_clients_rewrite() -> None:
    stored = {
        "role": "assistant",
        "content": "  Let me check\n the file. ",
        "reasoning_content": "thinking...",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "read", "arguments": '{"path": "a.py", "n": 1}'}}
        ],
    }
    echoed = {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Let me check the"},
            {"type": "text", "text": "file.", "cache_control": {}},
        ],
        "tool_calls": [{"id": "toolu_XYZ", "function": {"name": "read", "arguments": '{"n":1,"path":"a.py"}'}}],
    }
    assert canonical_message(stored) == canonical_message(echoed)
    assert canonical_message(stored) == {
        "role": "assistant",
        "content": "Let me check the file.",
        "tool_calls": [{"name": "read", "arguments": {"n": 1, "path": "a.py"}}],
    }
    assert canonical_message({"role": "developer", "content": "x"}) == canonical_message(
        {"role": "system", "content": "x"}
    )
    assert canonical_message({"role": "tool", "tool_call_id": "a", "content": "r"}) == canonical_message(
        {"role": "tool", "tool_call_id": "b", "name": "read", "content": [{"type": "text", "text": "r"}]}
    )
    assert canonical_message({"role": "assistant", "content": None}) == {"role": "assistant", "content": ""}
    # Non-text parts survive (minus cache_control), so an image is not confused with no image.
    image = {"type": "image_url", "image_url": {"url": "data:x"}, "cache_control": {"type": "ephemeral"}}
    assert canonical_message({"role": "user", "content": ["look", image]})["content"] == [
        "look",
        {"type": "image_url", "image_url": {"url": "data:x"}},
    ]


def test_history_hashes_change_with_content_that_matters() -> None:
    base = [SYSTEM, {"role": "user", "content": "a b"}]
    same = [dict(SYSTEM), {"role": "user", "content": [{"type": "text", "text": " a\n\tb "}]}]
    assert history_hashes(base) == history_hashes(same)
    assert history_hashes(base)[1] != history_hashes([SYSTEM, {"role": "user", "content": "a c"}])[1]
    assert history_hashes(base)[1] != history_hashes([SYSTEM, {"role": "assistant", "content": "a b"}])[1]
    args_a = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": '{"x":1}'}}]}
    args_b = {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "f", "arguments": '{"x":2}'}}]}
    assert history_hashes([args_a]) != history_hashes([args_b])
    # A chain: the same message after a different history hashes differently.
    assert (
        history_hashes([{"role": "user", "content": "q"}])[0]
        != history_hashes([SYSTEM, {"role": "user", "content": "q"}])[1]
    )


def test_remembered_chain_steps_equal_recomputed_ones() -> None:
    from openclaw_cli.capture import sessions

    history = [SYSTEM, {"role": "user", "content": "fix  the\nbug"}, {"role": "assistant", "content": "done"}]
    sessions._chain_cache.clear()
    cold = history_hashes(history)
    assert sessions._chain_cache  # plain-text steps were remembered
    assert history_hashes(copy.deepcopy(history)) == cold  # served from the cache, same digests
    # Keys are exact: equal canonical text under another spelling or role alias still hashes the same, and the same
    # text under another role or after another history does not.
    developer = {"role": "developer", "content": SYSTEM["content"] + "  "}
    assert history_hashes([developer, *history[1:]]) == cold
    assert history_hashes([SYSTEM, {"role": "assistant", "content": "fix the bug"}])[1] != cold[1]
    assert history_hashes(history[1:])[0] != cold[1]


@given(
    words=st.lists(st.text(alphabet=st.characters(blacklist_categories=["Z", "C"]), min_size=1), min_size=1),
    gaps=st.lists(st.sampled_from([" ", "  ", "\n", "\t", " \n "]), min_size=1),
    cut=st.integers(min_value=0),
)
def test_whitespace_and_part_splits_never_change_the_hash(words: list[str], gaps: list[str], cut: int) -> None:
    as_string = "".join(word + gaps[i % len(gaps)] for i, word in enumerate(words))
    k = cut % len(words)
    as_parts = [
        {"type": "text", "text": " ".join(words[:k])},
        {"type": "text", "text": "\n".join(words[k:]), "cache_control": {"type": "ephemeral"}},
    ]
    plain = {"role": "user", "content": " ".join(words)}
    assert history_hashes([{"role": "user", "content": as_string}]) == history_hashes([plain])
    assert history_hashes([{"role": "user", "content": as_parts}]) == history_hashes([plain])


# --- prefix-tree inference and pairing -----------------------------------------------------------------------------
async def test_three_turns_with_tool_results_form_one_inferred_session(capture: SessionCapture) -> None:
    store = capture.store
    u1 = {"role": "user", "content": "What is in a.py?"}
    call = {"id": "call_abc", "type": "function", "function": {"name": "read", "arguments": '{"path":"a.py"}'}}
    t1 = await capture.record(make_exchange([SYSTEM, u1], None, tool_calls=[call]))
    # The client echoes the reply with content null, its own call id and reformatted arguments.
    echoed = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "toolu_9", "type": "function", "function": {"name": "read", "arguments": '{ "path" : "a.py" }'}}
        ],
    }
    tool_result = {"role": "tool", "tool_call_id": "toolu_9", "content": "print('hi')"}
    t2 = await capture.record(make_exchange([SYSTEM, u1, echoed, tool_result], "It prints hi."))
    reply2 = {"role": "assistant", "content": [{"type": "text", "text": "It prints hi.\n"}]}
    u3 = {"role": "user", "content": "Thanks. Now rename it."}
    t3 = await capture.record(make_exchange([SYSTEM, u1, echoed, tool_result, reply2, u3], "Done."))

    assert t1.session_id == t2.session_id == t3.session_id
    assert t1.session_id.startswith("s-")
    assert [t1.turn_index, t2.turn_index, t3.turn_index] == [0, 1, 2]
    assert {t1.turn_type, t2.turn_type, t3.turn_type} == {"main"}
    r1, r2, r3 = (store.get_turn(t.turn_id) for t in (t1, t2, t3))
    assert r1 and r2 and r3
    assert (r1.parent_turn_id, r2.parent_turn_id, r3.parent_turn_id) == (None, t1.turn_id, t2.turn_id)
    assert (r1.status, r1.next_state, r1.next_state_role) == ("ready", [tool_result], "tool")
    assert (r2.status, r2.next_state, r2.next_state_role) == ("ready", [u3], "user")
    assert (r3.status, r3.next_state) == ("pending", None)
    assert (r2.type_reason, r3.type_reason) == ("continuation", "continuation")
    session = store.get_session(t1.session_id)
    assert session and (session.main_turns, session.tail_turn_id, session.status) == (3, t3.turn_id, "open")


async def test_unrelated_conversations_get_separate_sessions(capture: SessionCapture) -> None:
    a = await capture.record(make_exchange([SYSTEM, {"role": "user", "content": "one"}], "r1"))
    b = await capture.record(make_exchange([SYSTEM, {"role": "user", "content": "two"}], "r2"))
    assert a.session_id != b.session_id
    assert (a.turn_type, b.turn_type, a.turn_index, b.turn_index) == ("main", "main", 0, 0)


async def test_longest_match_wins(capture: SessionCapture) -> None:
    u1, u2, u3 = ({"role": "user", "content": f"q{i}"} for i in (1, 2, 3))
    a1, a2 = ({"role": "assistant", "content": f"a{i}"} for i in (1, 2))
    t1 = await capture.record(make_exchange([SYSTEM, u1], "a1"))
    t2 = await capture.record(make_exchange([SYSTEM, u1, a1, u2], "a2"))
    # This request extends both turn 1 (3 messages) and turn 2 (5 messages): turn 2 is the longer match.
    t3 = await capture.record(make_exchange([SYSTEM, u1, a1, u2, a2, u3], "a3"))
    assert t3.session_id == t1.session_id
    assert capture.store.get_turn(t3.turn_id).parent_turn_id == t2.turn_id  # type: ignore[union-attr]
    assert capture.store.get_turn(t2.turn_id).next_state == [u3]  # type: ignore[union-attr]


async def test_fork_from_an_earlier_turn_is_a_new_session(capture: SessionCapture) -> None:
    store = capture.store
    u1, u2, u3 = ({"role": "user", "content": f"q{i}"} for i in (1, 2, 3))
    a1, a2 = ({"role": "assistant", "content": f"a{i}"} for i in (1, 2))
    t1 = await capture.record(make_exchange([SYSTEM, u1], "a1"))
    t2 = await capture.record(make_exchange([SYSTEM, u1, a1, u2], "a2"))
    t3 = await capture.record(make_exchange([SYSTEM, u1, a1, u2, a2, u3], "a3"))
    edited = {"role": "user", "content": "q2, but differently"}
    fork = await capture.record(make_exchange([SYSTEM, u1, a1, edited], "b2"))

    assert fork.session_id not in (t1.session_id,)
    assert (fork.turn_type, fork.turn_index) == ("main", 1)
    forked = store.get_session(fork.session_id)
    assert forked and (forked.parent_session_id, forked.fork_turn_id) == (t1.session_id, t1.turn_id)
    turn = store.get_turn(fork.turn_id)
    assert turn and (turn.parent_turn_id, turn.type_reason, turn.status) == (t1.turn_id, "fork", "pending")
    # The branch point keeps its original next state; the original line is untouched and still open.
    assert store.get_turn(t1.turn_id).next_state == [u2]  # type: ignore[union-attr]
    assert store.get_turn(t3.turn_id).status == "pending"  # type: ignore[union-attr]
    original = store.get_session(t1.session_id)
    assert original and (original.status, original.tail_turn_id) == ("open", t3.turn_id)
    # The fork continues on its own line and pairs its own turns.
    b2 = {"role": "assistant", "content": "b2"}
    nxt = {"role": "user", "content": "ok"}
    cont = await capture.record(make_exchange([SYSTEM, u1, a1, edited, b2, nxt], "b3"))
    assert (cont.session_id, cont.turn_index) == (fork.session_id, 2)
    assert store.get_turn(fork.turn_id).next_state == [nxt]  # type: ignore[union-attr]
    assert t2.session_id == t1.session_id


async def test_explicit_session_fork_gets_suffixed_id(capture: SessionCapture) -> None:
    headers = {"x-session-id": "chat-7"}
    u1, u2 = {"role": "user", "content": "q1"}, {"role": "user", "content": "q2"}
    a1 = {"role": "assistant", "content": "a1"}
    await capture.record(make_exchange([SYSTEM, u1], "a1", headers=headers))
    await capture.record(make_exchange([SYSTEM, u1, a1, u2], "a2", headers=headers))
    # Regenerate the second reply: the same request again extends turn 1, which is no longer the tail.
    again = await capture.record(make_exchange([SYSTEM, u1, a1, u2], "a2 bis", headers=headers))
    assert (again.session_id, again.turn_type, again.turn_index) == ("chat-7~2", "main", 1)


async def test_continuing_a_closed_session_starts_a_linked_session(capture: SessionCapture, clock: Clock) -> None:
    u1 = {"role": "user", "content": "q1"}
    t1 = await capture.record(make_exchange([SYSTEM, u1], "a1"))
    assert await capture.expire_idle(clock.now + IDLE_S + 1) == 1
    later = await capture.record(
        make_exchange([SYSTEM, u1, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "back"}])
    )
    assert later.session_id != t1.session_id and later.turn_index == 1
    assert capture.store.get_session(later.session_id).parent_session_id == t1.session_id  # type: ignore[union-attr]
    assert capture.store.get_turn(t1.turn_id).next_state is None  # type: ignore[union-attr]


# --- main / side ---------------------------------------------------------------------------------------------------
async def test_explicit_side_markers(capture: SessionCapture) -> None:
    msgs = [SYSTEM, {"role": "user", "content": "hi"}]
    header = await capture.record(make_exchange(msgs, headers={"x-turn-type": "side"}))
    model = await capture.record(make_exchange(msgs, model="openclaw-side"))
    meta = await capture.record(make_exchange(msgs, metadata={"turn_type": "side"}))
    choice = await capture.record(make_exchange(msgs, choice_index=1, headers={"x-turn-type": "main"}))
    assert [t.turn_type for t in (header, model, meta, choice)] == ["side"] * 4
    assert [t.turn_index for t in (header, model, meta, choice)] == [-1] * 4
    reasons = [capture.store.get_turn(t.turn_id).type_reason for t in (header, model, meta, choice)]  # type: ignore[union-attr]
    assert reasons == ["header", "model", "metadata", "choice"]
    assert {capture.store.get_turn(t.turn_id).status for t in (header, model, meta, choice)} == {"skipped"}  # type: ignore[union-attr]


async def test_side_turns_never_pair_next_states(capture: SessionCapture) -> None:
    headers = {"x-session-id": "s1"}
    u1 = {"role": "user", "content": "q1"}
    a1 = {"role": "assistant", "content": "a1"}
    t1 = await capture.record(make_exchange([SYSTEM, u1], "a1", headers=headers))
    side = await capture.record(
        make_exchange([SYSTEM, u1, a1, {"role": "user", "content": "x"}], headers={**headers, "x-turn-type": "side"})
    )
    assert side.session_id == "s1" and side.turn_type == "side"
    assert capture.store.get_turn(t1.turn_id).status == "pending"  # type: ignore[union-attr]
    u2 = {"role": "user", "content": "real follow-up"}
    t2 = await capture.record(make_exchange([SYSTEM, u1, a1, u2], headers=headers))
    assert (t2.turn_type, t2.turn_index) == ("main", 1)
    assert capture.store.get_turn(t1.turn_id).next_state == [u2]  # type: ignore[union-attr]


async def test_header_main_overrides_inference(capture: SessionCapture) -> None:
    title = [{"role": "user", "content": "Generate a short title for this conversation: ..."}]
    forced = await capture.record(make_exchange(title, headers={"x-turn-type": "main"}))
    assert forced.turn_type == "main"


async def test_first_request_is_main_and_title_requests_are_side(capture: SessionCapture) -> None:
    first = await capture.record(make_exchange([SYSTEM, {"role": "user", "content": "Fix the failing test"}]))
    assert (first.turn_type, first.turn_index) == ("main", 0)
    openwebui = "### Task:\nGenerate a concise, 3-5 word title with an emoji summarizing the chat history."
    title = await capture.record(make_exchange([{"role": "user", "content": openwebui}], "Fix Tests"))
    claude_style = [
        {"role": "system", "content": "Summarize this coding conversation in under 50 characters."},
        {"role": "user", "content": "Fix the failing test"},
    ]
    summary = await capture.record(make_exchange(claude_style, "Fixing test"))
    assert (title.turn_type, summary.turn_type) == ("side", "side")
    # A side turn that matches no history joins the most recently active session of its scope.
    assert title.session_id == summary.session_id == first.session_id
    # A long agent system prompt that merely mentions conversation summaries does not make the request side.
    agent = {"role": "system", "content": "You are an agent. Keep a summary of the conversation in mind. " * 40}
    real = await capture.record(make_exchange([agent, {"role": "user", "content": "hello"}]))
    assert real.turn_type == "main"


def test_looks_auxiliary_examples() -> None:
    assert looks_auxiliary(["Write a concise title for this conversation"])
    assert looks_auxiliary(["Your task is to create a detailed summary of the conversation so far"])
    assert looks_auxiliary(["### Task:\nSuggest 3 follow-up questions"])
    assert not looks_auxiliary(["Write a title for my essay about whales"])
    assert not looks_auxiliary(["Fix the failing test in a.py"])


async def test_compaction_style_continuation_is_side_and_keeps_the_tail_pending(capture: SessionCapture) -> None:
    u1 = {"role": "user", "content": "q1"}
    a1 = {"role": "assistant", "content": "a1"}
    t1 = await capture.record(make_exchange([SYSTEM, u1], "a1"))
    ask = {"role": "user", "content": "Your task is to create a detailed summary of the conversation so far."}
    compact = await capture.record(make_exchange([SYSTEM, u1, a1, ask], "Summary: ..."))
    assert (compact.turn_type, compact.session_id) == ("side", t1.session_id)
    assert capture.store.get_turn(t1.turn_id).status == "pending"  # type: ignore[union-attr]


async def test_explicit_scope_off_main_line_is_side_but_same_system_fresh_start_is_new_main(
    capture: SessionCapture,
) -> None:
    headers = {"x-claude-code-session-id": "cc-1"}
    main = await capture.record(make_exchange([SYSTEM, {"role": "user", "content": "build it"}], headers=headers))
    sub_system = {"role": "system", "content": "You are a file search subagent."}
    sub = await capture.record(make_exchange([sub_system, {"role": "user", "content": "find foo"}], headers=headers))
    assert (main.session_id, main.turn_type) == ("cc-1", "main")
    assert (sub.session_id, sub.turn_type) == ("cc-1", "side")
    assert capture.store.get_turn(sub.turn_id).type_reason == "off-main-line"  # type: ignore[union-attr]
    # The side conversation's own continuation stays side, in the same session.
    sub2 = await capture.record(
        make_exchange(
            [
                sub_system,
                {"role": "user", "content": "find foo"},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "and bar"},
            ],
            headers=headers,
        )
    )
    assert (sub2.session_id, sub2.turn_type) == ("cc-1", "side")
    assert capture.store.get_turn(sub2.turn_id).type_reason == "side-continuation"  # type: ignore[union-attr]
    # A fresh conversation with the main line's system prompt is a new main line (e.g. after /clear or compaction).
    fresh = await capture.record(make_exchange([SYSTEM, {"role": "user", "content": "new task"}], headers=headers))
    assert (fresh.session_id, fresh.turn_type, fresh.turn_index) == ("cc-1~2", "main", 0)


# --- ending and expiry ---------------------------------------------------------------------------------------------
async def test_session_done_header_makes_last_turn_ready_without_next_state(capture: SessionCapture) -> None:
    u1 = {"role": "user", "content": "q1"}
    t1 = await capture.record(make_exchange([SYSTEM, u1], "a1", headers={"x-session-id": "d"}))
    t2 = await capture.record(
        make_exchange(
            [SYSTEM, u1, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "bye"}],
            headers={"x-session-id": "d", "x-session-done": "true"},
        )
    )
    r1, r2 = capture.store.get_turn(t1.turn_id), capture.store.get_turn(t2.turn_id)
    assert r1 and r2
    assert (r1.status, r1.next_state_role) == ("ready", "user")
    assert (r2.status, r2.next_state, r2.next_state_role) == ("ready", None, None)
    assert capture.store.get_session("d").status == "ended"  # type: ignore[union-attr]


async def test_end_session(capture: SessionCapture) -> None:
    headers = {"x-session-id": "e"}
    u1, a1 = {"role": "user", "content": "q1"}, {"role": "assistant", "content": "a1"}
    t1 = await capture.record(make_exchange([SYSTEM, u1], "a1", headers=headers))
    fork_a = await capture.record(make_exchange([SYSTEM, u1, a1, {"role": "user", "content": "x"}], headers=headers))
    fork_b = await capture.record(make_exchange([SYSTEM, u1, a1, {"role": "user", "content": "y"}], headers=headers))
    assert (fork_a.session_id, fork_b.session_id) == ("e", "e~2")
    assert await capture.end_session("e") is True  # the client's id ends its forks too
    for turn in (fork_a, fork_b):
        record = capture.store.get_turn(turn.turn_id)
        assert record and (record.status, record.next_state) == ("ready", None)
    assert capture.store.get_turn(t1.turn_id).status == "ready"  # type: ignore[union-attr]
    assert {s.status for s in capture.store.sessions()} == {"ended"}
    assert await capture.end_session("e") is False
    assert await capture.end_session("nope") is False


async def test_expire_idle(capture: SessionCapture, clock: Clock) -> None:
    t1 = await capture.record(make_exchange([SYSTEM, {"role": "user", "content": "q"}]))
    clock.now += 100
    t2 = await capture.record(make_exchange([SYSTEM, {"role": "user", "content": "other"}]))
    assert await capture.expire_idle(clock.now + IDLE_S - 101) == 0
    assert await capture.expire_idle(clock.now + IDLE_S - 50) == 1  # only the first is idle long enough
    assert capture.store.get_turn(t1.turn_id).status == "ready"  # type: ignore[union-attr]
    assert capture.store.get_turn(t2.turn_id).status == "pending"  # type: ignore[union-attr]
    assert capture.store.get_session(t1.session_id).status == "expired"  # type: ignore[union-attr]
    clock.now += IDLE_S + 1
    assert await capture.expire_idle() == 1  # defaults to the clock
    assert await capture.expire_idle() == 0
    assert capture.stats()["pending"] == 0


# --- stats, storage, concurrency -----------------------------------------------------------------------------------
async def test_stats_and_stored_fields(capture: SessionCapture) -> None:
    u1 = {"role": "user", "content": "q1"}
    t1 = await capture.record(make_exchange([SYSTEM, u1], "a1"))
    await capture.record(
        make_exchange([SYSTEM, u1, {"role": "assistant", "content": "a1"}, {"role": "user", "content": "q2"}])
    )
    await capture.record(make_exchange([SYSTEM, u1], model="openclaw-side"))
    stats = capture.stats()
    assert stats["sessions"] == {"total": 1, "open": 1, "ended": 0, "expired": 0}
    assert stats["turns"] == {"total": 3, "main": 2, "side": 1, "main_by_status": {"ready": 1, "pending": 1}}
    assert (stats["pending"], stats["ready"]) == (1, 1)
    record = capture.store.get_turn(t1.turn_id)
    assert record is not None
    assert (record.prompt_tokens, record.completion_tokens) == ([11, 12, 13], [21, 22])
    assert (record.logprobs, record.sampling_logprobs) == ([-0.5, -0.25], [-0.4, -0.2])
    assert (record.version, record.finish_reason, record.api, record.model) == (3, "stop", "openai", "openclaw-policy")
    assert (record.started_at, record.first_token_at, record.finished_at) == (1.0, 1.5, 2.0)
    assert record.assistant_message == {"role": "assistant", "content": "a1"}


async def test_secrets_never_reach_the_database(capture: SessionCapture, tmp_path: Path) -> None:
    secret = "sk-very-secret-0123456789"
    exchange = make_exchange(
        [SYSTEM, {"role": "user", "content": "hi"}],
        headers={"authorization": f"Bearer {secret}", "x-session-id": "sec"},
        request_extra={"api_key": secret, "extra_body": {"openai_api_key": secret}},
        metadata={"x-api-key": secret},
    )
    turn = await capture.record(exchange)
    record = capture.store.get_turn(turn.turn_id)
    assert record and record.headers == {"x-session-id": "sec"}
    assert "api_key" not in record.request and record.request["extra_body"] == {}
    capture.store.close()
    for path in tmp_path.iterdir():
        assert secret.encode() not in path.read_bytes(), path


async def test_concurrent_records_are_consistent(capture: SessionCapture) -> None:
    # 20 conversations x 3 turns, each turn recorded concurrently with the other conversations' turns.
    histories = [[SYSTEM, {"role": "user", "content": f"conversation {i}"}] for i in range(20)]
    for step in range(3):
        results = await asyncio.gather(*(capture.record(make_exchange(h, f"r{step}")) for h in histories))
        assert [r.turn_index for r in results] == [step] * 20
        for h in histories:
            h += [{"role": "assistant", "content": f"r{step}"}, {"role": "user", "content": f"next {step}"}]
        assert len({r.session_id for r in results}) == 20
    stats = capture.stats()
    assert (stats["sessions"]["total"], stats["ready"], stats["pending"]) == (20, 40, 20)


async def test_concurrent_records_share_one_commit_and_a_bad_one_fails_alone(
    capture: SessionCapture, monkeypatch: pytest.MonkeyPatch
) -> None:
    transactions = 0
    original = capture.store.transaction

    def counting():
        nonlocal transactions
        transactions += 1
        return original()

    monkeypatch.setattr(capture.store, "transaction", counting)
    good = [make_exchange([SYSTEM, {"role": "user", "content": f"g{i}"}]) for i in range(10)]
    results = await asyncio.gather(*(capture.record(e) for e in good))
    assert transactions == 1 and len({r.turn_id for r in results}) == 10

    transactions = 0
    bad = make_exchange([SYSTEM, {"role": "user", "content": "bad"}], metadata={"unserializable": object()})
    batch = [good[0], bad, make_exchange([SYSTEM, {"role": "user", "content": "last"}])]
    outcomes = await asyncio.gather(*(capture.record(e) for e in batch), return_exceptions=True)
    assert isinstance(outcomes[1], TypeError)
    assert not isinstance(outcomes[0], BaseException) and not isinstance(outcomes[2], BaseException)
    # The shared transaction rolled back, then each exchange was redone alone: the good ones are stored once.
    assert transactions == 1 + 3
    assert capture.stats()["turns"]["total"] == 12
