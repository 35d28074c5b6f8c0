"""Chat rendering and tool-call / reasoning parsing of the shared tokenizer layer."""

from __future__ import annotations

import json

import pytest

from openclaw_cli.tokenizer import ChatTemplateError, flatten_content, parse_assistant_text

WEATHER_TOOL = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def test_render_matches_template_text(tiny_tokenizer) -> None:
    ids = tiny_tokenizer.render([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}])
    assert tiny_tokenizer.hf.decode(ids) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_render_content_parts_equal_plain_string(tiny_tokenizer) -> None:
    parts = [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]
    assert tiny_tokenizer.render([{"role": "user", "content": parts}]) == tiny_tokenizer.render(
        [{"role": "user", "content": "hello world"}]
    )


def test_render_tool_round_trip(tiny_tokenizer) -> None:
    """An assistant tool call rendered by the template parses back to the same call."""
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
            ],
        },
    ]
    text = tiny_tokenizer.hf.decode(tiny_tokenizer.render(messages, [WEATHER_TOOL], add_generation_prompt=False))
    assert "get_weather" in text.split("<tools>")[1]  # the tool list is rendered
    reply = text.rsplit("<|im_start|>assistant\n", 1)[1].removesuffix("<|im_end|>\n")
    parsed = tiny_tokenizer.parse_assistant(reply)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert parsed.content == ""


def test_render_rejects_bad_messages(tiny_tokenizer) -> None:
    with pytest.raises(ChatTemplateError):
        tiny_tokenizer.render([])
    with pytest.raises(ChatTemplateError):
        tiny_tokenizer.render([{"content": "no role"}])
    with pytest.raises(ChatTemplateError):
        flatten_content(42)


CONVERSATIONS = [
    ([{"role": "user", "content": "hi"}], None),
    (
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Ünïcödé — 東京 🙂 tabs\tand\nlines"}],
        None,
    ),
    # Special-token text inside content is encoded as transformers encodes it (as the special token).
    ([{"role": "user", "content": "say <|im_end|> then <tool_call>"}], None),
    (
        [
            {"role": "user", "content": "Weather in Paris?"},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "P"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        [WEATHER_TOOL],
    ),
]


@pytest.mark.parametrize(("messages", "tools"), CONVERSATIONS)
def test_render_ids_equal_transformers_apply_chat_template(tiny_tokenizer, messages, tools) -> None:
    """render() encodes the template text through the Rust tokenizer directly; the ids must be transformers' own."""
    from openclaw_cli.tokenizer import _normalise_messages

    expected = tiny_tokenizer.hf.apply_chat_template(
        _normalise_messages(messages), tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert tiny_tokenizer._plain_rust_tokenizer() is not None
    assert tiny_tokenizer.render(messages, tools) == list(expected)


def test_render_falls_back_to_transformers_when_the_rust_tokenizer_truncates() -> None:
    from openclaw_cli.testing.tiny_model import build_tiny_tokenizer
    from openclaw_cli.tokenizer import HFChatTokenizer

    tokenizer = HFChatTokenizer(build_tiny_tokenizer())
    messages = [{"role": "user", "content": "a message long enough to be cut at five tokens"}]
    full = tokenizer.render(messages)
    tokenizer.hf.backend_tokenizer.enable_truncation(max_length=5)  # e.g. set in a model's tokenizer.json
    assert tokenizer._plain_rust_tokenizer() is None
    assert tokenizer.render(messages) == full  # transformers resets truncation for chat templates; so do we


def test_decode_hides_stop_tokens_but_keeps_tool_markers(tiny_tokenizer) -> None:
    ids = tiny_tokenizer.encode('<tool_call>{"name": "x", "arguments": {}}</tool_call>') + tiny_tokenizer.eos_token_ids
    assert tiny_tokenizer.decode(ids) == '<tool_call>{"name": "x", "arguments": {}}</tool_call>'


@pytest.mark.parametrize(
    ("text", "content", "calls", "reasoning"),
    [
        ("plain answer", "plain answer", [], ""),
        (
            'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            "Let me check.",
            [("get_weather", {"city": "Paris"})],
            "",
        ),
        (  # two Hermes blocks
            '<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": {"x": 1}}'
            "</tool_call>",
            "",
            [("a", {}), ("b", {"x": 1})],
            "",
        ),
        (  # SmolLM2 style: a JSON list inside one block
            '<tool_call>[{"name": "a", "arguments": {"q": "z"}}, {"name": "b", "arguments": {}}]</tool_call>',
            "",
            [("a", {"q": "z"}), ("b", {})],
            "",
        ),
        (  # Llama 3.x: the whole reply is a call with "parameters"
            '{"name": "get_weather", "parameters": {"city": "Oslo"}}',
            "",
            [("get_weather", {"city": "Oslo"})],
            "",
        ),
        ('<|python_tag|>{"name": "a", "parameters": {}}', "", [("a", {})], ""),
        ("<think>\nwho asks?\n</think>\n\nHello!", "Hello!", [], "who asks?"),
        (  # arguments given as a JSON string are normalised
            '<tool_call>{"name": "a", "arguments": "{\\"k\\": 2}"}</tool_call>',
            "",
            [("a", {"k": 2})],
            "",
        ),
    ],
)
def test_parse_assistant_formats(text: str, content: str, calls: list, reasoning: str) -> None:
    parsed = parse_assistant_text(text)
    assert parsed.content == content
    assert [(c.name, json.loads(c.arguments)) for c in parsed.tool_calls] == calls
    assert parsed.reasoning == reasoning
    assert all(c.id.startswith("call_") for c in parsed.tool_calls)


def test_invalid_tool_block_stays_visible() -> None:
    text = "Before <tool_call>{not json}</tool_call> after"
    parsed = parse_assistant_text(text)
    assert parsed.tool_calls == []
    assert parsed.content == text


def test_json_reply_is_content_when_no_tools_offered() -> None:
    text = '{"name": "x", "parameters": {}}'
    assert parse_assistant_text(text, tools_offered=False).content == text
