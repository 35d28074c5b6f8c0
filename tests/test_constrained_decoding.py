"""Constrained decoding on the local transformers sampler (llguidance masks) and through the proxy's three APIs.

The tiny test model writes random tokens, so every schema here bounds what it can write (short strings, bounded
integers, few items): an unbounded string would run to ``max_tokens`` and be cut, as on any engine.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import anthropic
import httpx
import jsonschema
import openai
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from runtime_helpers import local_proxy_server

from openclaw_cli.backends.local.sampler import TransformersSampler
from openclaw_cli.backends.local.serving import PolicyVersions
from openclaw_cli.proxy import BackgroundServer
from openclaw_cli.settings import DEFAULT_LORA_TARGETS, Settings
from openclaw_cli.structured_output import json_form, lark_grammar, tool_call_form, tool_call_frame
from openclaw_cli.testing.fake_backend import MemorySink
from openclaw_cli.types import OutputConstraint, SamplingParams

USER = [{"role": "user", "content": "What is the weather in Paris?"}]
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 8},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
TIME_TOOL = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["utc", "cet"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}
BOUNDED = {
    "type": "object",
    "properties": {
        "answer": {"type": "string", "maxLength": 6},
        "score": {"type": "integer", "minimum": 0, "maximum": 99},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        "ok": {"type": "boolean"},
    },
    "required": ["answer", "score", "tags", "ok"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def served(tiny_model_dir: Path, tiny_tokenizer: Any) -> Iterator[SimpleNamespace]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval().requires_grad_(False)
    versions = PolicyVersions(model, list(DEFAULT_LORA_TARGETS), keep=2)
    sampler = TransformersSampler(model, tiny_tokenizer, versions, max_concurrent=3, context_length=4096)
    prompt = tiny_tokenizer.render(USER)
    yield SimpleNamespace(model=model, sampler=sampler, tok=tiny_tokenizer, prompt=prompt)
    sampler.close()


def only_json(schema: dict[str, Any]) -> OutputConstraint:
    return OutputConstraint((json_form(schema),))


# --- the mask -----------------------------------------------------------------------------------------------------

_LEAVES = st.one_of(
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(0, 5)),
    st.builds(
        lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
        st.integers(-50, 50),
        st.integers(0, 200),
    ),
    st.just({"type": "boolean"}),
    st.just({"type": "null"}),
    st.lists(st.sampled_from(["red", "green", "x y", "7", "é"]), min_size=1, max_size=3, unique=True).map(
        lambda values: {"enum": values}
    ),
)


def _objects(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    properties = st.dictionaries(st.sampled_from(["a", "bb", "name", "k-1", "wörd"]), children, min_size=1, max_size=3)
    objects = properties.map(
        lambda props: {"type": "object", "properties": props, "required": sorted(props), "additionalProperties": False}
    )
    arrays = st.builds(lambda item, n: {"type": "array", "items": item, "maxItems": n}, children, st.integers(0, 3))
    return st.one_of(objects, arrays)


SCHEMAS = st.recursive(_LEAVES, _objects, max_leaves=6).filter(lambda s: s.get("type") in ("object", "array"))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(schema=SCHEMAS, seed=st.integers(0, 2**31 - 1))
def test_the_mask_never_lets_an_invalid_token_through(served: SimpleNamespace, schema: dict, seed: int) -> None:
    """Random schemas, random seeds, temperature 1 on a model that writes random tokens: every reply ends on a stop
    token and is exactly one JSON value that the schema accepts (jsonschema, not the grammar library, checks)."""
    constraint = only_json(schema)
    assert served.sampler.accepts_constraint(constraint) is None
    params = SamplingParams(max_tokens=400, temperature=1.0, seed=seed, constraint=constraint)
    result = asyncio.run(served.sampler.sample(served.prompt, params))
    assert result.finish_reason == "stop", result.text
    assert result.tokens[-1] in served.tok.eos_token_ids
    jsonschema.validate(json.loads(result.text), schema)


def _allowed(matcher: Any, vocab: int) -> torch.Tensor:
    import llguidance.torch as llg_torch

    bitmask = llg_torch.allocate_token_bitmask(1, vocab)
    llg_torch.fill_next_token_bitmask(matcher, bitmask, 0)
    ids = torch.arange(vocab)
    return ((bitmask[0][ids // 32] >> (ids % 32)) & 1).bool()


def test_masked_sampling_logprobs_against_a_hand_computation(served: SimpleNamespace) -> None:
    """Per token: ``logprob`` is log_softmax(logits)[t] of the unmasked policy (a teacher-forced pass), and
    ``sampling_logprob`` is log_softmax(masked logits / T)[t] with the grammar's allowed set computed here."""
    import llguidance
    import llguidance.hf

    schema = {"type": "object", "properties": {"tag": {"enum": ["red", "green", "blue"]}}, "required": ["tag"]}
    constraint = only_json(schema)
    params = SamplingParams(max_tokens=60, temperature=0.7, seed=11, constraint=constraint)
    result = asyncio.run(served.sampler.sample(served.prompt, params))
    assert result.finish_reason == "stop" and json.loads(result.text)["tag"] in {"red", "green", "blue"}
    vocab = served.model.get_input_embeddings().weight.shape[0]
    ids = torch.tensor([served.prompt + result.tokens])
    with torch.inference_mode():
        logits = served.model(input_ids=ids).logits[0, len(served.prompt) - 1 : -1].float()
    matcher = llguidance.LLMatcher(
        llguidance.hf.from_tokenizer(served.tok.hf, n_vocab=vocab),
        llguidance.LLMatcher.grammar_from_lark(lark_grammar(constraint, {})),
    )
    forced = 0
    for position, token in enumerate(result.tokens[:-1]):  # the last one is the stop token
        allowed = _allowed(matcher, vocab)
        raw = torch.log_softmax(logits[position], -1)
        masked = torch.log_softmax(logits[position].masked_fill(~allowed, float("-inf")) / 0.7, -1)
        assert result.logprobs[position] == pytest.approx(float(raw[token]), abs=1e-4)
        assert result.sampling_logprobs[position] == pytest.approx(float(masked[token]), abs=1e-4)
        forced += int(allowed.sum()) == 1
        assert matcher.consume_token(token)
    assert forced >= 5  # '{"tag": "' is forced: each of its tokens is certain under the mask, not under the policy
    assert matcher.is_accepting()
    gaps = [s - r for s, r in zip(result.sampling_logprobs, result.logprobs, strict=True)]
    assert max(gaps) > 1.0  # the masked distribution is not the policy's


def test_a_forced_tool_call_is_one_call_in_the_models_own_frame(served: SimpleNamespace) -> None:
    frame = tool_call_frame(served.tok)
    assert (frame.prefix, frame.suffix, frame.arguments_key) == ("<tool_call>\n", "\n</tool_call>", "arguments")
    tools = [WEATHER_TOOL, TIME_TOOL]
    constraint = OutputConstraint((tool_call_form(served.tok, tools, frozenset({"get_time"})),))
    assert "<[" in served.sampler._masks.grammar(constraint)  # the special <tool_call> token, named by its id
    for seed in range(4):
        params = SamplingParams(max_tokens=80, temperature=1.0, seed=seed, constraint=constraint)
        result = asyncio.run(served.sampler.sample(served.tok.render(USER, tools), params))
        calls = served.tok.parse_assistant(result.text).tool_calls
        assert [c.name for c in calls] == ["get_time"], result.text
        assert json.loads(calls[0].arguments)["zone"] in {"utc", "cet"}


def test_rows_without_a_constraint_decode_as_before_beside_a_constrained_one(served: SimpleNamespace) -> None:
    plain = SamplingParams(max_tokens=16, temperature=0.0)

    async def both() -> tuple[Any, Any, Any]:
        alone = await served.sampler.sample(served.prompt, plain)
        constrained = SamplingParams(max_tokens=60, temperature=0.0, constraint=only_json(BOUNDED))
        beside, json_reply = await asyncio.gather(
            served.sampler.sample(served.prompt, plain), served.sampler.sample(served.prompt, constrained)
        )
        return alone, beside, json_reply

    alone, beside, json_reply = asyncio.run(both())
    assert beside.tokens == alone.tokens
    assert beside.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    jsonschema.validate(json.loads(json_reply.text), BOUNDED)


def test_a_grammar_the_library_rejects_is_reported_not_enforced(served: SimpleNamespace) -> None:
    bad = OutputConstraint((json_form({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}}),))
    assert served.sampler.accepts_constraint(bad)


# --- through the proxy, on the real local backend ------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_proxy(tiny_model_dir: Path) -> Iterator[tuple[Any, MemorySink, BackgroundServer]]:
    settings = Settings(model=str(tiny_model_dir), local={"device": "cpu"}, proxy={"accept_any_model": True})
    with local_proxy_server(settings) as served:
        yield served


def json_schema_format(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}


def test_chat_json_schema_and_json_object_parse_on_the_first_sample(local_proxy: Any) -> None:
    _, sink, server = local_proxy
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    for seed in range(3):
        reply = client.chat.completions.create(
            model="m", messages=USER, max_tokens=80, seed=seed, response_format=json_schema_format(BOUNDED)
        )
        jsonschema.validate(json.loads(reply.choices[0].message.content or ""), BOUNDED)
        assert sink.exchanges[-1].metadata["samples_drawn"] == 1
        assert sink.exchanges[-1].metadata["constrained_decoding"] is True
    reply = client.chat.completions.create(
        model="m", messages=USER, max_tokens=300, temperature=0, response_format={"type": "json_object"}
    )
    choice = reply.choices[0]
    # An object; the tiny model's free strings may run to max_tokens, and then the reply is cut as OpenAI cuts it.
    assert (choice.message.content or "").startswith("{")
    if choice.finish_reason == "stop":
        assert isinstance(json.loads(choice.message.content or ""), dict)


def test_a_constrained_stream_delivers_tokens_before_the_reply_ends(local_proxy: Any) -> None:
    backend, _, server = local_proxy
    delay = threading.Event()

    def slow(_module: Any, _args: Any) -> None:
        if delay.is_set():
            time.sleep(0.03)

    hook = backend._require_loaded().model.register_forward_pre_hook(slow)
    delay.set()
    try:
        arrivals: list[tuple[float, str]] = []
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
        stream = client.chat.completions.create(
            model="m",
            messages=USER,
            max_tokens=80,
            temperature=0,
            stream=True,
            response_format=json_schema_format(BOUNDED),
        )
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append((time.monotonic(), chunk.choices[0].delta.content))
    finally:
        delay.clear()
        hook.remove()
    text = "".join(piece for _, piece in arrivals)
    jsonschema.validate(json.loads(text), BOUNDED)
    assert len(arrivals) >= 5
    assert arrivals[-1][0] - arrivals[0][0] > 0.1  # pieces came as tokens were made, not in one burst at the end


def test_required_and_named_tool_calls_on_all_three_apis(local_proxy: Any) -> None:
    _, _, server = local_proxy
    chat = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    tools = [WEATHER_TOOL, TIME_TOOL]
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        reply = chat.chat.completions.create(model="m", messages=USER, tools=tools, tool_choice=choice, max_tokens=80)
        calls = reply.choices[0].message.tool_calls or []
        assert len(calls) == 1 and reply.choices[0].finish_reason == "tool_calls"
        if isinstance(choice, dict):
            assert calls[0].function.name == "get_weather"
            jsonschema.validate(json.loads(calls[0].function.arguments), WEATHER_TOOL["function"]["parameters"])

    streamed = chat.chat.completions.create(
        model="m", messages=USER, tools=tools, tool_choice="required", max_tokens=80, stream=True
    )
    names = [
        call.function.name
        for chunk in streamed
        if chunk.choices
        for call in chunk.choices[0].delta.tool_calls or []
        if call.function and call.function.name
    ]
    assert len(names) == 1 and names[0] in {"get_weather", "get_time"}

    responses_tools = [{"type": "function", **t["function"]} for t in tools]
    response = chat.responses.create(
        model="m", input="Weather in Paris?", tools=responses_tools, tool_choice="required", max_output_tokens=80
    )
    assert [item.type for item in response.output] == ["function_call"]

    messages = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    anthropic_tools = [{"name": t["function"]["name"], "input_schema": t["function"]["parameters"]} for t in tools]
    for tool_choice in ({"type": "any"}, {"type": "tool", "name": "get_time"}):
        message = messages.messages.create(
            model="m", max_tokens=80, messages=USER, tools=anthropic_tools, tool_choice=tool_choice
        )
        uses = [block for block in message.content if block.type == "tool_use"]
        assert len(uses) == 1 and message.stop_reason == "tool_use"
        if tool_choice["type"] == "tool":
            assert uses[0].name == "get_time" and uses[0].input["zone"] in {"utc", "cet"}


def test_responses_text_format_and_anthropic_output_format_parse(local_proxy: Any) -> None:
    _, _, server = local_proxy
    response = httpx.post(
        server.base_url + "/v1/responses",
        json={
            "model": "m",
            "input": "Rate Paris.",
            "max_output_tokens": 80,
            "text": {"format": {"type": "json_schema", "name": "rating", "schema": BOUNDED, "strict": True}},
        },
        timeout=60,
    ).json()
    jsonschema.validate(json.loads(response["output"][0]["content"][0]["text"]), BOUNDED)

    message = httpx.post(
        server.base_url + "/v1/messages",
        json={
            "model": "m",
            "max_tokens": 80,
            "messages": USER,
            "output_config": {"format": {"type": "json_schema", "schema": BOUNDED}},
        },
        headers={"x-api-key": "x", "anthropic-version": "2023-06-01"},
        timeout=60,
    ).json()
    jsonschema.validate(json.loads(message["content"][0]["text"]), BOUNDED)


def test_a_reply_the_budget_would_cut_closes_in_time_and_still_parses(served: SimpleNamespace) -> None:
    """Free strings on a model that writes random tokens run to any budget: the row writes the shortest completion
    (close the string, the missing required keys with their shortest values, the braces) before the budget ends."""
    schema = {
        "type": "object",
        "properties": {"story": {"type": "string"}, "n": {"type": "integer"}, "tags": {"type": "array"}},
        "required": ["story", "n", "tags"],
    }
    for seed, budget in ((1, 40), (2, 64), (3, 96)):  # the shortest object takes 25 tokens here
        params = SamplingParams(max_tokens=budget, temperature=1.0, seed=seed, constraint=only_json(schema))
        result = asyncio.run(served.sampler.sample(served.prompt, params))
        value = json.loads(result.text)
        jsonschema.validate(value, schema)
        assert result.finish_reason == "stop" and len(result.tokens) <= budget
        assert len(result.tokens) - 1 in result.forced_tokens  # the last token before the stop was the closing brace


def test_the_closing_path_from_the_start_is_the_shortest_object(served: SimpleNamespace) -> None:
    import llguidance
    import llguidance.hf
    import llguidance.torch as llg_torch

    from openclaw_cli.backends.local.budget_close import ClosingVocabulary, JsonScan, closing_path

    vocab = served.model.get_input_embeddings().weight.shape[0]
    constraint = only_json({**BOUNDED, "properties": {**BOUNDED["properties"], "answer": {"type": "string"}}})
    matcher = llguidance.LLMatcher(
        llguidance.hf.from_tokenizer(served.tok.hf, n_vocab=vocab),
        llguidance.LLMatcher.grammar_from_lark(lark_grammar(constraint, {})),
    )
    bitmask = llg_torch.allocate_token_bitmask(1, vocab)

    def fill(m: Any) -> torch.Tensor:
        llg_torch.fill_next_token_bitmask(m, bitmask, 0)
        return bitmask[0]

    path = closing_path(matcher, JsonScan(), ClosingVocabulary(served.tok.encode, served.tok.decode), fill)
    assert path is not None
    value = json.loads(served.tok.decode(path))
    assert value == {"answer": "", "score": 0, "tags": [], "ok": value["ok"]} and isinstance(value["ok"], bool)
    # The walk ran on a copy: the matcher itself is still at the start, and takes the path to a complete reply.
    assert matcher.consume_tokens(path) is True and matcher.is_accepting()


def test_a_tool_whose_parameters_use_defs_is_still_decoded_under_its_schema(served: SimpleNamespace) -> None:
    """Pydantic puts nested models in ``$defs``; inside the call object they must move to its root to resolve."""
    parameters = {
        "$defs": {"Addr": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        "type": "object",
        "properties": {"name": {"type": "string"}, "home": {"$ref": "#/$defs/Addr"}},
        "required": ["name", "home"],
    }
    tools = [{"type": "function", "function": {"name": "save", "parameters": parameters}}]
    constraint = OutputConstraint((tool_call_form(served.tok, tools, None),))
    assert served.sampler.accepts_constraint(constraint) is None
    params = SamplingParams(max_tokens=150, temperature=1.0, seed=4, constraint=constraint)
    result = asyncio.run(served.sampler.sample(served.tok.render(USER, tools), params))
    (call,) = served.tok.parse_assistant(result.text).tool_calls
    jsonschema.validate(json.loads(call.arguments), parameters)
