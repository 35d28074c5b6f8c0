"""LoRA training for the local backend: PEFT adapters on a structural copy of the base model.

The serving side wraps the base model's linear layers itself and serves published :data:`LoraWeights`, so this
trainer never touches the base model's module tree. It trains on a deep copy whose parameters and buffers ARE the
base model's tensors (no second copy of the weights); only the module objects are new. Construct the trainer
before the serving side wraps the base model: the copy is taken at construction and is independent afterwards.

Semantics follow Tinker: ``forward_backward`` accumulates gradients of a SUMMED loss until ``optim_step``; the
datum alignment is "position i of model_input predicts target_tokens[i]".
"""

from __future__ import annotations

import copy
import json
import math
import os
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.tuners.lora import LoraLayer
from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict
from safetensors.torch import load_file
from torch import nn

from openclaw_cli.backends.local.lora_delta import LoraDelta, LoraWeights
from openclaw_cli.backends.local.losses import LossStats, compute_loss, required_inputs, validate_loss_config
from openclaw_cli.settings import LoraSettings
from openclaw_cli.types import AdamParams, Datum, FwdBwdResult, StepResult

ADAPTER_NAME = "default"  # PEFT's adapter name; the saved files carry no adapter name, so any loader accepts them
TRAINER_STATE_FILE = "trainer_state.pt"
ADAPTER_CONFIG_FILE = "adapter_config.json"
ADAPTER_WEIGHTS_FILE = "adapter_model.safetensors"
_STATE_FORMAT = 1
_KNOWN_INPUTS = frozenset({"target_tokens", "weights", "logprobs", "advantages"})


def resolve_lora_targets(model: nn.Module, targets: list[str]) -> tuple[list[str], list[str]]:
    """Which of ``targets`` name linear layers of ``model``, and the module paths they select.

    A target matches a module path by PEFT's rule: the whole path, or its last dotted components
    (``q_proj`` and ``self_attn.q_proj`` both select ``model.layers.0.self_attn.q_proj``).
    """
    linear_paths = [name for name, module in model.named_modules() if isinstance(module, nn.Linear)]
    matched_targets = [t for t in targets if any(_matches(path, t) for path in linear_paths)]
    if not matched_targets:
        suffixes = sorted({path.rpartition(".")[2] for path in linear_paths})
        raise ValueError(
            f"none of the LoRA targets {targets} names a linear layer of this model; "
            f"its linear layers are named {', '.join(suffixes) or '(none)'}"
        )
    selected = [path for path in linear_paths if any(_matches(path, t) for t in matched_targets)]
    return matched_targets, selected


def _matches(path: str, target: str) -> bool:
    return path == target or path.endswith("." + target)


def structural_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model``'s module objects that shares every parameter and buffer tensor with it."""
    shared = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo=shared)


class SeededLoraDropout(nn.Module):
    """LoRA dropout drawing from the trainer's own generator.

    nn.Dropout draws from torch's global generator, which the sampler on another thread may be using at the same
    time; a private generator keeps training reproducible (and its state checkpointable) without touching it.
    """

    def __init__(self, p: float, generator: torch.Generator) -> None:
        super().__init__()
        self.p = p
        self.generator = generator

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = torch.empty_like(x).bernoulli_(1.0 - self.p, generator=self.generator)
        return x * keep / (1.0 - self.p)


@dataclass
class _PreparedDatum:
    index: int
    input_ids: torch.Tensor  # long [n]
    targets: torch.Tensor  # long [n]
    weights: torch.Tensor  # float32 [n]
    sampler_logprobs: torch.Tensor | None
    advantages: torch.Tensor | None

    @property
    def length(self) -> int:
        return int(self.input_ids.numel())


def _first_scored(batch: list[_PreparedDatum]) -> int:
    """The first position any datum of ``batch`` weights: nothing before it enters the loss. 0 when a datum weights
    nothing at all: that is a probe whose caller reads the returned log-probabilities (a custom loss's first pass)."""
    firsts = []
    for p in batch:
        weighted = torch.nonzero(p.weights).flatten()
        if weighted.numel() == 0:
            return 0
        firsts.append(int(weighted[0]))
    return min(firsts)


class LoraTrainer:
    """Trains one LoRA adapter over a frozen base model with Tinker's forward_backward / optim_step contract.

    Not thread-safe: the local backend serialises calls (one lock, ``asyncio.to_thread``).
    ``max_batch_tokens`` bounds one forward pass (datums x padded length); larger calls are split into
    micro-batches, which is exact because the loss is a sum and gradients accumulate.
    ``every_position``: ``forward_backward`` returns a log-probability for every position, as Tinker and Fireworks
    do (their test doubles train with this class); False (the local backend) scores only from the first position a
    micro-batch weights and returns NaN before it (see :meth:`_learner_logprobs`).
    """

    def __init__(
        self,
        base_model: nn.Module,
        lora: LoraSettings,
        *,
        seed: int = 0,
        max_batch_tokens: int = 4096,
        every_position: bool = True,
    ) -> None:
        if max_batch_tokens < 1:
            raise ValueError(f"max_batch_tokens must be >= 1, got {max_batch_tokens}")
        self.step = 0
        self.lora = lora
        self.seed = seed
        self.max_batch_tokens = max_batch_tokens
        self.every_position = every_position
        self.target_modules, self._target_paths = resolve_lora_targets(base_model, list(lora.targets))

        self._model = structural_copy(base_model)
        config = LoraConfig(
            r=lora.rank,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules=self.target_modules,
            bias="none",
            task_type="CAUSAL_LM",
            init_lora_weights=True,  # A ~ kaiming-uniform, B = 0: the untrained policy IS the base model
        )
        # PEFT creates and initialises A on the CPU with the global generator; fork it so the seed decides the
        # init without changing anyone else's random stream.
        with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
            torch.random.default_generator.manual_seed(seed)
            # PEFT reads transformers' deprecated `is_gradient_checkpointing` here: a FutureWarning about their
            # internals that says nothing to a user, printed in every launch log. Ours stay.
            warnings.filterwarnings(
                "ignore", message=r"`is_gradient_checkpointing` is deprecated", category=FutureWarning
            )
            self.peft_model: PeftModel = get_peft_model(self._model, config)

        self._lora_layers = self._collect_lora_layers()
        self._lora_params = self._freeze_all_but_lora()
        self._generators = self._install_seeded_dropout(seed)
        # Dropout-free eval mode everywhere (the sampler's distribution), except LoRA's own dropout.
        self.peft_model.eval()
        for layer in self._lora_layers.values():
            layer.lora_dropout.train()

        self._device = self._model.get_input_embeddings().weight.device
        self._input_vocab = int(self._model.get_input_embeddings().weight.shape[0])
        output = self._model.get_output_embeddings()
        self._output_vocab = int(output.weight.shape[0]) if output is not None else self._input_vocab
        self._max_positions: int | None = getattr(getattr(self._model, "config", None), "max_position_embeddings", None)
        self._optimizer: torch.optim.AdamW | None = None
        self._grad_pending = False

    # ------------------------------------------------------------------ training

    def forward_backward(
        self, datums: list[Datum], loss: str, loss_config: dict[str, float] | None = None
    ) -> FwdBwdResult:
        """Add the gradient of the summed ``loss`` over ``datums`` to the accumulated LoRA gradients.

        Every datum is validated before any forward pass, so a ValueError leaves the accumulated gradients as they
        were. With LoRA dropout > 0 the returned logprobs are those of the dropped-out forward pass, as trained.
        """
        validate_loss_config(loss, loss_config)
        if not datums:
            raise ValueError("forward_backward needs at least one datum")
        needed = required_inputs(loss)
        prepared = [self._prepare(i, datum, needed) for i, datum in enumerate(datums)]
        with_sampler = all(p.sampler_logprobs is not None for p in prepared)
        with_advantages = all(p.advantages is not None for p in prepared)

        stats = LossStats()
        logprobs: list[list[float]] = [[] for _ in prepared]
        backward_done = False
        try:
            with torch.enable_grad():
                for batch in self._micro_batches(prepared):
                    per_datum = self._learner_logprobs(batch)
                    out = compute_loss(
                        loss,
                        torch.cat(per_datum),
                        weights=self._cat(p.weights for p in batch),
                        sampler_logprobs=self._cat(p.sampler_logprobs for p in batch) if with_sampler else None,
                        advantages=self._cat(p.advantages for p in batch) if with_advantages else None,
                        config=loss_config,
                    )
                    out.loss.backward()
                    backward_done = self._grad_pending = True
                    stats = stats + out.stats
                    for p, lp in zip(batch, per_datum, strict=True):
                        logprobs[p.index] = lp.detach().cpu().tolist()
        except Exception as exc:
            if backward_done:
                # Part of this call's gradient may already be accumulated; keeping it would make a retry count
                # those datums twice, so everything accumulated since the last step is dropped.
                self._discard_gradients()
                raise RuntimeError(
                    f"forward_backward failed part-way ({exc}); accumulated gradients were discarded, "
                    "resubmit every datum since the last optim_step"
                ) from exc
            raise
        return FwdBwdResult(loss=stats.loss_sum, metrics=stats.metrics(), logprobs=logprobs)

    def discard_gradients(self) -> None:
        """Drop the gradients accumulated since the last ``optim_step`` (the trainer loop's retry guard)."""
        self._discard_gradients()

    def optim_step(self, adam: AdamParams) -> StepResult:
        """One AdamW step on the LoRA parameters with the accumulated gradients, then clear them."""
        _validate_adam(adam)
        if not self._grad_pending:
            raise RuntimeError("optim_step without accumulated gradients: call forward_backward first")
        optimizer = self._ensure_optimizer()
        for group in optimizer.param_groups:
            # Hyper-parameters come with every step (a schedule lives in the caller), as in Tinker.
            group["lr"] = adam.learning_rate
            group["betas"] = (adam.beta1, adam.beta2)
            group["eps"] = adam.eps
            group["weight_decay"] = adam.weight_decay
        grads = [p.grad for p in self._lora_params if p.grad is not None]
        grad_norm = float(torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.float()) for g in grads])))
        if not math.isfinite(grad_norm):
            self._discard_gradients()
            raise RuntimeError(f"gradient norm is {grad_norm}; step skipped and gradients discarded")
        if adam.grad_clip_norm > 0 and grad_norm > adam.grad_clip_norm:
            scale = adam.grad_clip_norm / (grad_norm + 1e-6)
            for g in grads:
                g.mul_(scale)
        optimizer.step()
        self._discard_gradients()
        self.step += 1
        return StepResult(step=self.step, metrics={"grad_norm": grad_norm, "lr": adam.learning_rate})

    # ------------------------------------------------------------------ hand-off and checkpoints

    def lora_weights(self) -> LoraWeights:
        """Detached clones of every adapter, keyed by module path in the base model (see lora_delta.py)."""
        return {
            path: LoraDelta(
                a=layer.lora_A[ADAPTER_NAME].weight.detach().clone(),
                b=layer.lora_B[ADAPTER_NAME].weight.detach().clone(),
                scaling=float(layer.scaling[ADAPTER_NAME]),
            )
            for path, layer in self._lora_layers.items()
        }

    def set_lora_weights(self, weights: LoraWeights) -> None:
        """Continue training from ``weights`` (a served version's deltas, as :meth:`lora_weights` returns them).

        An empty mapping means the base model: every B is zeroed (A is kept; with B = 0 the adapter adds nothing).
        The optimizer's moments belong to the trajectory being abandoned, so they are dropped (the next step starts
        a fresh AdamW), and so are gradients accumulated meanwhile; the step counter keeps counting.
        """
        unknown = sorted(set(weights) - set(self._lora_layers))
        if unknown:
            raise ValueError(f"LoRA weights name layers this trainer does not adapt: {', '.join(unknown[:5])}")
        with torch.no_grad():
            for path, layer in self._lora_layers.items():
                a, b = _adapter_params(layer)
                delta = weights.get(path)
                if delta is None:
                    if weights:
                        raise ValueError(f"LoRA weights lack layer {path}; give every layer or none (the base)")
                    b.zero_()
                    continue
                if delta.a.shape != a.shape or delta.b.shape != b.shape:
                    raise ValueError(
                        f"LoRA delta for {path} has shapes A{tuple(delta.a.shape)} B{tuple(delta.b.shape)}, "
                        f"this trainer's are A{tuple(a.shape)} B{tuple(b.shape)}"
                    )
                a.copy_(delta.a.to(device=a.device, dtype=a.dtype))
                b.copy_(delta.b.to(device=b.device, dtype=b.dtype))
        self._discard_gradients()
        self._optimizer = None

    def save(self, directory: Path) -> None:
        """Write the adapter in PEFT format (loadable by PEFT and vLLM) plus the optimizer, step and RNG state.

        Gradients accumulated since the last ``optim_step`` are not saved. The trainer state file is written last
        and atomically, so its presence marks a complete checkpoint.
        """
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        self.peft_model.save_pretrained(str(directory), save_embedding_layers=False)
        state = {
            "format": _STATE_FORMAT,
            "step": self.step,
            "optimizer": self._optimizer.state_dict() if self._optimizer is not None else None,
            "rng": [g.get_state() for g in self._generators],
            "target_modules": list(self.target_modules),
            "rank": self.lora.rank,
            "alpha": self.lora.alpha,
        }
        tmp = directory / (TRAINER_STATE_FILE + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, directory / TRAINER_STATE_FILE)

    def load(self, directory: Path) -> None:
        """Restore a checkpoint written by :meth:`save`; pending gradients are dropped."""
        directory = Path(directory)
        state_file = directory / TRAINER_STATE_FILE
        if not state_file.is_file():
            raise FileNotFoundError(f"no trainer checkpoint in {directory} (missing {TRAINER_STATE_FILE})")
        state = torch.load(state_file, map_location="cpu", weights_only=True)
        if state.get("format") != _STATE_FORMAT:
            raise ValueError(f"{state_file} has format {state.get('format')!r}; this version reads {_STATE_FORMAT}")
        n_rng, n_ours = len(state["rng"]), len(self._generators)
        if n_rng != n_ours:
            raise ValueError(f"{state_file} holds {n_rng} RNG states, this trainer has {n_ours} (other devices?)")
        self._check_adapter_config(directory)
        self._load_adapter_weights(directory / ADAPTER_WEIGHTS_FILE)

        self._discard_gradients()
        if state["optimizer"] is None:
            self._optimizer = None
        else:
            self._ensure_optimizer().load_state_dict(state["optimizer"])
        for generator, rng_state in zip(self._generators, state["rng"], strict=True):
            generator.set_state(rng_state)
        self.step = int(state["step"])

    # ------------------------------------------------------------------ several adapters on one model

    def park(self) -> ParkedTrainer:
        """Everything that makes this trainer one adapter's and not another's, taken out of it: the LoRA weights
        (clones), the optimizer with its moments, the step count and the dropout generators' states. Pending
        gradients are dropped. :meth:`unpark` puts it (or another adapter's) back."""
        self._discard_gradients()
        parked = ParkedTrainer(
            weights=[param.detach().clone() for param in self._lora_params],
            optimizer=self._optimizer,
            step=self.step,
            rng=[g.get_state() for g in self._generators],
        )
        self._optimizer = None
        return parked

    def unpark(self, parked: ParkedTrainer) -> None:
        """Hold ``parked``'s adapter: its weights, optimizer, step and generators (see :meth:`park`)."""
        if len(parked.weights) != len(self._lora_params):
            ours = len(self._lora_params)
            raise ValueError(f"parked state holds {len(parked.weights)} tensors, this trainer has {ours}")
        self._discard_gradients()
        with torch.no_grad():
            for param, value in zip(self._lora_params, parked.weights, strict=True):
                param.copy_(value)
        self._optimizer = parked.optimizer
        self.step = parked.step
        for generator, rng_state in zip(self._generators, parked.rng, strict=True):
            generator.set_state(rng_state)

    def save_parked(self, parked: ParkedTrainer, path: Path) -> None:
        """Write a parked state to one file (an adapter moved out of memory), atomically."""
        state = {
            "weights": parked.weights,
            "optimizer": parked.optimizer.state_dict() if parked.optimizer is not None else None,
            "step": parked.step,
            "rng": parked.rng,
        }
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)

    def load_parked(self, path: Path) -> ParkedTrainer:
        """A parked state written by :meth:`save_parked`; its optimizer is rebuilt over this trainer's parameters."""
        state = torch.load(path, map_location="cpu", weights_only=True)
        optimizer = None
        if state["optimizer"] is not None:
            previous, self._optimizer = self._optimizer, None
            optimizer = self._ensure_optimizer()  # a new AdamW over the same parameters, then its saved moments
            optimizer.load_state_dict(state["optimizer"])
            self._optimizer = previous
        weights = [w.to(param.device) for w, param in zip(state["weights"], self._lora_params, strict=True)]
        return ParkedTrainer(weights=weights, optimizer=optimizer, step=int(state["step"]), rng=list(state["rng"]))

    # ------------------------------------------------------------------ internals

    def _collect_lora_layers(self) -> dict[str, LoraLayer]:
        layers = {name: m for name, m in self._model.named_modules() if isinstance(m, LoraLayer)}
        if sorted(layers) != sorted(self._target_paths):
            # PEFT's matching also sees non-linear modules; refuse rather than train something unexpected.
            raise ValueError(
                f"PEFT adapted {sorted(layers)} but the linear layers named by {self.target_modules} are "
                f"{sorted(self._target_paths)}; use more specific LoRA target names"
            )
        return layers

    def _freeze_all_but_lora(self) -> list[nn.Parameter]:
        trainable = {id(p) for layer in self._lora_layers.values() for p in _adapter_params(layer)}
        params: list[nn.Parameter] = []
        for _, param in self.peft_model.named_parameters():
            is_lora = id(param) in trainable
            param.requires_grad_(is_lora)  # base tensors are shared with the served model: frozen for both
            if is_lora:
                params.append(param)
        return params

    def _install_seeded_dropout(self, seed: int) -> list[torch.Generator]:
        """Swap PEFT's dropout modules for ones fed by a private generator per device (ordered by device)."""
        generators: dict[str, torch.Generator] = {}
        devices = sorted({str(p.device) for p in self._lora_params})
        for offset, device in enumerate(devices):
            generators[device] = torch.Generator(device=device)
            generators[device].manual_seed(seed + 1 + offset)
        for layer in self._lora_layers.values():
            device = str(layer.lora_A[ADAPTER_NAME].weight.device)
            layer.lora_dropout[ADAPTER_NAME] = SeededLoraDropout(self.lora.dropout, generators[device])
        return [generators[d] for d in devices]

    def _prepare(self, index: int, datum: Datum, needed: tuple[str, ...]) -> _PreparedDatum:
        where = f"datum {index}"
        n = len(datum.model_input)
        if n == 0:
            raise ValueError(f"{where}: model_input is empty")
        if self._max_positions is not None and n > self._max_positions:
            raise ValueError(f"{where}: {n} tokens exceed the model's {self._max_positions} positions")
        inputs = datum.loss_fn_inputs
        unknown = sorted(set(inputs) - _KNOWN_INPUTS)
        if unknown:
            raise ValueError(f"{where}: unknown loss_fn_inputs {unknown}; known are {sorted(_KNOWN_INPUTS)}")
        missing = [key for key in needed if key not in inputs]
        if missing:
            raise ValueError(f"{where}: the loss needs loss_fn_inputs {missing}")
        for key, values in inputs.items():
            if len(values) != n:
                raise ValueError(f"{where}: loss_fn_inputs[{key!r}] has {len(values)} entries, model_input has {n}")

        input_ids = _token_ids(datum.model_input, self._input_vocab, f"{where} model_input")
        targets = _token_ids(inputs["target_tokens"], self._output_vocab, f"{where} target_tokens")
        weights = _floats(inputs.get("weights"), f"{where} weights", allow_neg_inf=False)
        return _PreparedDatum(
            index=index,
            input_ids=input_ids,
            targets=targets,
            weights=weights if weights is not None else torch.ones(n, dtype=torch.float32),
            # A sampler logprob of -inf is a legitimate "could not have been sampled"; the loss clamps it.
            sampler_logprobs=_floats(inputs.get("logprobs"), f"{where} logprobs", allow_neg_inf=True),
            advantages=_floats(inputs.get("advantages"), f"{where} advantages", allow_neg_inf=False),
        )

    def _micro_batches(self, prepared: list[_PreparedDatum]) -> Iterator[list[_PreparedDatum]]:
        # Longest first, so each batch pads little; the order does not matter to a summed loss.
        batch: list[_PreparedDatum] = []
        for item in sorted(prepared, key=lambda p: p.length, reverse=True):
            padded_len = batch[0].length if batch else item.length
            if batch and (len(batch) + 1) * padded_len > self.max_batch_tokens:
                yield batch
                batch = []
            batch.append(item)
        if batch:
            yield batch

    def _learner_logprobs(self, batch: list[_PreparedDatum]) -> list[torch.Tensor]:
        """Teacher-forced float32 logprobs of each datum's targets, right-padded into one forward pass.

        Unless ``every_position``, positions before :func:`_first_scored` are not scored (NaN): the output layer
        over the whole vocabulary, its log-softmax and their backward at every prompt position, where the weight is
        0, made a SmolLM2 step (8 datums of 300 prompt + 40 completion tokens) 1.41x slower
        (``bench/output_layer.py``); the loss and gradients are the same, as tests/test_trainer.py checks."""
        length = max(p.length for p in batch)
        first = 0 if self.every_position else _first_scored(batch)
        input_ids = torch.zeros(len(batch), length, dtype=torch.long)
        targets = torch.zeros(len(batch), length, dtype=torch.long)
        attention = torch.zeros(len(batch), length, dtype=torch.long)
        for row, p in enumerate(batch):
            input_ids[row, : p.length] = p.input_ids
            targets[row, : p.length] = p.targets
            attention[row, : p.length] = 1
        output = self.peft_model(
            input_ids=input_ids.to(self._device),
            attention_mask=attention.to(self._device),
            use_cache=False,
            logits_to_keep=length - first,
        )
        logits = output.logits
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        picked = logprobs.gather(-1, targets[:, first:].to(logits.device).unsqueeze(-1)).squeeze(-1)
        if first:
            unscored = torch.full((len(batch), first), math.nan, dtype=picked.dtype, device=picked.device)
            picked = torch.cat([unscored, picked], dim=1)
        return [picked[row, : p.length] for row, p in enumerate(batch)]

    def _cat(self, parts: Iterator[torch.Tensor | None]) -> torch.Tensor:
        tensors = [t for t in parts if t is not None]
        return torch.cat(tensors).to(self._loss_device())

    def _loss_device(self) -> torch.device:
        output = self._model.get_output_embeddings()
        return output.weight.device if output is not None else self._device

    def _ensure_optimizer(self) -> torch.optim.AdamW:
        if self._optimizer is None:
            defaults = AdamParams()
            self._optimizer = torch.optim.AdamW(
                self._lora_params,
                lr=defaults.learning_rate,
                betas=(defaults.beta1, defaults.beta2),
                eps=defaults.eps,
                weight_decay=defaults.weight_decay,
            )
        return self._optimizer

    def _discard_gradients(self) -> None:
        for param in self._lora_params:
            param.grad = None
        self._grad_pending = False

    def _check_adapter_config(self, directory: Path) -> None:
        config_file = directory / ADAPTER_CONFIG_FILE
        if not config_file.is_file():
            raise FileNotFoundError(f"no adapter in {directory} (missing {ADAPTER_CONFIG_FILE})")
        saved = json.loads(config_file.read_text())
        ours = {"r": self.lora.rank, "lora_alpha": self.lora.alpha, "target_modules": sorted(self.target_modules)}
        theirs = {
            "r": saved.get("r"),
            "lora_alpha": saved.get("lora_alpha"),
            "target_modules": sorted(saved.get("target_modules") or []),
        }
        if ours != theirs:
            raise ValueError(f"adapter in {directory} was trained with {theirs}, this trainer uses {ours}")

    def _load_adapter_weights(self, weights_file: Path) -> None:
        saved = load_file(str(weights_file), device=str(self._device))
        expected = get_peft_model_state_dict(self.peft_model, adapter_name=ADAPTER_NAME)
        if set(saved) != set(expected):
            missing = sorted(set(expected) - set(saved))[:3]
            extra = sorted(set(saved) - set(expected))[:3]
            raise ValueError(f"{weights_file} does not fit this model: missing {missing}, unexpected {extra}")
        for key, tensor in saved.items():
            if tensor.shape != expected[key].shape:
                raise ValueError(
                    f"{weights_file}: {key} has shape {tuple(tensor.shape)}, expected {expected[key].shape}"
                )
        with torch.no_grad():
            set_peft_model_state_dict(self.peft_model, saved, adapter_name=ADAPTER_NAME)


@dataclass
class ParkedTrainer:
    """One adapter's trainer state while another adapter's is in the model (:meth:`LoraTrainer.park`)."""

    weights: list[torch.Tensor]  # the LoRA parameters, in the trainer's parameter order
    optimizer: torch.optim.AdamW | None  # built over the trainer's parameters; its moments are this adapter's
    step: int
    rng: list[torch.Tensor]


def _adapter_params(layer: LoraLayer) -> list[nn.Parameter]:
    return [cast(nn.Parameter, module[ADAPTER_NAME].weight) for module in (layer.lora_A, layer.lora_B)]


def _token_ids(values: Sequence[float], vocab: int, what: str) -> torch.Tensor:
    as_float = torch.tensor(values, dtype=torch.float64)
    if not torch.isfinite(as_float).all() or not torch.equal(as_float, as_float.round()):
        raise ValueError(f"{what}: token ids must be whole numbers")
    low, high = int(as_float.min()), int(as_float.max())
    if low < 0 or high >= vocab:
        raise ValueError(f"{what}: token ids must lie in [0, {vocab}), got range [{low}, {high}]")
    return as_float.long()


def _floats(values: Sequence[float] | None, what: str, *, allow_neg_inf: bool) -> torch.Tensor | None:
    if values is None:
        return None
    tensor = torch.tensor(values, dtype=torch.float32)
    bad = torch.isnan(tensor) | (tensor == math.inf)
    if not allow_neg_inf:
        bad |= tensor == -math.inf
    if bad.any():
        raise ValueError(f"{what}: non-finite value at position {int(bad.nonzero()[0])}")
    return tensor


def _validate_adam(adam: AdamParams) -> None:
    if not (math.isfinite(adam.learning_rate) and adam.learning_rate >= 0):
        raise ValueError(f"learning_rate must be finite and >= 0, got {adam.learning_rate}")
    for name, beta in (("beta1", adam.beta1), ("beta2", adam.beta2)):
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"{name} must be in [0, 1), got {beta}")
    if not adam.eps > 0:
        raise ValueError(f"eps must be > 0, got {adam.eps}")
    if adam.weight_decay < 0:
        raise ValueError(f"weight_decay must be >= 0, got {adam.weight_decay}")
    if adam.grad_clip_norm < 0:
        raise ValueError(f"grad_clip_norm must be >= 0 (0 = off), got {adam.grad_clip_norm}")
