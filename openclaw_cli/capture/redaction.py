"""Optional redaction of e-mail addresses, API keys / tokens and phone numbers (``store.redact``).

**Setting.** ``store.redact = true`` enables every kind; a list picks some (``["email", "api_key"]``); ``false``
(the default) or ``[]`` turns redaction off. Kinds:

- ``email``: ``name@host.tld``;
- ``api_key``: well-known key formats (``sk-…`` OpenAI/Anthropic, ``tml-…`` Tinker, ``fw_…`` Fireworks, AWS
  ``AKIA…``/``ASIA…``, GitHub ``ghp_…``/``github_pat_…``, GitLab ``glpat-…``, Slack ``xox?-…``, Google ``AIza…``,
  Hugging Face ``hf_…``, JWTs, PEM private keys, ``Bearer <token>``), the value of an assignment whose name says
  key/secret/token/password (``API_KEY=…``, ``"client_secret": "…"``) when it holds letters and digits, and any
  other long random-looking token (32+ base64/base64url characters mixing upper case, lower case and digits, with
  high character entropy; plain hex such as git hashes and UUIDs is left alone);
- ``phone``: ``+`` international numbers (8-15 digits) and North American ``(555) 123-4567`` style numbers.

**Design: what is redacted where, and why the stored turn is not.** A turn stores the exact token ids the policy
was served and sampled; rewriting its text would leave text and ids disagreeing, and re-tokenizing would train on
tokens the policy never produced. So the store keeps turns verbatim and redaction happens at the edges where data
leaves this machine:

1. **Judge.** What a judge prompt (PRM votes and OPD hints) is built from (the turn's history, reply and next
   state) is redacted first, whichever judge is configured (a cloud model, a local endpoint or the policy itself:
   one rule, no guessing which endpoint is "local"); redacting before the prompt clips long texts means no secret
   is cut in half and missed. The judge's hint therefore never quotes a secret either.
2. **Trainer.** Token ids cannot be redacted, so a turn whose text (prompt messages, tools, reply) contains an
   enabled kind is *withheld* from a cloud trainer (any backend other than ``local``): it is skipped like an
   unusable turn and its tokens never leave the machine. The local backend trains on it, since nothing leaves.
   Detection runs when the trainer takes the turn, so enabling redaction also covers turns captured earlier.
3. **Export.** ``openclaw export --format messages`` writes redacted text; ``--format tokens`` leaves out the
   turns that contain an enabled kind (their ids would carry the secret).

Detection is heuristic: it finds the common formats, not every secret a conversation could hold. For data that must
never be stored at all, clients send ``X-OpenClaw-Opt-Out: 1`` (see :mod:`openclaw_cli.proxy.capture_handoff`).
All patterns use bounded repetition, so a hostile 32 MB body costs linear time.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings
    from openclaw_cli.store import TurnRecord

ALL_KINDS: tuple[str, ...] = ("email", "api_key", "phone")
PLACEHOLDERS = {kind: f"[REDACTED_{kind.upper()}]" for kind in ALL_KINDS}
LOCAL_BACKENDS = frozenset({"local"})  # backends whose training never sends tokens off this machine
# Values under these keys are identifiers or enum words, never free text.
_STRUCTURAL_KEYS = frozenset({"role", "type", "id", "tool_call_id", "name"})

# --- patterns ------------------------------------------------------------------------------------------------------
_EMAIL = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9._%+-]{1,64}@(?:[A-Za-z0-9-]{1,63}\.){1,8}[A-Za-z]{2,24}(?![\w-])",
)
_KNOWN_KEYS = re.compile(
    "|".join(
        (
            r"-----BEGIN [A-Z ]{0,40}PRIVATE KEY-----[\s\S]{0,16000}?-----END [A-Z ]{0,40}PRIVATE KEY-----",
            r"\bsk-[A-Za-z0-9_-]{20,400}",
            r"\btml-[A-Za-z0-9_-]{16,400}",
            r"\bfw_[A-Za-z0-9]{16,400}",
            r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b",
            r"\bgh[pousr]_[A-Za-z0-9]{30,255}",
            r"\bgithub_pat_[A-Za-z0-9_]{22,255}",
            r"\bglpat-[A-Za-z0-9_-]{20,255}",
            r"\bxox[abposr]-[A-Za-z0-9-]{10,255}",
            r"\bAIza[0-9A-Za-z_-]{35}",
            r"\bhf_[A-Za-z0-9]{30,255}",
            r"\beyJ[A-Za-z0-9_-]{10,4000}\.eyJ[A-Za-z0-9_-]{10,8000}\.[A-Za-z0-9_-]{10,4000}",
            r"(?i:\bbearer\s{1,8})[A-Za-z0-9._~+/-]{16,1000}=*",
        )
    )
)
# NAME = value / "name": "value" where the name says it is a credential; group 2 is the value.
# (Matching starts at the keyword: a free-length name prefix before it would cost quadratic time.)
_ASSIGNMENT = re.compile(
    r"(?i)((?:api[_-]?key|secret|token|passw(?:or)?d|passwd|access[_-]?key|credential)[\w.-]{0,40}"
    r"[\"']?\s{0,4}[:=]\s{0,4}[\"']?)([A-Za-z0-9_+/=.~-]{8,400})"
)
_LONG_TOKEN = re.compile(r"(?<![A-Za-z0-9+/_=-])[A-Za-z0-9+/_-]{32,4096}={0,2}(?![A-Za-z0-9+/_=-])")
_PHONE_INTL = re.compile(r"(?<![\w+])\+\d[\d .()-]{6,22}\d(?![\w])")
_PHONE_NANP = re.compile(r"(?<![\w-])(?:\(\d{3}\)\s?|\d{3}[ .-])\d{3}[ .-]\d{4}(?![\w-])")

# A random-looking token: high character entropy (random base64 of 32+ characters averages ~4.5 bits/char, rarely
# under 4.2), at least two digits, and no run of 8+ lower-case letters; the last rule keeps words out, i.e. code
# identifiers and file paths ("InFlightLimitMiddleware2", "/home/me/projects/App2"), which random keys almost
# never contain (a run of 8 lower-case letters occurs in ~2% of random 40-character keys).
MIN_TOKEN_ENTROPY = 4.0
MIN_TOKEN_DIGITS = 2
_WORD_RUN = re.compile(r"[a-z]{8}")


def shannon_entropy(text: str) -> float:
    if not text:
        return 0.0
    n = len(text)
    return -sum(c / n * math.log2(c / n) for c in Counter(text).values())


def _looks_random(token: str) -> bool:
    core = token.rstrip("=")
    return (
        any(c.isupper() for c in core)
        and any(c.islower() for c in core)
        and sum(c.isdigit() for c in core) >= MIN_TOKEN_DIGITS
        and _WORD_RUN.search(core) is None
        and shannon_entropy(core) >= MIN_TOKEN_ENTROPY
    )


def _has_letter_and_digit(value: str) -> bool:
    return any(c.isalpha() for c in value) and any(c.isdigit() for c in value)


@dataclass(frozen=True)
class _Rule:
    kind: str
    pattern: re.Pattern[str]
    # Given a match, the replacement text, or None to leave this match alone (a false positive).
    replace: Callable[[re.Match[str], str], str | None]


def _whole(match: re.Match[str], placeholder: str) -> str:
    return placeholder


def _assignment_value(match: re.Match[str], placeholder: str) -> str | None:
    return match.group(1) + placeholder if _has_letter_and_digit(match.group(2)) else None


def _long_token(match: re.Match[str], placeholder: str) -> str | None:
    before = match.string[max(0, match.start() - 7) : match.start()]
    if before.endswith("base64,"):  # inline image data, not a credential
        return None
    return placeholder if _looks_random(match.group(0)) else None


def _international_phone(match: re.Match[str], placeholder: str) -> str | None:
    digits = sum(c.isdigit() for c in match.group(0))
    return placeholder if 8 <= digits <= 15 else None


# Order matters: the specific formats first, so a key inside an assignment is replaced whole.
_RULES: tuple[_Rule, ...] = (
    _Rule("api_key", _KNOWN_KEYS, _whole),
    _Rule("api_key", _ASSIGNMENT, _assignment_value),
    _Rule("email", _EMAIL, _whole),
    _Rule("phone", _PHONE_INTL, _international_phone),
    _Rule("phone", _PHONE_NANP, _whole),
    _Rule("api_key", _LONG_TOKEN, _long_token),
)


def enabled_kinds(setting: bool | Sequence[str] | None) -> tuple[str, ...]:
    """The kinds a ``store.redact`` value enables, in canonical order."""
    if setting is None or setting is False:
        return ()
    if setting is True:
        return ALL_KINDS
    unknown = sorted(set(setting) - set(ALL_KINDS))
    if unknown:
        raise ValueError(f"unknown redaction kind(s) {unknown}; known: {', '.join(ALL_KINDS)}")
    return tuple(kind for kind in ALL_KINDS if kind in setting)


class Redactor:
    """Finds and replaces the enabled kinds in text and in JSON-like values (messages, tool calls)."""

    def __init__(self, kinds: Iterable[str] = ()) -> None:
        self.kinds = enabled_kinds(list(kinds))
        self._rules = tuple(rule for rule in _RULES if rule.kind in self.kinds)

    @classmethod
    def from_settings(cls, settings: Settings) -> Redactor:
        return cls(enabled_kinds(settings.store.redact))

    @property
    def enabled(self) -> bool:
        return bool(self._rules)

    # text -----------------------------------------------------------------------------------------------------
    def redact_text(self, text: str) -> str:
        for rule in self._rules:
            placeholder = PLACEHOLDERS[rule.kind]

            def substitute(match: re.Match[str], rule: _Rule = rule, placeholder: str = placeholder) -> str:
                replaced = rule.replace(match, placeholder)
                return match.group(0) if replaced is None else replaced

            text = rule.pattern.sub(substitute, text)
        return text

    def find(self, text: str) -> set[str]:
        """The enabled kinds that occur in ``text``."""
        found: set[str] = set()
        for rule in self._rules:
            if rule.kind in found:
                continue
            placeholder = PLACEHOLDERS[rule.kind]
            if any(rule.replace(match, placeholder) is not None for match in rule.pattern.finditer(text)):
                found.add(rule.kind)
        return found

    # structures -----------------------------------------------------------------------------------------------
    def redact_value(self, value: Any) -> Any:
        """A copy of a JSON-like value with every free-text string redacted (roles, types, ids, names kept)."""
        if not self.enabled:
            return value
        return self._redact_value(value)

    def _redact_value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, dict):
            return {
                k: v if k in _STRUCTURAL_KEYS and isinstance(v, str) else self._redact_value(v)
                for k, v in value.items()
            }
        if isinstance(value, list | tuple):
            return type(value)(self._redact_value(v) for v in value)
        return value

    def redact_messages(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return self.redact_value(messages)

    def find_in_value(self, value: Any) -> set[str]:
        found: set[str] = set()
        for text in _free_texts(value):
            found |= self.find(text)
            if len(found) == len(self.kinds):
                break
        return found

    def kinds_in_turn(self, turn: TurnRecord) -> set[str]:
        """The enabled kinds in what a turn's tokens encode: its prompt messages, tools and reply."""
        if not self.enabled:
            return set()
        return self.find_in_value([turn.messages, turn.tools or [], turn.assistant_message])


def _free_texts(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if not (key in _STRUCTURAL_KEYS and isinstance(item, str)):
                yield from _free_texts(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _free_texts(item)


def withhold_from_training(turn: TurnRecord, settings: Settings, backend_name: str) -> bool:
    """True when redaction is on, the trainer is not local, and the turn's tokens carry an enabled kind."""
    if backend_name in LOCAL_BACKENDS:
        return False
    redactor = Redactor.from_settings(settings)
    return redactor.enabled and bool(redactor.kinds_in_turn(turn))
