"""The promotion gate (``train.promotion_gate = true``): a newly trained version serves only if it does not regress.

After each training step the trainer hands its new weights to :meth:`PromotionGate.publish` instead of
``backend.publish``. The gate *stages* them (a servable version number that requests can pin, but not the one that
serves), replays held-out prompts on both the served version and the candidate with
:func:`openclaw_cli.learn.evaluation.evaluate` (greedy replies, position-balanced pairwise judging by the run's judge),
and promotes the candidate (``backend.activate``) only when its win rate over the served version is at least
``0.5 - train.gate_margin``. Otherwise the served version keeps serving and the candidate stays staged: it can
still be served on purpose with ``openclaw rollback --to N``.

Held-out prompts: the newest main-line turn of each of the newest ``train.gate_sessions`` sessions among turns the
trainer has not trained on (so the candidate never saw the reply being replaced), replayed from their stored
messages. No held-out prompt, no judged pair, or a failed evaluation holds the candidate back (fail closed), and a
rollback during the evaluation wins over it. Every decision is logged and kept for ``/v1/openclaw/status``.

Training is not rewound when a candidate is held back: the trainer keeps its weights and the next step's candidate
is gated against the served version again. The evaluation runs inside the trainer's step, so training waits for it
(serving does not: replies keep coming from the served version, sharing the machine with the evaluation's samples).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from openclaw_cli.adapters import SHARED_ADAPTER, trainer_consumer
from openclaw_cli.backend import supports_version_control
from openclaw_cli.learn.collapse_guard import CollapseGuard
from openclaw_cli.learn.evaluation import EvalError, EvalItem, EvalOptions, PolicyChoice, evaluate

if TYPE_CHECKING:
    from openclaw_cli.backend import Backend
    from openclaw_cli.learn.evaluation import JudgeClient
    from openclaw_cli.settings import Settings
    from openclaw_cli.store import Store
    from openclaw_cli.types import PolicyVersion

log = logging.getLogger("openclaw.promotion")

KEEP_DECISIONS = 20
_CANDIDATES_PER_SESSION = 4  # newest turns fetched per wanted session before keeping one per session


class GateConfigError(ValueError):
    """The promotion gate cannot run with this backend (the message says why and what to do)."""


@dataclass
class GateDecision:
    candidate: int
    served: int
    promoted: bool
    reason: str
    threshold: float
    win_rate: float | None = None  # the candidate's, over the served version (ties count half)
    pairs_judged: int = 0
    n: int = 0
    mean_score_served: float | None = None
    mean_score_candidate: float | None = None
    at: float = 0.0
    duration_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def held_out_items(store: Store, sessions: int, adapter: str = SHARED_ADAPTER) -> list[EvalItem]:
    """Prompts of the newest main-line turn ``adapter``'s trainer has not trained, of each of the newest
    ``sessions`` sessions that adapter served, newest first: an owner's adapter is judged on that owner's own
    conversations, never on anyone else's."""
    items: list[EvalItem] = []
    seen: set[str] = set()
    limit = sessions * _CANDIDATES_PER_SESSION
    for turn in store.latest_turns(limit, not_done_by=trainer_consumer(adapter), adapter=adapter):
        if turn.session_id in seen or not turn.messages:
            continue
        seen.add(turn.session_id)
        items.append(EvalItem(messages=turn.messages, tools=turn.tools, source=f"turn:{turn.id}"))
        if len(items) == sessions:
            break
    return items


def require_gate_support(backend: Backend) -> None:
    """Refuse, before anything slow happens, a backend the gate cannot work with."""
    if not supports_version_control(backend):
        raise GateConfigError(
            f"train.promotion_gate needs a backend that can stage a version without serving it and switch "
            f"versions later; backend {backend.name!r} cannot. Set train.promotion_gate = false or use the "
            "local backend"
        )


class PromotionGate:
    """Stage -> evaluate against the served version -> activate or hold (see the module docstring)."""

    def __init__(
        self,
        store: Store,
        backend: Backend,
        judge: JudgeClient,
        settings: Settings,
        *,
        options: EvalOptions | None = None,
        evaluate: bool = True,
        guard: CollapseGuard | None = None,
        adapter: str = SHARED_ADAPTER,
    ) -> None:
        """``backend`` is the backend as ``adapter`` sees it (its versions are that adapter's own)."""
        require_gate_support(backend)
        self.adapter = adapter
        self.evaluate = evaluate  # the win-rate evaluation (train.promotion_gate); without it only the guard runs
        self.guard = guard
        self.store = store
        self.backend = backend
        self.judge = judge
        self.sessions = settings.train.gate_sessions
        self.threshold = 0.5 - settings.train.gate_margin
        self.options = options or EvalOptions(max_tokens=settings.train.gate_max_tokens, seed=settings.local.seed)
        self.decisions: deque[GateDecision] = deque(maxlen=KEEP_DECISIONS)
        self.promoted = 0
        self.held = 0
        self.evaluating: int | None = None  # candidate version under evaluation right now
        self._last_publish: dict[str, Any] | None = None

    async def publish(self, name: str) -> PolicyVersion:
        """The trainer's publish hook: returns the version serving afterwards (the candidate only if promoted)."""
        backend: Any = self.backend
        served = backend.current_version()
        self._last_publish = None
        candidate = await backend.stage(name)
        if candidate.version == served.version:
            # Nothing new was trained (e.g. Fireworks batch mode between SFT jobs): no judge calls on a self-match.
            return served
        self.evaluating = candidate.version
        try:
            decision = await self._guard_then_decide(candidate.version, served.version)
            if decision.promoted and backend.current_version().version != served.version:
                decision.promoted = False
                decision.reason = "serving changed during the evaluation (a rollback?); candidate not promoted"
            outcome = await backend.activate(candidate.version) if decision.promoted else backend.current_version()
        finally:
            self.evaluating = None
        self.decisions.append(decision)
        self._last_publish = self._summary(decision)
        if decision.promoted:
            self.promoted += 1
            log.info("promoted version %d over %d: %s", decision.candidate, decision.served, decision.reason)
        else:
            self.held += 1
            log.warning(
                "version %d held back, version %d keeps serving: %s",
                decision.candidate,
                decision.served,
                decision.reason,
            )
        return outcome

    async def _guard_then_decide(self, candidate: int, served: int) -> GateDecision:
        """The collapse guard first (a collapsed version also rewinds training), then the win-rate evaluation."""
        if self.guard is not None:
            checked = await self.guard.check(candidate)
            if not checked.ok:
                backend: Any = self.backend
                try:
                    await backend.activate(served, train_from=True)
                except Exception:
                    log.exception("could not rewind training to version %d after a collapse", served)
                return GateDecision(
                    candidate=candidate,
                    served=served,
                    promoted=False,
                    reason=f"collapse guard: {checked.reason}; training rewound to version {served}",
                    threshold=self.threshold,
                    at=time.time(),
                )
        if not self.evaluate:
            return GateDecision(
                candidate, served, promoted=True, reason="collapse guard passed", threshold=self.threshold
            )
        return await self.decide(candidate, served)

    async def decide(self, candidate: int, served: int) -> GateDecision:
        """Evaluate ``candidate`` against ``served`` (both servable) on held-out prompts; never raises."""
        started = time.time()
        decision = GateDecision(candidate=candidate, served=served, promoted=False, reason="", threshold=self.threshold)
        try:
            items = held_out_items(self.store, self.sessions, self.adapter)
            if not items:
                decision.reason = "no held-out sessions to evaluate on yet"
            else:
                report = await evaluate(
                    self.backend,
                    self.judge,
                    items,
                    PolicyChoice("served", served),
                    PolicyChoice("candidate", candidate),
                    self.options,
                )
                decision.n = report.n
                decision.pairs_judged = report.pairs_judged
                decision.win_rate = report.win_rate_b
                decision.mean_score_served = report.mean_score_a
                decision.mean_score_candidate = report.mean_score_b
                if report.win_rate_b is None:
                    decision.reason = "the judge gave no valid comparison"
                elif report.win_rate_b >= self.threshold:
                    decision.promoted = True
                    decision.reason = f"no regression: win rate {report.win_rate_b:.3f} >= {self.threshold:.3f}"
                else:
                    decision.reason = f"regression: win rate {report.win_rate_b:.3f} < {self.threshold:.3f}"
        except EvalError as exc:
            decision.reason = f"evaluation failed: {exc}"
        except Exception as exc:  # a gate bug or a backend failure must hold the candidate, not end training
            log.exception("promotion gate evaluation of version %d failed", candidate)
            decision.reason = f"evaluation failed: {type(exc).__name__}: {exc}"
        decision.at = time.time()
        decision.duration_s = round(decision.at - started, 3)
        return decision

    def last_publish(self) -> dict[str, Any] | None:
        """What the latest publish decided, for the trainer's step row (None when it evaluated nothing)."""
        return self._last_publish

    def _summary(self, decision: GateDecision) -> dict[str, Any]:
        # The guard, when on, checks every candidate before the evaluation: its last result is this candidate's.
        checked = self.guard.last if self.guard is not None else None
        return {
            "promoted": decision.promoted,
            "win_rate": decision.win_rate,
            "pairs_judged": decision.pairs_judged,
            "guard_ok": checked.ok if checked is not None else None,
            "kl_base": checked.kl if checked is not None else None,
            "distinct_min": min(checked.distinct) if checked is not None and checked.distinct else None,
            "reason": decision.reason,
        }

    def status(self) -> dict[str, Any]:
        return {
            "enabled": self.evaluate,
            "collapse_guard": self.guard.status() if self.guard is not None else {"enabled": False},
            "promoted": self.promoted,
            "held": self.held,
            "evaluating": self.evaluating,
            "threshold": self.threshold,
            "last": self.decisions[-1].to_json() if self.decisions else None,
        }


def make_publisher(
    store: Store, backend: Backend, judge: JudgeClient, settings: Settings, *, adapter: str = SHARED_ADAPTER
) -> PromotionGate | None:
    """The gate ``adapter``'s trainer publishes through (``backend`` as that adapter sees it): the collapse guard
    and/or the win-rate evaluation as configured, or None for a plain ``backend.publish`` (neither is on, or only
    the guard is and the backend cannot stage)."""
    train = settings.train
    if not (train.promotion_gate or train.collapse_guard):
        return None
    if not train.promotion_gate and not supports_version_control(backend):
        log.warning("backend %r cannot stage versions: the collapse guard is off", backend.name)
        return None
    guard = CollapseGuard(backend, settings) if train.collapse_guard else None
    return PromotionGate(store, backend, judge, settings, evaluate=train.promotion_gate, guard=guard, adapter=adapter)
