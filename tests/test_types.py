"""Datum alignment (Tinker's convention) and parameter validation."""

from __future__ import annotations

import pytest

from openclaw_cli.types import Datum, SamplingParams, datum_from_completion


def test_datum_alignment_matches_tinker_convention() -> None:
    datum = datum_from_completion([1, 2, 3], [7, 8], logprobs=[-0.5, -0.25], advantages=2.0)
    # position i of model_input predicts target_tokens[i]: 3 -> 7, 7 -> 8
    assert datum.model_input == [1, 2, 3, 7]
    assert datum.loss_fn_inputs["target_tokens"] == [0, 0, 7, 8]
    assert datum.loss_fn_inputs["logprobs"] == [0.0, 0.0, -0.5, -0.25]
    assert datum.loss_fn_inputs["advantages"] == [0.0, 0.0, 2.0, 2.0]
    assert datum.loss_fn_inputs["weights"] == [0.0, 0.0, 1.0, 1.0]


def test_datum_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError, match="logprobs has 1 entries"):
        datum_from_completion([1], [2, 3], logprobs=[-1.0])
    with pytest.raises(ValueError, match="target_tokens"):
        Datum(model_input=[1, 2], loss_fn_inputs={"weights": [1.0, 1.0]})
    with pytest.raises(ValueError, match="length"):
        Datum(model_input=[1, 2], loss_fn_inputs={"target_tokens": [1]})
    with pytest.raises(ValueError):
        datum_from_completion([], [1])


def test_sampling_params_validation() -> None:
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
