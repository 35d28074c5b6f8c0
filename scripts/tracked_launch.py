"""A real `openclaw launch --report-to tensorboard,mlflow` on the embedded model, talked to by scripted users, then
its trackers read back with their own readers and compared with the store, row for row.

    python scripts/tracked_launch.py [--minutes 10] [--workdir DIR] [--screenshot docs/img/tensorboard-scalars.png]
    python scripts/tracked_launch.py --check-only --workdir DIR [--screenshot PNG]   # an earlier run, again

The launch runs as its own process in ``--workdir`` (default: a new temporary directory) with every default, so its
store and local trackers land in ``<workdir>/.openclaw/`` as a user's would. Two scripted users (bench/scripts/
brevity.json: a reply over 20 words gets the correction, a good one thanks and the next question) talk to it over
the OpenAI API for ``--minutes``; then it gets Ctrl-C (SIGINT), and once it has exited the TensorBoard event files
(EventAccumulator) and the MLflow run (MlflowClient) must hold exactly the store's step rows. ``--screenshot`` also
serves the event files with TensorBoard on 127.0.0.1 and has headless Chromium (/usr/bin/chromium) take a picture of
its scalars page (through Playwright: ``pip install playwright``). Exit 0 when both trackers match the store and
at least one step was trained.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without installing
sys.path.insert(0, str(ROOT / "tests"))  # the readback helpers the tests use

from openclaw_cli.testing.local_servers import free_port, wait_until_answering  # noqa: E402

SCRIPT = json.loads((ROOT / "bench" / "scripts" / "brevity.json").read_text())
MAX_WORDS = 20
# The scalars the screenshot shows (TensorBoard's tag filter): learning, its cost, and what it ran on.
SHOWN_TAGS = (
    r"train/(reward_mean|reward_std|loss|demos)|policy/version|publish/kl_base|capture/main_turns|judge/latency_s"
)


async def user(base_url: str, name: int, until: float, counts: dict[str, int]) -> None:
    """One scripted user: sessions of up to 4 turns until ``until``."""
    import httpx
    import openai

    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=300)
    rng = random.Random(name)
    questions = list(SCRIPT["questions"])
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as http:
        while time.monotonic() < until:
            session = f"user{name}-{uuid.uuid4().hex[:8]}"
            messages = [
                {"role": "system", "content": SCRIPT["system"]},
                {"role": "user", "content": rng.choice(questions)},
            ]
            for _ in range(4):
                if time.monotonic() >= until:
                    break
                reply = await client.chat.completions.create(
                    model="openclaw-policy",
                    messages=messages,  # type: ignore[arg-type]
                    max_tokens=64,
                    temperature=0.8,
                    extra_headers={"X-Session-Id": session},
                )
                text = reply.choices[0].message.content or ""
                counts["replies"] += 1
                if len(text.split()) > MAX_WORDS:
                    follow_up = SCRIPT["correction"]
                    counts["corrections"] += 1
                else:
                    follow_up = SCRIPT["thanks"].format(question=rng.choice(questions))
                messages += [{"role": "assistant", "content": text}, {"role": "user", "content": follow_up}]
            await http.post(f"/v1/openclaw/sessions/{session}/end")


def screenshot(logdir: Path, target: Path) -> None:
    """TensorBoard's scalars page for ``logdir``, served on 127.0.0.1, photographed by headless Chromium driven by
    Playwright (``pip install playwright``: its driver only; the browser is Debian's /usr/bin/chromium), with the
    outlier clipping turned off so every point shows."""
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    port = free_port()
    board = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1", "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_until_answering(f"http://127.0.0.1:{port}/", board, timeout_s=60, what="tensorboard", require_ok=True)
        target.parent.mkdir(parents=True, exist_ok=True)
        quiet = ["--disable-gpu", "--disable-quic", "--disable-background-networking", "--disable-component-update"]
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox", *quiet])
            page = browser.new_page(viewport={"width": 1800, "height": 800})
            shown = quote(SHOWN_TAGS, safe="")
            page.goto(f"http://127.0.0.1:{port}/?darkMode=false#scalars&_smoothingWeight=0&tagFilter={shown}")
            page.get_by_text("Ignore outliers in chart scaling").first.click(timeout=30_000)
            page.wait_for_timeout(3000)  # the charts redraw
            page.screenshot(path=str(target))
            browser.close()
        print(f"screenshot: {target}")
    finally:
        board.terminate()
        board.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--users", type=int, default=2)
    parser.add_argument("--screenshot", type=Path, default=None)
    parser.add_argument("--check-only", action="store_true", help="only check (and screenshot) --workdir's run")
    args = parser.parse_args()
    if args.check_only:
        if args.workdir is None:
            parser.error("--check-only needs --workdir")
        return check(args.workdir, args.screenshot)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="openclaw-tracked-"))
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_MODE": "offline"}
    command = [sys.executable, "-m", "openclaw_cli", "launch", "--no-ui", "--port", str(port)]
    command += ["--report-to", "tensorboard,mlflow"]
    log_path = workdir / "launch.log"
    print(f"workdir {workdir}; {' '.join(command[2:])}; log {log_path}", flush=True)
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(command, cwd=workdir, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        try:
            base_url = f"http://127.0.0.1:{port}"
            wait_until_answering(f"{base_url}/v1/models", process, timeout_s=300, what="launch", require_ok=True)
            started = time.monotonic()
            counts = {"replies": 0, "corrections": 0}

            async def users() -> None:
                until = started + args.minutes * 60
                await asyncio.gather(*(user(base_url, n, until, counts) for n in range(args.users)))

            asyncio.run(users())
            print(f"talked for {(time.monotonic() - started) / 60:.1f} min: {counts}", flush=True)
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(300)
    print(f"launch exited with {process.returncode}", flush=True)
    return check(workdir, args.screenshot)


def check(workdir: Path, shot: Path | None) -> int:
    from tracker_readback import mismatches, mlflow_series, store_series, tensorboard_series

    from openclaw_cli.store import Store

    state = workdir / ".openclaw"
    with Store(state / "store.sqlite3", create=False) as store:
        steps = store.steps()
        run = store.tracker_state("run")
    expected = store_series(steps)
    (logdir,) = (state / "tensorboard").iterdir()
    tensorboard = tensorboard_series(logdir)
    mlflow_run, mlflow = mlflow_series(f"sqlite:///{state / 'mlflow.db'}")
    problems = [f"tensorboard: {p}" for p in mismatches(expected, tensorboard, rel=1e-6)]
    problems += [f"mlflow: {p}" for p in mismatches(expected, mlflow)]
    rows = sum(len(points) for points in expected.values())
    print(
        f"store: {len(steps)} steps, {len(expected)} metrics, {rows} values; run {run}; tensorboard {logdir.name}: "
        f"{sum(len(v) for v in tensorboard.values())} values; mlflow run {mlflow_run.info.run_id} "
        f"({mlflow_run.info.status}): {sum(len(v) for v in mlflow.values())} values"
    )
    for problem in problems[:20]:
        print("MISMATCH", problem)
    if shot is not None:
        screenshot(state / "tensorboard", shot)
    ok = bool(steps) and not problems
    print("PASS: both trackers hold the store's step rows" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
