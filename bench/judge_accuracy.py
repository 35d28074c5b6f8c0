"""How well does a judge tell satisfied next states from corrections? Per readout mode, side by side.

    python bench/judge_accuracy.py [--model smollm2|PATH] [--modes channel logprob vote]

The policy judges itself (as ``openclaw launch`` does with no judge model) on the labelled set
``tests/data/judge_next_states.jsonl``: 84 steps (an assistant reply and what came next), 37 where the user or a tool
shows the reply worked (+1), 37 corrections, complaints or tool errors (-1), 10 neutral follow-ups (0; a question
about something else, "Hmm, ok.", an empty tool output). For each mode the script runs
:meth:`openclaw_cli.learn.judge.JudgeLoop.judge_turn` on every step and prints: the share of valid verdicts (a readout
that produced a verdict at all; vote mode can fail to parse), the AUC of the log-odds (or vote) on the +-1 steps,
the accuracy of its sign (margin 0) on them, how many +-1 steps get a non-zero reward at ``judge.margin`` and how
many of those are right, how many neutral steps are masked (reward 0), and seconds per verdict. It chose the
defaults ``judge.mode = auto`` (channel for the policy judge) and ``judge.margin = 1.0``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

LABELLED = Path(__file__).resolve().parents[1] / "tests" / "data" / "judge_next_states.jsonl"


def load_items(path: Path = LABELLED) -> list[dict[str, Any]]:
    """The labelled steps: question, reply, next_state, role (user | tool), label (+1, -1, 0)."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def auc(pairs: list[tuple[int, float]]) -> float:
    pos = [s for label, s in pairs if label > 0]
    neg = [s for label, s in pairs if label < 0]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


async def main_async(args: argparse.Namespace) -> int:
    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.learn.judge import JudgeLoop, PolicyJudgeClient
    from openclaw_cli.settings import Settings

    settings = Settings(model=None if args.model == "smollm2" else args.model)
    backend = LocalBackend(settings)
    await backend.start()
    client = PolicyJudgeClient(backend)
    items = load_items()
    print(f"judge: {client.name} on {settings.model or 'embedded SmolLM2-135M-Instruct'}; {len(items)} labelled steps")
    print(f"{'mode':>8}{'valid':>7}{'AUC':>7}{'acc@0':>8}{'scored':>8}{'right':>7}{'neutral 0':>11}{'s/verdict':>11}")
    for mode in args.modes:
        mode_settings = settings.model_copy(
            update={"judge": settings.judge.model_copy(update={"mode": mode, "votes": 1})}
        )
        loop = JudgeLoop(None, client, mode_settings, max_tokens=args.vote_tokens)  # type: ignore[arg-type]
        pairs: list[tuple[int, float]] = []
        scored = right = valid = neutral_masked = 0
        started = time.perf_counter()
        for item in items:
            label = int(item["label"])
            turn: Any = SimpleNamespace(
                messages=[{"role": "user", "content": item["question"]}],
                assistant_message={"role": "assistant", "content": item["reply"]},
                next_state=[{"role": item["role"], "content": item["next_state"]}],
                next_state_role=item["role"],
            )
            verdict = await loop.judge_turn(turn)
            # A verdict: a readout value (channel / logprob), or at least one parsed vote.
            valid += verdict.log_odds is not None or any(v is not None for v in verdict.votes)
            if label == 0:
                neutral_masked += verdict.score == 0
                continue
            value = verdict.log_odds if verdict.log_odds is not None else float(verdict.score)
            pairs.append((label, value))
            if verdict.score != 0:
                scored += 1
                right += (verdict.score > 0) == (label > 0)
        per_verdict = (time.perf_counter() - started) / len(items)
        accuracy = sum((v > 0) == (label > 0) for label, v in pairs) / len(pairs)
        neutral = sum(1 for item in items if int(item["label"]) == 0)
        print(
            f"{mode:>8}{valid / len(items):>7.2f}{auc(pairs):>7.2f}{accuracy:>8.2f}{scored:>8}{right:>7}"
            f"{f'{neutral_masked}/{neutral}':>11}{per_verdict:>11.2f}"
        )
    await backend.close()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--modes", nargs="+", default=["channel", "logprob"], choices=["channel", "logprob", "vote"])
    parser.add_argument("--vote-tokens", type=int, default=256, help="vote mode: judge reply budget")
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
