"""``openclaw eval``: is the trained policy better than the one before it?

A held-out set of prompts (the last stored main-line turns, those since a time, or a JSONL file of
``{"messages": [...]}``) is replayed against two policy versions, A and B, and judged (the evaluation core,
:mod:`openclaw_cli.learn.evaluation`, says how: absolute scores and position-balanced pairwise preferences). The
result: win rate of B over A (ties count half), mean score per version, and n.

``--plot PATH`` also draws the trainer's reward per step from the store's ``steps`` table as a PNG.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from openclaw_cli.command_support import (
    EXIT_REFUSED,
    CliFailure,
    ConfigOption,
    SetOption,
    command_settings,
    open_existing_store,
)
from openclaw_cli.learn.evaluation import (
    BASE_SPEC,
    LATEST_SPEC,
    EvalError,
    EvalItem,
    EvalOptions,
    EvalReport,
    PolicyChoice,
    evaluate,
    load_prompt_file,
    load_stored_items,
    plot_reward_over_steps,
    resolve_checkpoint,
    serve_choice,
)

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings


# --- presentation --------------------------------------------------------------------------------------------------


def _fmt(value: float | None, pattern: str = "{:+.3f}") -> str:
    return "n/a" if value is None else pattern.format(value)


def _label(choice: PolicyChoice) -> str:
    return f"{choice.spec} (v{choice.version})"


def report_table(report: EvalReport) -> Any:
    from rich.table import Table

    table = Table(title=f"openclaw eval — B = {_label(report.b)} vs A = {_label(report.a)}")
    table.add_column("measure")
    table.add_column("A", justify="right")
    table.add_column("B", justify="right")
    table.add_row("mean reward (−1…1)", _fmt(report.mean_score_a), _fmt(report.mean_score_b))
    table.add_row("replies scored", str(report.scored_a), str(report.scored_b))
    table.add_row("pairwise wins", str(report.wins_a), str(report.wins_b))
    table.add_row("ties", str(report.ties), str(report.ties))
    table.add_section()
    win_rate = _fmt(report.win_rate_b, "{:.3f}")
    table.add_row("win rate of B over A (ties ½)", "", win_rate)
    table.add_row("n (prompts / pairs judged)", "", f"{report.n} / {report.pairs_judged}")
    return table


# --- command -------------------------------------------------------------------------------------------------------


def _with_two_servable_versions(settings: Settings) -> Settings:
    # Loading A then B publishes two versions; both must stay servable while the replies are generated.
    if settings.local.keep_versions >= 2:
        return settings
    return settings.model_copy(update={"local": settings.local.model_copy(update={"keep_versions": 2})})


async def run_eval(
    settings: Settings, items: list[EvalItem], spec_a: str, spec_b: str, options: EvalOptions
) -> EvalReport:
    """Start the configured backend, make A and B servable, judge with the configured judge, close."""
    state_dir = Path(settings.local.state_dir).expanduser()
    checkpoint_a = resolve_checkpoint(spec_a, state_dir)  # fail on a bad spec before loading any model
    checkpoint_b = resolve_checkpoint(spec_b, state_dir)
    from openclaw_cli.backend import create_backend

    try:
        from openclaw_cli.learn.judge import make_judge_client
    except ImportError as exc:
        raise EvalError(f"the judge is not available in this build ({exc})") from None
    backend = create_backend(_with_two_servable_versions(settings))
    await backend.start()
    try:
        a = await serve_choice(backend, spec_a, checkpoint_a)
        b = await serve_choice(backend, spec_b, checkpoint_b)
        client = make_judge_client(settings, backend)
        return await evaluate(backend, client, items, a, b, options)
    finally:
        await backend.close()


def eval_command(
    prompts: Annotated[
        Path | None, typer.Option("--prompts", help='JSONL of {"messages": [...]} to replay instead of the store.')
    ] = None,
    last: Annotated[int, typer.Option("--last", help="Replay the most recent N stored main-line turns.")] = 50,
    since: Annotated[
        str | None, typer.Option("--since", help="Only turns captured since: Unix seconds, ISO date/time, or 2h/7d.")
    ] = None,
    a: Annotated[str, typer.Option("--a", help="Version A: base, latest, or a checkpoint name/path.")] = BASE_SPEC,
    b: Annotated[str, typer.Option("--b", help="Version B: base, latest, or a checkpoint name/path.")] = LATEST_SPEC,
    max_tokens: Annotated[int, typer.Option("--max-tokens", min=1, help="Reply length limit.")] = 256,
    temperature: Annotated[float, typer.Option("--temperature", min=0.0, help="Policy sampling (0 = greedy).")] = 0.0,
    votes: Annotated[int, typer.Option("--votes", min=1, max=15, help="Judge votes per absolute score.")] = 1,
    seed: Annotated[int, typer.Option("--seed", help="Seeds sampling and the A/B presentation order.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable result (with every reply).")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Also write reward-over-steps as a PNG here.")] = None,
    plot_only: Annotated[bool, typer.Option("--plot-only", help="Only write the --plot PNG; replay nothing.")] = False,
    metric: Annotated[str | None, typer.Option("--metric", help="Steps-table key to plot as reward.")] = None,
    config: ConfigOption = None,
    set_: SetOption = None,
) -> None:
    """Compare two policy versions on held-out prompts with the judge: win rate of B over A, mean reward."""
    from openclaw_cli.backend import BackendError
    from openclaw_cli.commands.export import parse_since

    if plot_only and plot is None:
        raise CliFailure("--plot-only needs --plot PATH", EXIT_REFUSED)
    settings = command_settings(config, set_)
    try:
        since_ts = parse_since(since) if since is not None else None
    except ValueError as exc:
        raise CliFailure(str(exc), EXIT_REFUSED) from None

    try:
        report = None
        if not plot_only:
            if prompts is not None:
                items = load_prompt_file(prompts)
            else:
                store = open_existing_store(settings)
                try:
                    items = load_stored_items(store, last=last, since=since_ts)
                finally:
                    store.close()
            options = EvalOptions(
                max_tokens=max_tokens,
                temperature=temperature,
                seed=seed,
                votes=votes,
                judge_temperature=settings.judge.temperature,
                concurrency=settings.judge.max_concurrency,
            )
            report = asyncio.run(run_eval(settings, items, a, b, options))
            _record(settings, report)
        plotted = None
        if plot is not None:
            store = open_existing_store(settings)
            try:
                plotted = plot_reward_over_steps(store.steps(), plot, metric)
            finally:
                store.close()
    except (EvalError, BackendError) as exc:
        raise CliFailure(str(exc)) from None
    _show(report, plot, plotted, as_json=as_json)


def _record(settings: Settings, report: EvalReport) -> None:
    """Keep the result in the store (without the replies), where `openclaw launch` sends it to train.report_to's
    trackers at the step it was measured after. A store that cannot take it costs a warning, not the result."""
    from openclaw_cli.store import Store, StoreError

    if not Path(settings.store.path).expanduser().exists():
        return
    summary = {key: value for key, value in report.to_json().items() if key != "items"}
    try:
        store = Store(settings.store.path, create=False)
        try:
            store.record_evaluation(summary)
        finally:
            store.close()
    except (StoreError, OSError) as exc:
        typer.echo(f"warning: the result was not kept in the store ({exc})", err=True)


def _show(report: EvalReport | None, plot: Path | None, plotted: str | None, *, as_json: bool) -> None:
    """Print the eval's result (a table, or JSON with every reply) and where the plot went."""
    if as_json:
        document: dict[str, Any] = {"eval": report.to_json() if report else None}
        if plot is not None:
            document["plot"] = {"path": str(plot), "metric": plotted}
        typer.echo(json.dumps(document, ensure_ascii=False, indent=2))
        return
    from rich.console import Console

    console = Console()
    if report is not None:
        console.print(report_table(report))
        failed = sum(r.error is not None for r in report.items)
        if failed:
            console.print(f"[yellow]{failed} prompt(s) produced no reply from a version; see --json for why[/]")
        if report.scored_a + report.scored_b + report.pairs_judged == 0:
            console.print(
                "[yellow]the judge gave no valid \\boxed{} answer: a small policy judging itself often cannot; "
                "set judge.model (and judge.base_url) to a stronger judge[/]"
            )
    if plot is not None:
        console.print(f"reward over steps ({plotted}) written to {plot}")
