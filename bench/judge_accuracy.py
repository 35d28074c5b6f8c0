"""How well does a judge tell satisfied next states from corrections? AUC and accuracy per readout mode.

    python bench/judge_accuracy.py [--model smollm2|PATH] [--modes channel logprob vote]

The policy judges itself (as ``openclaw launch`` does with no judge model) on :data:`ITEMS`: 24 hand-labelled steps
(an assistant reply and its next state: 12 where the user or tool shows the reply worked, 12 corrections or errors,
user and tool next states both). For each mode the script runs :meth:`openclaw_cli.judge.JudgeLoop.judge_turn` and
prints the AUC of the log-odds (or vote) against the labels, the accuracy of the sign at margin 0, how many turns
get a non-zero reward at ``judge.margin`` and how many of those are right, and the time per turn. It chose the
defaults ``judge.mode = auto`` (channel for the policy judge) and ``judge.margin = 1.0``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

LONG = (
    "The sky appears blue because of a phenomenon called Rayleigh scattering, in which the molecules of "
    "the atmosphere scatter shorter wavelengths of sunlight, such as blue and violet, much more strongly "
    "than the longer red wavelengths, so that when we look up we see blue light coming from every "
    "direction."
)
SHORT = "Rayleigh scattering of sunlight makes the sky look blue."
ITEMS = [
    ("Why is the sky blue?", LONG, "No, that is far too long. Answer in one short sentence, please.", "user", -1),
    ("Why is the sky blue?", SHORT, "Thanks, short and clear. Next question: What is DNA?", "user", 1),
    (
        "What is the capital of France?",
        "The capital of France is Paris.",
        "Thanks, short and clear. Next question: How do airplanes fly?",
        "user",
        1,
    ),
    (
        "What is the capital of France?",
        (
            "France is a country in Western Europe with a long history, known for its art, cuisine, wine and "
            "culture, and it borders Spain, Italy, Germany, Belgium and Switzerland."
        ),
        "No, that does not answer my question. Try again.",
        "user",
        -1,
    ),
    (
        "Who wrote Romeo and Juliet?",
        "Romeo and Juliet was written by William Shakespeare.",
        "Great, thank you! Now, who painted the Mona Lisa?",
        "user",
        1,
    ),
    (
        "Who wrote Romeo and Juliet?",
        "It was written by Charles Dickens.",
        "That's wrong. It was Shakespeare.",
        "user",
        -1,
    ),
    (
        "Write a python function to add two numbers.",
        "def add(a, b):\n    return a + b",
        "Perfect, that works.",
        "user",
        1,
    ),
    (
        "Write a python function to add two numbers.",
        "def add(a, b):\n    return a - b",
        "This subtracts instead of adding. Fix it.",
        "user",
        -1,
    ),
    ("How many legs does a spider have?", "A spider has eight legs.", "ok cool. what about insects?", "user", 1),
    (
        "How many legs does a spider have?",
        (
            "Spiders are arachnids. They are found all over the world and have many interesting features, "
            "including silk glands, fangs and venom, and they play an important role in ecosystems."
        ),
        "Too long, I only wanted the number.",
        "user",
        -1,
    ),
    ("Translate 'hello' to French.", "Bonjour.", "Merci! And 'goodbye'?", "user", 1),
    ("Translate 'hello' to French.", "Hola.", "No, I meant French, not Spanish.", "user", -1),
    ("What is 12 times 12?", "144.", "Correct, thanks.", "user", 1),
    ("What is 12 times 12?", "122.", "No, that's not right. Try again.", "user", -1),
    ("List the files in the directory.", '[tool call] ls({"path": "."})', "README.md\nsetup.py\nsrc/", "tool", 1),
    (
        "List the files in the directory.",
        '[tool call] ls({"pth": "."})',
        "Error: unknown argument 'pth'. Usage: ls(path)",
        "tool",
        -1,
    ),
    ("Run the tests.", '[tool call] bash({"cmd": "pytest"})', "===== 42 passed in 3.1s =====", "tool", 1),
    ("Run the tests.", '[tool call] bash({"cmd": "pytset"})', "bash: pytset: command not found", "tool", -1),
    (
        "What does a CPU do?",
        "A CPU executes the instructions of computer programs.",
        "Nice, that's exactly what I needed.",
        "user",
        1,
    ),
    (
        "What does a CPU do?",
        (
            "A CPU, or central processing unit, is the primary component of a computer that performs most of the "
            "processing inside the computer, executing instructions, performing arithmetic and logic operations, "
            "and controlling other components, and it is often called the brain of the computer."
        ),
        "Please be much shorter. One sentence.",
        "user",
        -1,
    ),
    (
        "Why do we have seasons?",
        "Earth's tilted axis changes how directly sunlight hits each hemisphere over the year.",
        "Thanks! Next question: What is gravity?",
        "user",
        1,
    ),
    (
        "Why do we have seasons?",
        "Seasons are caused by the distance between the Earth and the Sun changing.",
        "No, that's a common misconception. It's the axial tilt.",
        "user",
        -1,
    ),
    (
        "What is the largest ocean?",
        "The Pacific Ocean.",
        "Thanks, short and clear. Next question: What is gravity?",
        "user",
        1,
    ),
    (
        "What is the largest ocean?",
        (
            "The largest ocean on Earth is the Pacific Ocean, which covers more than 60 million square miles and "
            "contains more than half of the free water on Earth, stretching from the Arctic to the Southern "
            "Ocean."
        ),
        "No, that is far too long. Answer in one short sentence, please.",
        "user",
        -1,
    ),
]


def auc(pairs: list[tuple[int, float]]) -> float:
    pos = [s for label, s in pairs if label > 0]
    neg = [s for label, s in pairs if label < 0]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


async def main_async(args: argparse.Namespace) -> int:
    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.judge import JudgeLoop, PolicyJudgeClient
    from openclaw_cli.settings import Settings

    settings = Settings(model=None if args.model == "smollm2" else args.model)
    backend = LocalBackend(settings)
    await backend.start()
    client = PolicyJudgeClient(backend)
    print(f"judge: {client.name} on {settings.model or 'embedded SmolLM2-135M-Instruct'}; {len(ITEMS)} labelled steps")
    print(f"{'mode':>8}{'AUC':>7}{'acc@0':>8}{'scored':>8}{'right':>7}{'ms/turn':>9}")
    for mode in args.modes:
        mode_settings = settings.model_copy(
            update={"judge": settings.judge.model_copy(update={"mode": mode, "votes": 1})}
        )
        loop = JudgeLoop(None, client, mode_settings, max_tokens=args.vote_tokens)  # type: ignore[arg-type]
        pairs: list[tuple[int, float]] = []
        scored = right = 0
        started = time.perf_counter()
        for question, reply, next_state, role, label in ITEMS:
            turn: Any = SimpleNamespace(
                messages=[{"role": "user", "content": question}],
                assistant_message={"role": "assistant", "content": reply},
                next_state=[{"role": role, "content": next_state}],
                next_state_role=role,
            )
            verdict = await loop.judge_turn(turn)
            value = verdict.log_odds if verdict.log_odds is not None else float(verdict.score)
            pairs.append((label, value))
            if verdict.score != 0:
                scored += 1
                right += (verdict.score > 0) == (label > 0)
        per_turn = (time.perf_counter() - started) / len(ITEMS) * 1000
        accuracy = sum((v > 0) == (label > 0) for label, v in pairs) / len(pairs)
        print(f"{mode:>8}{auc(pairs):>7.2f}{accuracy:>8.2f}{scored:>8}{right:>7}{per_turn:>9.0f}")
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
