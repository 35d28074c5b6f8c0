"""A lesson's evidence in words a user understands (``openclaw lessons show``): which of their prompts it was tried
on, what changed there, and what it waits for; the numbers stay in ``--json``.

Reads the evidence entries :mod:`openclaw_cli.learn.lessons` writes: a verification (``verification``: the outcome
and one trial per prompt, see :mod:`openclaw_cli.learn.lesson_checks`) or a retirement check (``check``: ``pass``,
``fail`` or ``few``).
"""

from __future__ import annotations

from typing import Any

from openclaw_cli.learn.lesson_checks import PREFERENCE_MARGIN

_HEADLINES = {
    "verified": "Verified: where it changes the reply, the reply is closer to what you asked for.",
    "inconclusive": (
        "Not verified yet: on the prompts tried it made no difference that matters. Waiting for a prompt of yours "
        "whose reply it would change (for a wish about length: a reply longer than you asked for); your next "
        "conversations are tried as they come."
    ),
    "duplicate": "Not kept: a lesson you already have asks for the same (with it served, this one changes no reply).",
    "rejected": "Not kept: it did not make the replies better where it acts.",
}
_AGAIN = "If you meant it, say it again: your next correction re-opens it at once and tries it on that reply."


def _trial_line(trial: dict[str, Any]) -> str:
    where = f"turn {trial.get('turn')}" + (" (the reply you corrected)" if trial.get("corrected") else "")
    before, after = ([*list(trial.get("words") or []), 0, 0])[:2]
    verdict = trial.get("verdict", "")
    if verdict == "unchanged":
        what = f"the same reply with it ({before} words)"
    elif verdict == "covered":
        what = f"the same reply with it ({before} words): a lesson you already have does this"
    elif verdict == "helped":
        what = f"{before} -> {after} words, closer to what you asked for"
    elif verdict == "hurt" and float(trial.get("guard", 0.0)) <= -PREFERENCE_MARGIN < float(trial.get("advantage", 0)):
        what = f"{before} -> {after} words, worse by what the lesson it would replace asks for"
    elif verdict == "hurt":
        what = f"{before} -> {after} words, worse by your own correction (or no longer an answer to the question)"
    elif verdict == "leak":
        words = ", ".join(trial.get("leaked") or [])
        what = f"{before} -> {after} words, but it brought words of the lesson into an unrelated answer ({words})"
    else:
        what = f"{before} -> {after} words, no difference that matters"
    return f"{where}: {what}"


def _rejection_reasons(trials: list[dict[str, Any]]) -> list[str]:
    reasons = []
    if any(t.get("verdict") == "leak" for t in trials):
        reasons.append("its topic turned up in answers about other things")
    if any(t.get("verdict") == "hurt" for t in trials):
        reasons.append("some replies it changed got worse by your correction's own measure")
    return reasons


def explain_entry(entry: dict[str, Any]) -> str:
    """One evidence entry in plain words (several lines), or its ``why`` when it is neither a verification nor a
    retirement check."""
    verification = entry.get("verification")
    if isinstance(verification, dict):
        outcome = str(verification.get("outcome", ""))
        trials = [t for t in verification.get("trials") or [] if isinstance(t, dict)]
        lines = [_HEADLINES.get(outcome, str(entry.get("why", "")))]
        replacing = ", ".join(str(i) for i in entry.get("replacing") or [])
        if replacing:
            lines.append(
                f"Tried in place of lesson {replacing}, which asks for the same kind of thing in your earlier words: "
                "it had to do better by this correction and no worse by that one's."
            )
        if outcome == "rejected":
            lines += [f"Why: {reason}." for reason in _rejection_reasons(trials)]
        if trials:
            lines.append(f"Tried on {len(trials)} of your prompts:")
            lines += [f"  - {_trial_line(trial)}" for trial in trials]
        if outcome in ("rejected", "duplicate") or entry.get("status") == "rejected":
            lines.append(_AGAIN)
        return "\n".join(lines)
    check = entry.get("check")
    if check == "few":
        return (
            f"Retirement check: only {entry.get('acting_prompts', 0)} of your untrained prompts are ones where it "
            "changes the reply; it stays until there are enough to tell whether the model learned it."
        )
    if check in ("pass", "fail"):
        trials = [t for t in entry.get("trials") or [] if isinstance(t, dict)]
        same = sum(1 for t in trials if t.get("verdict") in ("unchanged", "covered"))
        verdict = "answers as it asks without it" if check == "pass" else "still needs it"
        return (
            f"Retirement check on policy version {entry.get('policy_version')}: on {len(trials)} untrained prompts "
            f"where it acts, the model {verdict} ({same} of {len(trials)} replies the same with and without it)."
        )
    return str(entry.get("why", ""))
