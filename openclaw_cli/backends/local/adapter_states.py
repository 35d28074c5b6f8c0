"""Many adapters trained on one PEFT model: whose state the model holds, and where the others wait.

With ``lora.scope = "owner"`` every owner (or group) has an adapter of its own, but the local backend keeps ONE
trainer (one PEFT model sharing the base weights). Before a training call for adapter X the trainer is made to hold
X: the adapter it held is *parked* (LoRA weights, AdamW and its moments, step count, dropout generators) and X's
parked state is put back, or a fresh one (the untrained adapter: the base model, step 0) the first time. Parked
states stay in memory for the ``lora.resident_adapters`` most recently trained adapters; older ones go to a file
under the adapter's state directory and come back from it when next trained, so a thousand owners cost disk, not
memory. An owner who never trains costs nothing.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from openclaw_cli.adapters import SHARED_ADAPTER
from openclaw_cli.backends.local.trainer import LoraTrainer, ParkedTrainer

log = logging.getLogger("openclaw.local")

PARKED_FILE = "parked-trainer.pt"


class AdapterStates:
    """Swaps adapters' trainer states in and out of one :class:`LoraTrainer` (call under the backend's training
    lock, off the event loop: parking copies every LoRA tensor)."""

    def __init__(self, trainer: LoraTrainer, *, resident: int, directory_of: Callable[[str], Path]) -> None:
        if resident < 1:
            raise ValueError(f"resident must be >= 1, got {resident}")
        self._trainer = trainer
        self._resident = resident
        self._directory_of = directory_of
        self._fresh = trainer.park()  # the untrained adapter (the trainer is new) every new owner starts from
        trainer.unpark(_copy(self._fresh))
        self.holding = SHARED_ADAPTER
        self._parked: OrderedDict[str, ParkedTrainer] = OrderedDict()  # least recently held first

    def hold(self, adapter: str) -> None:
        """Make the trainer hold ``adapter``'s state (pending gradients of the adapter it held are dropped)."""
        if adapter == self.holding:
            return
        self._parked[self.holding] = self._trainer.park()
        self._parked.move_to_end(self.holding)
        state = self._parked.pop(adapter, None)
        if state is None:
            state = self._from_disk(adapter)
        self._trainer.unpark(state if state is not None else _copy(self._fresh))
        self.holding = adapter
        self._spill()

    @property
    def in_memory(self) -> int:
        """Adapters whose trainer state is in memory (the one held included)."""
        return len(self._parked) + 1

    def _spill(self) -> None:
        while len(self._parked) + 1 > self._resident:
            adapter, state = self._parked.popitem(last=False)
            directory = self._directory_of(adapter)
            directory.mkdir(parents=True, exist_ok=True)
            self._trainer.save_parked(state, directory / PARKED_FILE)
            log.debug("adapter %s's trainer state moved to %s", adapter, directory)

    def _from_disk(self, adapter: str) -> ParkedTrainer | None:
        path = self._directory_of(adapter) / PARKED_FILE
        if not path.is_file():
            return None
        state = self._trainer.load_parked(path)
        path.unlink()  # the state is in memory again and will change; a stale file must never come back
        return state


def _copy(parked: ParkedTrainer) -> ParkedTrainer:
    """A fresh adapter's state that shares nothing with the template (its optimizer is built on first step)."""
    return ParkedTrainer(
        weights=[w.clone() for w in parked.weights], optimizer=None, step=0, rng=[r.clone() for r in parked.rng]
    )
