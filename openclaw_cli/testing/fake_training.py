"""TEST DOUBLE: a :class:`~openclaw_cli.testing.fake_backend.FakeBackend` whose training calls succeed instantly.

For tests and benches of the loops around a backend (runtime, trainer loop, promotion gate, soak) where what the
model learns does not matter: ``forward_backward`` reports a made-up loss (the mean advantage over trained tokens)
and counts tokens, ``optim_step`` counts steps, ``publish``/``stage`` hand out version numbers, checkpoints are small
JSON files under ``state_dir`` in the layout the trainer loop looks for, and ``compute_logprobs`` returns the same
made-up numbers the sampler reports. ``reply_for_version`` makes the reply text depend on the version that answers
(e.g. to script a judge that prefers one version). Calls are kept in a bounded deque, so a long soak stays small.
Never register it as a real backend.
"""

from __future__ import annotations

import asyncio
import json
from collections import deque
from collections.abc import Callable, Iterable
from pathlib import Path

from openclaw_cli.backend import BackendError, ChatTokenizer, none_before
from openclaw_cli.testing.fake_backend import FakeBackend, ScriptedReply, fake_logprob
from openclaw_cli.types import AdamParams, Datum, FwdBwdResult, LossName, PolicyVersion, StepResult

STATE_FILE = "openclaw-state.json"  # what the trainer loop's list_checkpoints looks for


class FakeTrainingBackend(FakeBackend):
    name = "fake-training"

    def __init__(
        self,
        tokenizer: ChatTokenizer,
        replies: Iterable[str | ScriptedReply] = (),
        *,
        state_dir: Path,
        reply_for_version: Callable[[int], str] | None = None,
        step_delay_s: float = 0.0,
        max_calls: int = 1000,
        **kwargs: float | int | str,
    ) -> None:
        super().__init__(tokenizer, replies, **kwargs)  # type: ignore[arg-type]
        self.calls = deque(maxlen=max_calls)  # type: ignore[assignment]
        self.state_dir = Path(state_dir)
        self.reply_for_version = reply_for_version
        self.step_delay_s = step_delay_s
        self.steps = 0
        self.trained_tokens = 0
        self._grads = 0

    def _next_reply(self, version: int) -> ScriptedReply:
        if self.reply_for_version is not None and not self._replies:
            return ScriptedReply(self.reply_for_version(version))
        return super()._next_reply(version)

    async def compute_logprobs(self, tokens: list[int], *, base: bool = False, start: int = 1) -> list[float | None]:
        return none_before([None, *(fake_logprob(i) for i in range(len(tokens) - 1))], start)

    async def forward_backward(
        self, datums: list[Datum], loss: LossName, loss_config: dict[str, float] | None = None
    ) -> FwdBwdResult:
        if self.step_delay_s > 0:
            await asyncio.sleep(self.step_delay_s)
        advantages: list[float] = []
        for datum in datums:
            n = len(datum.model_input)
            weights = datum.loss_fn_inputs.get("weights", [1.0] * n)
            values = datum.loss_fn_inputs.get("advantages", [0.0] * n)
            advantages += [a for w, a in zip(weights, values, strict=True) if w > 0]
        self._grads += 1
        self.trained_tokens += len(advantages)
        mean_advantage = sum(advantages) / len(advantages) if advantages else 0.0
        return FwdBwdResult(loss=-mean_advantage, metrics={"n_tokens": float(len(advantages))}, logprobs=[])

    async def discard_gradients(self) -> None:
        self._grads = 0

    async def optim_step(self, adam: AdamParams) -> StepResult:
        if self._grads == 0:
            raise BackendError("optim_step without accumulated gradients")
        self._grads = 0
        self.steps += 1
        return StepResult(self.steps, {"grad_norm": 0.0})

    async def save_state(self, name: str) -> str:
        path = self.state_dir / name
        path.mkdir(parents=True, exist_ok=True)
        state = {"version": self.current_version().version, "steps": self.steps}
        (path / STATE_FILE).write_text(json.dumps(state))
        return str(path)

    async def load_state(self, path: str) -> PolicyVersion:
        state = json.loads((Path(path) / STATE_FILE).read_text())
        self.steps = int(state["steps"])
        return await self.publish(Path(path).name)
