"""The three Tinker losses against hand computations (values and d loss / d lp), plus config validation."""

from __future__ import annotations

import math

import pytest
import torch

from openclaw_cli.backends.local.losses import ClipBounds, compute_loss, validate_loss_config

# Two sequences of three tokens. Sequence 1 starts with a prompt token (weight 0).
#                 token:  a      b      c   |   d      e      f
# learner lp           -1.0   -0.5   -1.0  |  -0.3   -1.5   -2.0
# sampler slp           0.0   -0.5   -1.5  |  -0.6   -1.0   -1.0
# advantage A           3.0    2.0    1.0  |  -1.0   -1.0    0.5
# weight w              0      1      1    |   1      0.5    1
# ratio r = e^(lp-slp)  -      1    e^0.5  |  e^0.3  e^-0.5  e^-1
# PPO (0.8, 1.28):      -    inside  r>hi,A>0 | r>hi,A<0  r<lo,A<0  r<lo,A>0
#                             free   CLIPPED  |  free    CLIPPED    free
LP = [[-1.0, -0.5, -1.0], [-0.3, -1.5, -2.0]]
SLP = [[0.0, -0.5, -1.5], [-0.6, -1.0, -1.0]]
ADV = [[3.0, 2.0, 1.0], [-1.0, -1.0, 0.5]]
W = [[0.0, 1.0, 1.0], [1.0, 0.5, 1.0]]
R_B, R_C, R_D, R_E, R_F = 1.0, math.exp(0.5), math.exp(0.3), math.exp(-0.5), math.exp(-1.0)


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    lp = torch.tensor(LP, requires_grad=True)
    return lp, torch.tensor(SLP), torch.tensor(ADV), torch.tensor(W)


def _run(loss: str, config: dict[str, float] | None = None):
    lp, slp, adv, w = _inputs()
    out = compute_loss(loss, lp, weights=w, sampler_logprobs=slp, advantages=adv, config=config)
    out.loss.backward()
    assert lp.grad is not None
    return out, lp.grad


def test_cross_entropy_value_and_gradient() -> None:
    out, grad = _run("cross_entropy")
    # -(1*-0.5 + 1*-1.0 + 1*-0.3 + 0.5*-1.5 + 1*-2.0)
    assert out.loss.item() == pytest.approx(4.55, abs=1e-6)
    assert torch.allclose(grad, -torch.tensor(W))  # d/d lp = -w
    assert out.stats.metrics()["loss:sum"] == pytest.approx(4.55, abs=1e-6)
    assert out.stats.metrics()["n_tokens"] == 5.0


def test_cross_entropy_without_sampler_logprobs_reports_no_ratio() -> None:
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    out = compute_loss("cross_entropy", lp)  # weights default to 1
    assert out.loss.item() == pytest.approx(3.0)
    assert set(out.stats.metrics()) == {"loss:sum", "n_tokens"}


def test_importance_sampling_value_and_gradient() -> None:
    out, grad = _run("importance_sampling")
    terms = [1 * R_B * 2.0, 1 * R_C * 1.0, 1 * R_D * -1.0, 0.5 * R_E * -1.0, 1 * R_F * 0.5]
    assert out.loss.item() == pytest.approx(-sum(terms), abs=1e-5)  # = -2.179537
    assert out.loss.item() == pytest.approx(-2.179537, abs=1e-5)
    # d/d lp of -w * r * A is -w * r * A (dr/dlp = r); the prompt token gets nothing.
    expected = torch.tensor([[0.0, -2.0, -R_C], [R_D, 0.5 * R_E, -0.5 * R_F]])
    assert torch.allclose(grad, expected, atol=1e-6)


def test_ppo_value_gradient_and_clip_fraction() -> None:
    out, grad = _run("ppo")  # defaults: ratio bounds 0.8 / 1.28
    # b free: 2*1; c clipped: 1.28*1; d free: e^0.3*-1; e clipped: 0.5*(0.8*-1); f free: e^-1*0.5
    terms = [2.0, 1.28, -R_D, 0.5 * 0.8 * -1.0, 0.5 * R_F]
    assert out.loss.item() == pytest.approx(-sum(terms), abs=1e-5)
    assert out.loss.item() == pytest.approx(-1.714081, abs=1e-5)
    # Free tokens: -w * r * A; clipped tokens (c, e): exactly 0.
    expected = torch.tensor([[0.0, -2.0, 0.0], [R_D, 0.0, -0.5 * R_F]])
    assert torch.allclose(grad, expected, atol=1e-6)
    metrics = out.stats.metrics()
    assert metrics["clip_fraction"] == pytest.approx(2 / 5)
    assert metrics["n_tokens"] == 5.0
    assert metrics["ratio_mean"] == pytest.approx((R_B + R_C + R_D + R_E + R_F) / 5, abs=1e-6)
    # k3 with x = slp - lp over weighted tokens: e^x - x - 1
    k3 = [math.exp(x) - x - 1 for x in (0.0, -0.5, -0.3, 0.5, 1.0)]
    assert metrics["kl_sampler"] == pytest.approx(sum(k3) / 5, abs=1e-6)  # = 0.2028704
    assert metrics["kl_sampler"] == pytest.approx(0.2028704, abs=1e-6)


def test_ppo_eps_form_equals_ratio_form() -> None:
    by_ratio, grad_ratio = _run("ppo", {"clip_low_threshold": 0.7, "clip_high_threshold": 1.5})
    by_eps, grad_eps = _run("ppo", {"eps_low": 0.3, "eps_high": 0.5})
    assert by_ratio.loss.item() == pytest.approx(by_eps.loss.item())
    assert torch.allclose(grad_ratio, grad_eps)
    # With high = 1.5, token c (r = 1.649) is still clipped; with 0.7, token e (0.607) too.
    assert by_eps.stats.metrics()["clip_fraction"] == pytest.approx(2 / 5)
    wide, _ = _run("ppo", {"eps_low": 0.5, "eps_high": 1.0})  # [0.5, 2.0]: nothing clipped -> equals IS
    is_out, _ = _run("importance_sampling")
    assert wide.loss.item() == pytest.approx(is_out.loss.item(), abs=1e-6)
    assert wide.stats.metrics()["clip_fraction"] == 0.0


def test_log_ratio_is_clamped_so_extreme_sampler_logprobs_stay_finite() -> None:
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    slp = torch.tensor([-1000.0, -math.inf])
    out = compute_loss("importance_sampling", lp, sampler_logprobs=slp, advantages=torch.tensor([1.0, 1.0]))
    out.loss.backward()
    assert out.loss.item() == pytest.approx(-2 * math.exp(20.0), rel=1e-5)
    assert lp.grad is not None and torch.isfinite(lp.grad).all()
    assert all(math.isfinite(v) for v in out.stats.metrics().values())


def test_zero_weight_positions_cannot_poison_the_sum() -> None:
    lp = torch.tensor([-math.inf, -1.0], requires_grad=True)  # -inf on a masked prompt position
    out = compute_loss("cross_entropy", lp, weights=torch.tensor([0.0, 1.0]))
    assert out.loss.item() == pytest.approx(1.0)


def test_no_weighted_tokens_reports_sums_but_no_means() -> None:
    lp = torch.tensor([-1.0], requires_grad=True)
    out = compute_loss(
        "ppo", lp, weights=torch.tensor([0.0]), sampler_logprobs=torch.tensor([-1.0]), advantages=torch.tensor([1.0])
    )
    assert out.stats.metrics() == {"loss:sum": 0.0, "n_tokens": 0.0}


def test_stats_add_across_micro_batches() -> None:
    lp, slp, adv, w = _inputs()
    whole = compute_loss("ppo", lp, weights=w, sampler_logprobs=slp, advantages=adv).stats
    halves = [
        compute_loss("ppo", lp[i], weights=w[i], sampler_logprobs=slp[i], advantages=adv[i]).stats for i in (0, 1)
    ]
    combined = (halves[0] + halves[1]).metrics()
    for key, value in whole.metrics().items():
        assert combined[key] == pytest.approx(value, abs=1e-6)


@pytest.mark.parametrize(
    ("loss", "config", "message"),
    [
        ("ppo", {"clip_low": 0.8}, "unknown key"),
        ("importance_sampling", {"eps_low": 0.2}, "unknown key"),
        ("cross_entropy", {"clip_high_threshold": 1.2}, "unknown key"),
        ("ppo", {"eps_low": 0.2, "clip_high_threshold": 1.2}, "mixes"),
        ("ppo", {"clip_low_threshold": 1.1}, "0 <= low <= 1 <= high"),
        ("ppo", {"eps_high": -0.5}, "0 <= low <= 1 <= high"),
        ("ppo", {"eps_low": "0.2"}, "must be a number"),
        ("dpo", None, "unknown loss"),
    ],
)
def test_bad_loss_config_is_rejected(loss: str, config: dict[str, float] | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        validate_loss_config(loss, config)


def test_clip_bounds_defaults_and_partial_eps() -> None:
    assert validate_loss_config("ppo", None) == ClipBounds(0.8, 1.28)
    assert validate_loss_config("ppo", {"eps_high": 0.4}) == ClipBounds(0.8, 1.4)
    assert validate_loss_config("importance_sampling", {}) is None


@pytest.mark.parametrize(("loss", "missing"), [("ppo", "advantages"), ("importance_sampling", "logprobs")])
def test_missing_required_inputs_are_named(loss: str, missing: str) -> None:
    lp = torch.tensor([-1.0], requires_grad=True)
    given = {"sampler_logprobs": torch.tensor([-1.0]), "advantages": torch.tensor([1.0])}
    given["advantages" if missing == "advantages" else "sampler_logprobs"] = None
    with pytest.raises(ValueError, match=missing):
        compute_loss(loss, lp, **given)


def test_shape_mismatch_is_rejected() -> None:
    with pytest.raises(ValueError, match="weights has shape"):
        compute_loss("cross_entropy", torch.zeros(3), weights=torch.ones(2))
