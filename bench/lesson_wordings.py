"""How well the embedded model follows each wording of a wish as a served lesson: what a rewording user's lessons do.

For a scripted user of ``bench/learning.py`` (default ``bench/scripts/reworded.json``), the frozen base model answers
the script's held-out questions greedily with each of the user's wordings served as the only lesson (in the prompt
as the proxy places it), with the first two wordings served together, and *told* (the script's instruction added to
the question, as ``bench/learning.py`` asks the told model). Prints mean words, keyword hits, and words as a ratio to
the told model's (the lessons goal is at most 1.3). This is the measurement behind a newer wording of the same wish
replacing an older one rather than being served beside it (docs/lessons.md). Run:
``python bench/lesson_wordings.py [--script FILE] [--max-tokens 64]`` (about 5 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import learning
from learning import SCRIPTS, Script, ask_held_out


async def main_async(args: argparse.Namespace) -> None:
    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.settings import Settings

    script = learning.SCRIPT = Script.load(args.script)  # what ask_held_out asks and HeldOut scores
    backend = LocalBackend(Settings(local={"device": "cpu"}))
    await backend.start()
    wordings = list(script.form_corrections)
    variants: list[tuple[str, tuple[str, ...], bool]] = [("none (plain)", (), False), ("told", (), True)]
    variants += [(repr(text), (text,), False) for text in wordings]
    if len(wordings) > 1:
        variants.append((f"{wordings[0]!r} + {wordings[1]!r}", tuple(wordings[:2]), False))
    told_words = None
    print(f"{'served lessons':50s} {'words':>6s} {'hits':>5s} {'x told':>7s}")
    for name, lessons, told in variants:
        held_out = await ask_held_out(backend, told=told, max_tokens=args.max_tokens, lessons=lessons)
        told_words = held_out.words if told else told_words
        ratio = f"{held_out.words / told_words:7.2f}" if told_words else f"{'':7s}"
        print(f"{name:50s} {held_out.words:6.1f} {held_out.hits:5.2f} {ratio}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--script", type=Path, default=SCRIPTS / "reworded.json")
    parser.add_argument("--max-tokens", type=int, default=64, help="reply limit, as bench/learning.py")
    asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    main()
