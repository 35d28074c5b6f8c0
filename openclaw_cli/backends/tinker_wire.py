"""Pure conversions between openclaw's types and a Tinker-shaped SDK's, and mapping of SDK errors to BackendError.

Nothing here talks to a service. The SDK's type constructors come in as a namespace (``types``: ``ModelInput``,
``Datum``, ``TensorData``, ``SamplingParams``, ``AdamParams``), so the same code serves the ``tinker`` SDK and
Tinker-compatible SDKs (Fireworks' step-wise training SDK) that spell those types the same way.

Datums go out in Tinker's alignment (see :mod:`openclaw_cli.types`): ``model_input = P + C[:-1]``,
``target_tokens = [0] * (len(P) - 1) + C``, logprobs / advantages zero over the prompt. For the RL losses our
per-token ``weights`` are folded into the advantages (``A' = w * A``), which is exactly the same loss for
``importance_sampling`` (−Σ w·r·A) and for ``ppo`` with ``w >= 0`` (min(r·wA, clip(r)·wA) = w·min(rA, clip(r)A)),
so the service receives only the inputs those losses are documented to take.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from openclaw_cli.backend import BackendError
from openclaw_cli.loss_contract import DEFAULT_CLIP_HIGH, DEFAULT_CLIP_LOW, validate_loss_config
from openclaw_cli.types import (
    AdamParams,
    Datum,
    FinishReason,
    FwdBwdResult,
    LossName,
    SampleResult,
    SamplingParams,
)

# Same bound as the local backend's losses: exp() of a larger log-ratio overflows and poisons the metrics.
_LOG_RATIO_LIMIT = 20.0
_MESSAGE_LIMIT = 240


# ---------------------------------------------------------------------------------------------------------------
# Training inputs


def sdk_datum(types: Any, datum: Datum, loss: LossName) -> Any:
    """One of our datums as the SDK's ``Datum`` for ``loss`` (see the module docstring for what is sent)."""
    inputs = datum.loss_fn_inputs
    n = len(datum.model_input)
    targets = _whole_numbers(inputs["target_tokens"], "target_tokens")
    fields: dict[str, Any] = {"target_tokens": _tensor(types, targets, "int64")}
    weights = inputs.get("weights")
    if loss == "cross_entropy":
        fields["weights"] = _tensor(types, list(weights) if weights is not None else [1.0] * n, "float32")
    else:
        missing = [key for key in ("logprobs", "advantages") if key not in inputs]
        if missing:
            raise BackendError(f"loss {loss!r} needs loss_fn_inputs {', '.join(missing)}", status_code=400)
        advantages = list(inputs["advantages"])
        if weights is not None:
            if any(w < 0 for w in weights):
                raise BackendError(f"loss {loss!r} needs weights >= 0 (they scale the advantages)", status_code=400)
            advantages = [a * w for a, w in zip(advantages, weights, strict=True)]
        fields["logprobs"] = _tensor(types, list(inputs["logprobs"]), "float32")
        fields["advantages"] = _tensor(types, advantages, "float32")
    model_input = types.ModelInput.from_ints([int(t) for t in datum.model_input])
    return types.Datum(model_input=model_input, loss_fn_inputs=fields)


def sdk_loss_config(loss: LossName, config: dict[str, float] | None) -> dict[str, float] | None:
    """Our loss_config in Tinker's terms: PPO clip as ratio bounds; ``eps_low``/``eps_high`` are converted."""
    try:
        bounds = validate_loss_config(loss, config)
    except ValueError as exc:
        raise BackendError(str(exc), status_code=400) from exc
    if bounds is None or not config:
        return None
    return {"clip_low_threshold": bounds.low, "clip_high_threshold": bounds.high}


def sdk_adam(types: Any, adam: AdamParams) -> Any:
    return types.AdamParams(
        learning_rate=adam.learning_rate,
        beta1=adam.beta1,
        beta2=adam.beta2,
        eps=adam.eps,
        weight_decay=adam.weight_decay,
        grad_clip_norm=adam.grad_clip_norm,
    )


def fwdbwd_result(
    output: Any, datums: list[Datum], loss: LossName, sdk_config: dict[str, float] | None
) -> FwdBwdResult:
    """The SDK's ForwardBackwardOutput as our FwdBwdResult.

    ``loss`` is the service's ``loss:sum``. ``n_tokens`` and, when the service returns the learner's logprobs,
    ``ratio_mean`` / ``kl_sampler`` / ``clip_fraction`` are computed here the way the local backend computes them,
    so dashboards read the same numbers whichever backend trains.
    """
    metrics = {str(k): float(v) for k, v in (getattr(output, "metrics", None) or {}).items()}
    loss_sum = metrics.get("loss:sum", metrics.get("loss"))
    if loss_sum is None:
        raise BackendError("the training service returned no 'loss:sum' metric for forward_backward")
    outputs = list(getattr(output, "loss_fn_outputs", None) or [])
    learner: list[list[float]] = []
    for item in outputs:
        values = item.get("logprobs") if isinstance(item, dict) else None
        learner.append(_to_floats(values) if values is not None else [])
    complete = len(learner) == len(datums) and all(
        len(lp) == len(d.model_input) for lp, d in zip(learner, datums, strict=True)
    )
    if not complete:
        learner = []  # the service did not return per-token logprobs for every datum: report none rather than guess
    ours = _token_metrics(datums, learner, loss, sdk_config)
    merged = {**metrics, **ours, "loss:sum": float(loss_sum)}
    return FwdBwdResult(loss=float(loss_sum), metrics=merged, logprobs=learner)


def _token_metrics(
    datums: list[Datum], learner: list[list[float]], loss: LossName, sdk_config: dict[str, float] | None
) -> dict[str, float]:
    n_tokens = 0
    ratio_sum = kl_sum = 0.0
    clipped = 0
    low = (sdk_config or {}).get("clip_low_threshold", DEFAULT_CLIP_LOW)
    high = (sdk_config or {}).get("clip_high_threshold", DEFAULT_CLIP_HIGH)
    for index, datum in enumerate(datums):
        inputs = datum.loss_fn_inputs
        weights = inputs.get("weights")
        advantages = inputs.get("advantages")
        if weights is not None:
            active = [w > 0 for w in weights]
        elif advantages is not None:
            active = [a != 0 for a in advantages]
        else:
            active = [True] * len(datum.model_input)
        n_tokens += sum(active)
        sampler = inputs.get("logprobs")
        if not learner or sampler is None or loss == "cross_entropy":
            continue
        for pos, on in enumerate(active):
            if not on:
                continue
            log_ratio = max(-_LOG_RATIO_LIMIT, min(_LOG_RATIO_LIMIT, learner[index][pos] - sampler[pos]))
            ratio = math.exp(log_ratio)
            ratio_sum += ratio
            kl_sum += math.exp(-log_ratio) + log_ratio - 1.0  # k3 estimator of KL(sampler || learner)
            adv = advantages[pos] if advantages is not None else 0.0
            if loss == "ppo" and ((ratio > high and adv > 0) or (ratio < low and adv < 0)):
                clipped += 1
    out = {"n_tokens": float(n_tokens)}
    if learner and n_tokens and loss != "cross_entropy" and all("logprobs" in d.loss_fn_inputs for d in datums):
        out["ratio_mean"] = ratio_sum / n_tokens
        out["kl_sampler"] = kl_sum / n_tokens
        if loss == "ppo":
            out["clip_fraction"] = clipped / n_tokens
    return out


# ---------------------------------------------------------------------------------------------------------------
# Sampling


def sdk_sampling_params(types: Any, params: SamplingParams, eos_token_ids: Sequence[int]) -> Any:
    """Our SamplingParams for the service. Stops go as token ids (EOS + ``stop_token_ids``); stop *strings* are
    applied after sampling by :func:`sample_result`, because the service takes either strings or ids, not both."""
    stop_ids = sorted({int(t) for t in eos_token_ids} | {int(t) for t in params.stop_token_ids})
    return types.SamplingParams(
        max_tokens=params.max_tokens,
        seed=params.seed,
        stop=stop_ids or None,  # None keeps the service's implicit EOS stop
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
    )


def sample_result(
    sequence: Any,
    params: SamplingParams,
    *,
    version: int,
    prompt_tokens: int,
    decode: Callable[[Sequence[int]], str],
    eos_token_ids: Sequence[int],
    started_at: float,
    finished_at: float,
) -> SampleResult:
    """One SampledSequence as our SampleResult, cut at the first stop string (tokens, logprobs and text alike)."""
    tokens = [int(t) for t in sequence.tokens]
    raw_logprobs = sequence.logprobs
    if raw_logprobs is None or len(raw_logprobs) != len(tokens):
        got = "none" if raw_logprobs is None else str(len(raw_logprobs))
        raise BackendError(f"the sampler returned {len(tokens)} tokens but {got} logprobs; cannot record this reply")
    logprobs = [float(v) for v in raw_logprobs]
    finish: FinishReason = "stop" if sequence.stop_reason == "stop" else "length"
    stop_ids = {int(t) for t in eos_token_ids} | {int(t) for t in params.stop_token_ids}
    stop_sequence: str | None = None
    cut = _stop_string_cut(tokens, decode, params.stop)
    if cut is not None:
        length, stop_sequence, text = cut
        tokens, logprobs, finish = tokens[:length], logprobs[:length], "stop"
    else:
        # A stop token ends the reply but is not part of its text (some stop ids are not special tokens).
        visible = tokens[:-1] if finish == "stop" and tokens and tokens[-1] in stop_ids else tokens
        text = decode(visible)
    return SampleResult(
        tokens=tokens,
        logprobs=logprobs,
        finish_reason=finish,
        version=version,
        text=text,
        stop_sequence=stop_sequence,
        prompt_tokens=prompt_tokens,
        started_at=started_at,
        first_token_at=finished_at,  # nothing is seen before the whole completion arrives
        finished_at=finished_at,
    )


def _stop_string_cut(
    tokens: list[int], decode: Callable[[Sequence[int]], str], stops: Sequence[str]
) -> tuple[int, str, str] | None:
    """(tokens to keep, the stop string, the text before it) for the first stop string, or None.

    The kept tokens end with the token that completed the stop string (as the local sampler keeps them). Found by
    bisection over prefix lengths, since "the decoded prefix contains a stop" only turns on as the prefix grows.
    """
    stops = [s for s in stops if s]
    if not stops or _first_stop(decode(tokens), stops) is None:
        return None
    low, high = 1, len(tokens)
    while low < high:
        mid = (low + high) // 2
        if _first_stop(decode(tokens[:mid]), stops) is None:
            low = mid + 1
        else:
            high = mid
    text = decode(tokens[:low])
    found = _first_stop(text, stops)
    assert found is not None  # the full list contains a stop, so the bisection ends on a prefix that does
    at, stop = found
    return low, stop, text[:at]


def _first_stop(text: str, stops: Sequence[str]) -> tuple[int, str] | None:
    hits = [(at, stop) for stop in stops if (at := text.find(stop)) != -1]
    return min(hits) if hits else None


# ---------------------------------------------------------------------------------------------------------------
# Errors


def backend_error(
    exc: BaseException,
    *,
    doing: str,
    title: str,
    key_env: str,
    timeout_errors: tuple[type[BaseException], ...] = (),
    connection_errors: tuple[type[BaseException], ...] = (),
    redact: Sequence[str] = (),
) -> BackendError:
    """One clear line for a failed SDK call, ``retryable`` when trying later can help (capacity, rate limits,
    timeouts, connection trouble, 5xx), so the proxy answers 503 + Retry-After. Secrets in ``redact`` never
    appear in the message."""
    if isinstance(exc, BackendError):
        return exc
    detail = one_line(exc, redact)
    status = getattr(exc, "status_code", None)
    if isinstance(status, int) and not isinstance(status, bool):
        return _status_error(status, detail, doing=doing, title=title, key_env=key_env)
    if isinstance(exc, (TimeoutError, *timeout_errors)):
        return BackendError(f"{title} did not answer in time while {doing}; try again shortly", retryable=True)
    if isinstance(exc, (ConnectionError, *connection_errors)):
        return BackendError(f"cannot reach {title} while {doing}: {detail}", retryable=True)
    category = getattr(exc, "category", None)
    if category is not None:  # a request that completed in a failed state (tinker.RequestFailedError)
        if str(getattr(category, "value", category)).lower() == "user":
            return BackendError(f"{title} rejected the request while {doing}: {detail}", status_code=400)
        return BackendError(f"{title} failed while {doing} (server side, may pass): {detail}", retryable=True)
    return BackendError(f"{title} call failed while {doing}: {type(exc).__name__}: {detail}")


def _status_error(status: int, detail: str, *, doing: str, title: str, key_env: str) -> BackendError:
    if status == 401:
        return BackendError(f"{title} rejected the API key while {doing} (401); check {key_env}")
    if status == 402:
        return BackendError(f"{title} refused {doing} for billing/quota reasons (402): {detail}")
    if status == 403:
        return BackendError(f"{title} denied access while {doing} (403); check {key_env} and its project: {detail}")
    if status == 404:
        return BackendError(f"{title} could not find what {doing} needs (404): {detail}")
    if status in (408, 409, 429) or status >= 500:
        reason = {408: "timed out", 409: "is busy with a conflicting request", 429: "is rate-limiting or at capacity"}
        what = reason.get(status, "had a server error")
        return BackendError(f"{title} {what} ({status}) while {doing}; try again shortly: {detail}", retryable=True)
    if 400 <= status < 500:
        return BackendError(f"{title} rejected the request while {doing} ({status}): {detail}", status_code=400)
    return BackendError(f"{title} answered {status} while {doing}: {detail}")


def one_line(exc: BaseException, redact: Sequence[str]) -> str:
    """The exception's message on one line, shortened, with every secret in ``redact`` masked."""
    text = str(getattr(exc, "message", None) or exc) or type(exc).__name__
    for secret in redact:
        if secret:
            text = text.replace(secret, "****")
    text = " ".join(text.split())
    return text if len(text) <= _MESSAGE_LIMIT else text[: _MESSAGE_LIMIT - 1] + "…"


# ---------------------------------------------------------------------------------------------------------------
# helpers


def _tensor(types: Any, values: list[int] | list[float], dtype: str) -> Any:
    return types.TensorData(data=values, dtype=dtype, shape=[len(values)])


def _whole_numbers(values: Sequence[float], what: str) -> list[int]:
    out = []
    for value in values:
        if not float(value).is_integer():
            raise BackendError(f"{what} must hold token ids (whole numbers), got {value!r}", status_code=400)
        out.append(int(value))
    return out


def _to_floats(values: Any) -> list[float]:
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [float(v) for v in values]
