"""What a request demands of the reply, and how it is met: by constrained decoding where the backend has it, else
by checking each sample and resampling.

Three demands, the same way for every API:

- a tool call (OpenAI ``tool_choice`` "required" or a named function; Anthropic ``tool_choice`` any / tool): the
  reply must call at least one tool, and every call it returns must name an offered tool (the named one, when one
  is named). A call to any other tool does not count.
- a JSON answer (OpenAI ``response_format`` json_object / json_schema, Responses ``text.format``, Anthropic
  ``output_config.format``): a reply without tool calls must be exactly one JSON value (surrounding whitespace aside;
  a Markdown fence around it does not count); json_object needs an object; json_schema is validated against the
  schema with ``jsonschema`` (an invalid schema is a 400 when the request is parsed). The prompt is not changed: as
  with OpenAI's json_object, the messages themselves should say what to write.
- one tool call at most (OpenAI ``parallel_tool_calls`` false; Anthropic ``disable_parallel_tool_use``): only the
  first call is returned. The captured completion tokens stay what the model wrote (all calls); the captured
  response and assistant message are what the client saw, and the exchange metadata says how many calls were left
  out (``tool_calls_dropped``).

**Constrained decoding** (:func:`decoding_constraint`): when the backend takes the demand as an
:class:`~openclaw_cli.types.OutputConstraint` (``Backend.accepts_constraint``: the local samplers, and Fireworks for a
plain JSON answer), every token is drawn from the tokens that keep the reply valid: a required tool call is exactly
one call in the model's own frame; a JSON answer is the JSON value, or one tool call where tools are offered and not
ruled out. The first sample meets the demand, so the reply streams as it is made. A reply the token budget would
cut closes in time on the transformers sampler (:mod:`openclaw_cli.backends.local.budget_close`); elsewhere it is
returned cut, finish reason ``length``, as OpenAI does.

**Resampling** otherwise (Tinker, a schema the grammar library rejects): a sample that misses a demand is discarded
and a fresh one drawn (a real sample each time, with a different seed when the request set one), up to
``proxy.tool_choice_retries`` more times per choice; only the returned sample is captured (the discarded ones are
not stored, and the exchange metadata records ``samples_drawn``). When every attempt misses, the request fails with a
502 in the caller's format, marked not to be retried by the SDK (the proxy has already retried).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Any, Literal

import jsonschema

from openclaw_cli.backend import Backend, ChatTokenizer, SupportsConstrainedDecoding
from openclaw_cli.proxy.completion import PreparedPrompt, sample_with_params, split_completion
from openclaw_cli.proxy.errors import ProxyError
from openclaw_cli.proxy.state import BackendHealth
from openclaw_cli.structured_output import json_form, tool_call_form
from openclaw_cli.types import OutputConstraint, ParsedAssistant, SampleResult, SamplingParams, ToolCall

JsonKind = Literal["object", "schema"]
_INT64_SPAN = 2**64


@dataclass(frozen=True)
class ReplyConstraints:
    """The demands of one request. ``tool_names`` None = no tool call required; otherwise the names a call may use."""

    tool_names: frozenset[str] | None = None
    single_tool_call: bool = False
    json_kind: JsonKind | None = None
    json_schema: dict[str, Any] | None = None
    param: str | None = None  # the request parameter that demanded the checked property (for the error)
    decoded: bool = False  # the backend enforces the demands while decoding (see decoding_constraint)
    unenforced_because: str = ""  # why decoding does not enforce them, when it could have (for the error)

    @property
    def demanded(self) -> bool:
        """Whether the reply has a form to meet (a tool call or a JSON answer)."""
        return self.tool_names is not None or self.json_kind is not None

    @property
    def checked(self) -> bool:
        """Whether a sample can miss (and so may need resampling, which rules out streaming tokens as they come)."""
        return self.demanded and not self.decoded

    @property
    def active(self) -> bool:
        """Whether the reply must be seen whole before it is sent (a decoded reply has one tool call at most)."""
        return self.checked or (self.single_tool_call and not self.decoded)

    def output_constraint(
        self, tokenizer: ChatTokenizer, tools: list[dict[str, Any]] | None
    ) -> OutputConstraint | None:
        """The demands as a decoding constraint: the required tool call; or the JSON answer, or a tool call where
        tools are offered. None when nothing is demanded."""
        if self.tool_names is not None and tools:
            return OutputConstraint((tool_call_form(tokenizer, tools, self.tool_names),))
        if self.json_kind is None:
            return None
        forms = [json_form(self.json_schema if self.json_kind == "schema" else None)]
        if tools:
            forms.append(tool_call_form(tokenizer, tools, None))
        return OutputConstraint(tuple(forms))

    def visible_calls(self, calls: list[ToolCall]) -> list[ToolCall]:
        return calls[:1] if self.single_tool_call else calls

    def visible(self, parsed: ParsedAssistant) -> ParsedAssistant:
        """The reply as the client gets it (extra tool calls left out when only one is allowed)."""
        calls = self.visible_calls(parsed.tool_calls)
        return parsed if len(calls) == len(parsed.tool_calls) else replace(parsed, tool_calls=calls)

    def violation(self, parsed: ParsedAssistant) -> str | None:
        """Why the (visible) reply misses a demand, or None when it meets them all."""
        calls = self.visible_calls(parsed.tool_calls)
        if self.tool_names is not None:
            if not calls:
                return "the model did not produce the required tool call"
            wrong = [c.name for c in calls if c.name not in self.tool_names]
            if wrong:
                allowed = ", ".join(repr(n) for n in sorted(self.tool_names))
                return f"the model called {wrong[0]!r} instead of the required tool ({allowed})"
        if self.json_kind is not None and not calls:
            return json_violation(parsed.content, self.json_kind, self.json_schema)
        return None


def decoding_constraint(
    backend: Backend, constraints: ReplyConstraints, tools: list[dict[str, Any]] | None, *, reasoning_open: bool
) -> tuple[ReplyConstraints, OutputConstraint | None]:
    """The request's demands with the constraint the backend decodes under (``decoded`` set), or unchanged with
    None when nothing is demanded or the backend cannot enforce it (then each sample is checked and resampled).
    A prompt that ends inside an open ``<think>`` is not constrained: the reply must first close the reasoning,
    which the grammar does not describe."""
    if not constraints.demanded or reasoning_open:
        return constraints, None
    if not isinstance(backend, SupportsConstrainedDecoding):
        return constraints, None
    accepts = backend.accepts_constraint
    constraint = constraints.output_constraint(backend.tokenizer(), tools)
    if constraint is None:
        return constraints, None
    reason = accepts(constraint)
    if reason is not None:
        return replace(constraints, unenforced_because=reason), None
    return replace(constraints, decoded=True), constraint


def json_violation(text: str, kind: JsonKind, schema: dict[str, Any] | None) -> str | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        return f"the model's reply is not valid JSON ({str(exc)[:120]})"
    if kind == "object" and not isinstance(value, dict):
        return "the model's reply is JSON but not a JSON object"
    if kind == "schema" and schema is not None:
        return schema_violation(value, schema)
    return None


def schema_violation(value: Any, schema: dict[str, Any]) -> str | None:
    try:
        jsonschema.validate(value, schema)
    except jsonschema.ValidationError as exc:
        return f"the model's JSON does not match the schema: {exc.message[:200]}"
    return None


def schema_error(schema: dict[str, Any]) -> str | None:
    """Why ``schema`` is not a valid JSON Schema (checked once per request, before any sampling), or None."""
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as exc:
        return exc.message[:200]
    return None


@dataclass
class Sampled:
    """One choice's returned sample, its parse, and how many samples were drawn to get it."""

    result: SampleResult
    parsed: ParsedAssistant
    samples_drawn: int


def _seeded(params: SamplingParams, offset: int) -> SamplingParams:
    """``params`` for draw ``offset`` of a request: a distinct seed (wrapped into int64), so a resample differs."""
    if offset == 0 or params.seed is None:
        return params
    seed = (params.seed + offset + 2**63) % _INT64_SPAN - 2**63
    return SamplingParams(**{**params.__dict__, "seed": seed})


async def sample_satisfying(
    backend: Backend,
    prepared: PreparedPrompt,
    n: int,
    constraints: ReplyConstraints,
    *,
    retries: int,
    retry_after_s: int,
    health: BackendHealth | None = None,
) -> list[Sampled]:
    """``n`` replies that meet ``constraints``, resampling each failing choice up to ``retries`` times; 502 (kind
    ``unmet_constraint``) when a choice still misses after that. Without checked constraints: one plain sample each."""
    tokenizer = backend.tokenizer()
    params = [_seeded(prepared.params, i) for i in range(n)]
    results = await sample_with_params(backend, prepared, params, retry_after_s=retry_after_s, health=health)
    chosen = [Sampled(r, split_completion(tokenizer, r.text, prepared.tools_offered), 1) for r in results]
    if not constraints.checked:
        return chosen
    for attempt in range(1, retries + 1):
        failing = [i for i, s in enumerate(chosen) if constraints.violation(s.parsed) is not None]
        if not failing:
            return chosen
        redo = [_seeded(prepared.params, attempt * n + i) for i in failing]
        fresh = await sample_with_params(backend, prepared, redo, retry_after_s=retry_after_s, health=health)
        for i, result in zip(failing, fresh, strict=True):
            parsed = split_completion(tokenizer, result.text, prepared.tools_offered)
            chosen[i] = Sampled(result, parsed, chosen[i].samples_drawn + 1)
    for sampled in chosen:
        reason = constraints.violation(sampled.parsed)
        if reason is not None:
            raise ProxyError(
                502,
                f"{reason} (tried {sampled.samples_drawn} samples; proxy.tool_choice_retries={retries}; "
                + (
                    f"constrained decoding could not take this request: {constraints.unenforced_because})"
                    if constraints.unenforced_because
                    else "this backend has no constrained decoding)"
                ),
                kind="unmet_constraint",
                param=constraints.param,
            )
    return chosen


def capture_metadata(constraints: ReplyConstraints, sample: Sampled) -> dict[str, Any]:
    """What the capture should know about enforcement: samples drawn, tool calls the client did not see."""
    if not (constraints.active or constraints.decoded):
        return {}
    dropped = len(sample.parsed.tool_calls) - len(constraints.visible_calls(sample.parsed.tool_calls))
    meta: dict[str, Any] = {"samples_drawn": sample.samples_drawn}
    if dropped:
        meta["tool_calls_dropped"] = dropped
    return meta
