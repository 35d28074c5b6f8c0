"""The Responses API (what current Codex speaks), driven through the real ``openai`` SDK's ``client.responses``."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import openai
import pytest

from openclaw_cli.proxy.responses_convert import to_chat_messages
from openclaw_cli.testing.fake_backend import fake_logprob
from openclaw_cli.testing.loopback_proxy import LoopbackProxy as Proxy

CALCULATOR = {
    "type": "function",
    "name": "calculator",
    "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
}
CHAT_CALCULATOR = {
    "type": "function",
    "function": {k: CALCULATOR[k] for k in ("name", "description", "parameters")},
}
CALL_TEXT = (
    'I will compute it.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3 * 4"}}\n</tool_call>'
)
QUESTION = "What is 2 + 3 * 4?"


def test_plain_response_text_usage_and_capture(make_proxy: Callable[..., Proxy], tiny_tokenizer: Any) -> None:
    proxy = make_proxy("Paris.")
    response = proxy.openai().responses.create(
        model="openclaw", instructions="Be brief.", input="Capital of France?", max_output_tokens=50, store=False
    )
    assert response.output_text == "Paris."
    assert response.status == "completed" and response.id.startswith("resp_")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Capital of France?"}]
    prompt = tiny_tokenizer.render(messages)
    completion = [*tiny_tokenizer.encode("Paris."), tiny_tokenizer.eos_token_ids[0]]
    assert response.usage.input_tokens == len(prompt) and response.usage.output_tokens == len(completion)
    assert proxy.backend.calls[0].prompt_tokens == prompt and proxy.backend.calls[0].params.max_tokens == 50
    (ex,) = proxy.sink.exchanges
    assert ex.api == "responses" and ex.messages == messages and ex.stream is False
    assert ex.completion_tokens == completion  # exact ids and sampler logprobs, as on the other APIs
    assert ex.logprobs == [fake_logprob(i) for i in range(len(completion))]
    assert ex.response["id"] == response.id


def test_function_tool_round_trip_non_streamed(make_proxy: Callable[..., Proxy], tiny_tokenizer: Any) -> None:
    proxy = make_proxy(CALL_TEXT, "It is 14.")
    client = proxy.openai()
    first = client.responses.create(model="openclaw", input=QUESTION, tools=[CALCULATOR], store=False)
    message, call = first.output
    assert message.type == "message" and message.content[0].text == "I will compute it."
    assert call.type == "function_call" and call.name == "calculator"
    assert json.loads(call.arguments) == {"expression": "2 + 3 * 4"}
    (ex,) = proxy.sink.exchanges
    assert ex.tools == [CHAT_CALCULATOR]
    assert ex.assistant_message["tool_calls"][0]["id"] == call.call_id

    # The client sends everything back with the tool's output (store false: no previous_response_id).
    items = [
        {"role": "user", "content": QUESTION},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"type": "function_call_output", "call_id": call.call_id, "output": "14"},
    ]
    second = client.responses.create(model="openclaw", input=items, tools=[CALCULATOR], store=False)
    assert second.output_text == "It is 14."
    history = [
        {"role": "user", "content": QUESTION},
        ex.assistant_message,
        {"role": "tool", "tool_call_id": call.call_id, "content": "14"},
    ]
    # The second prompt renders exactly the stored first turn plus the tool output: the session's prefix matches.
    assert proxy.backend.calls[1].prompt_tokens == tiny_tokenizer.render(history, [CHAT_CALCULATOR])


def test_streamed_event_sequence_as_codex_parses_it(make_proxy: Callable[..., Proxy], tiny_tokenizer: Any) -> None:
    proxy = make_proxy(CALL_TEXT)
    with proxy.openai().responses.create(
        model="openclaw", input=QUESTION, tools=[CALCULATOR], stream=True, store=False
    ) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    added = [e for e in events if e.type == "response.output_item.added"]
    done = [e for e in events if e.type == "response.output_item.done"]
    assert [e.item.type for e in added] == [e.item.type for e in done] == ["message", "function_call"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == "I will compute it."
    assert done[0].item.content[0].text == text and done[0].item.status == "completed"
    assert json.loads(done[1].item.arguments) == {"expression": "2 + 3 * 4"} and done[1].item.call_id
    completed = events[-1].response
    assert completed.id.startswith("resp_") and completed.usage.output_tokens > 0
    assert [i.type for i in completed.output] == ["message", "function_call"]
    (ex,) = proxy.sink.exchanges
    assert ex.stream is True and ex.assistant_message["tool_calls"][0]["id"] == done[1].item.call_id


def test_previous_response_id_continues_a_stored_response(
    make_proxy: Callable[..., Proxy], tiny_tokenizer: Any
) -> None:
    proxy = make_proxy("Paris.", "About 2.1 million.")
    client = proxy.openai()
    first = client.responses.create(model="openclaw", input="Capital of France?")
    second = client.responses.create(model="openclaw", input="Its population?", previous_response_id=first.id)
    assert second.output_text == "About 2.1 million."
    history = [
        {"role": "user", "content": "Capital of France?"},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "Its population?"},
    ]
    assert proxy.backend.calls[1].prompt_tokens == tiny_tokenizer.render(history)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="openclaw", input="x", previous_response_id="resp_unknown")
    assert info.value.code == "previous_response_not_found"


def test_context_overflow_is_a_400_or_response_failed_on_a_stream(make_proxy: Callable[..., Proxy]) -> None:
    proxy = make_proxy()
    client = proxy.openai()
    huge = "word " * 5000  # far beyond the tiny model's context
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model="openclaw", input=huge)
    assert info.value.code == "context_length_exceeded"
    with client.responses.create(model="openclaw", input=huge, stream=True) as stream:
        events = list(stream)
    assert [e.type for e in events] == ["response.created", "response.failed"]
    assert events[-1].response.error.code == "context_length_exceeded"
    assert proxy.backend.calls == [] and proxy.sink.exchanges == []


def test_bad_input_is_a_clear_400_in_openai_format(make_proxy: Callable[..., Proxy]) -> None:
    proxy = make_proxy()
    response = httpx.post(proxy.server.base_url + "/v1/responses", json={"model": "openclaw", "input": [42]})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "input[0] must be an object"
    response = httpx.post(proxy.server.base_url + "/v1/responses", json={"model": "openclaw"})
    assert response.status_code == 400 and "'input'" in response.json()["error"]["message"]


def test_input_items_convert_to_chat_messages() -> None:
    items = [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "Rules."}]},
        {"role": "user", "content": [{"type": "input_text", "text": "Patch it."}]},
        {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "Need a patch."}]},
        {"type": "custom_tool_call", "call_id": "c1", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "Done"},
        {"type": "function_call", "call_id": "c2", "name": "shell", "arguments": '{"cmd": ["ls"]}'},
        {"type": "function_call", "call_id": "c3", "name": "shell", "arguments": '{"cmd": ["pwd"]}'},
        {"type": "function_call_output", "call_id": "c2", "output": "a.txt"},
        {"type": "web_search_call", "id": "ws"},  # built-in: ignored
    ]
    messages = to_chat_messages("Be careful.", items)
    assert messages[0] == {"role": "system", "content": "Be careful."}
    assert messages[1] == {"role": "system", "content": "Rules."}
    assert messages[2] == {"role": "user", "content": "Patch it."}
    assert messages[3]["reasoning_content"] == "Need a patch."
    assert messages[3]["tool_calls"][0]["function"] == {
        "name": "apply_patch",
        "arguments": json.dumps({"input": "*** Begin Patch"}),
    }
    assert messages[4] == {"role": "tool", "tool_call_id": "c1", "content": "Done"}
    assert [c["id"] for c in messages[5]["tool_calls"]] == ["c2", "c3"]  # consecutive calls share a message
    assert messages[6] == {"role": "tool", "tool_call_id": "c2", "content": "a.txt"}
    assert len(messages) == 7
