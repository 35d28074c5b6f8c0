"""The hand-off format between the LoRA trainer and the serving side of the local backend.

A published policy is, per adapted linear layer, ``y = W x + scaling * B (A x)`` with the base ``W`` shared by
every version. Keys are module paths in the *base* Hugging Face model (e.g. ``model.layers.0.self_attn.q_proj``),
independent of PEFT's wrapper prefixes, so the serving side needs no PEFT at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class LoraDelta:
    a: torch.Tensor  # [rank, in_features]
    b: torch.Tensor  # [out_features, rank]
    scaling: float


LoraWeights = dict[str, LoraDelta]
