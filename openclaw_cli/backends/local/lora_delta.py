"""The hand-off format between the LoRA trainer and the serving side of the local backend.

A published policy is, per adapted linear layer, ``y = W x + scaling * B (A x)`` with the base ``W`` shared by
every version. Keys are module paths in the *base* Hugging Face model (e.g. ``model.layers.0.self_attn.q_proj``),
independent of PEFT's wrapper prefixes, so the serving side needs no PEFT at all.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch

from openclaw_cli.backend import BackendError


@dataclass(frozen=True)
class LoraDelta:
    a: torch.Tensor  # [rank, in_features]
    b: torch.Tensor  # [out_features, rank]
    scaling: float


LoraWeights = dict[str, LoraDelta]

PEFT_PREFIX = "base_model.model."


def write_peft_adapter(weights: LoraWeights, out_dir: Path, base_model: str | Path) -> Path:
    """Write ``weights`` as a PEFT LoRA adapter dir (``adapter_config.json`` + ``adapter_model.safetensors``).

    The keys of ``weights`` are module paths in the base model, so each becomes
    ``base_model.model.<path>.lora_{A,B}.weight``; ``lora_alpha = scaling * r`` so ``alpha / r`` gives back the
    scaling. One rank and one scaling for every layer (what one LoRA config trains) is required.
    """
    from safetensors.torch import save_file

    if not weights:
        raise BackendError("cannot publish an empty LoRA adapter")
    ranks = Counter(delta.a.shape[0] for delta in weights.values())
    scalings = Counter(round(float(delta.scaling), 9) for delta in weights.values())
    if len(ranks) != 1 or len(scalings) != 1:
        raise BackendError(
            f"LoRA layers disagree on rank {sorted(ranks)} or scaling {sorted(scalings)}; one adapter needs one"
        )
    rank, scaling = next(iter(ranks)), next(iter(scalings))
    tensors = {}
    for key, delta in weights.items():
        tensors[f"{PEFT_PREFIX}{key}.lora_A.weight"] = delta.a.detach().to("cpu").contiguous()
        tensors[f"{PEFT_PREFIX}{key}.lora_B.weight"] = delta.b.detach().to("cpu").contiguous()
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(base_model),
        "r": rank,
        "lora_alpha": scaling * rank,
        "lora_dropout": 0.0,
        "bias": "none",
        "use_rslora": False,
        "fan_in_fan_out": False,
        "inference_mode": True,
        # Leaf names, the form every PEFT and vLLM version accepts; the saved tensors say which layers.
        "target_modules": sorted({key.rpartition(".")[2] for key in weights}),
        "modules_to_save": None,
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / "adapter_model.safetensors"))
    (out_dir / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir
