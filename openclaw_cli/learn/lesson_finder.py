"""Which user replies teach a lesson: a correction of the *form* of an answer, not of a fact.

"Too wordy. Just give me the key fact." asks every later answer to change; "No, the capital of Australia is
Canberra." corrects one answer, and stays a hint for that turn only. The test is cheap and deliberately narrow, since
verification (:mod:`openclaw_cli.learn.lesson_checks`) is what decides whether a candidate helps:

- the reply is short (at most :data:`MAX_WORDS` words: a long message is a new request, not a correction);
- at least one of its sentences names a property of answers in general: length (too long, shorter, one sentence, a
  few words, concise), shape (a list, bullet points, a table, JSON, markdown, plain text), language, case, tone, or
  a standing rule (from now on, always / never / don't + a verb of writing). A fact correction names none of them.

The lesson is the user's own words: the sentences that carry such a cue (an opening "No," dropped), so "No, that is
far too long. Please answer in one short sentence." becomes "that is far too long. Please answer in one short
sentence." and a fact that rode along in another sentence stays out.
"""

from __future__ import annotations

import re

MAX_WORDS = 40
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")
_LEADING_NO = re.compile(r"^\s*(no|nope|nah|ugh|hmm+)\b[\s,.!:;-]*", re.IGNORECASE)
_WORD = re.compile(r"[A-Za-z0-9']+")

# The cues by what they are about. Two lessons about the same thing (a wish about length, say) are one wish in two
# wordings (:func:`form_kinds`); a standing rule ("never apologize", "don't use jargon") is its own thing each time.
_CUES_BY_KIND: dict[str, tuple[str, ...]] = {
    "length": (
        r"\btoo (long|wordy|verbose|short|brief|detailed|technical|complicated|complex|much|many)\b",
        r"\b(shorter|briefer|longer|simpler|less verbose|more concise|more detail(ed)?|fewer words)\b",
        r"\b(concise|succinct|brief|briefly|terse|wordy|verbose|rambl\w*|long-winded)\b",
        r"\b(just|only) (give|tell|say|answer|reply|need|want|the)\b",
        r"\bget to the point\b",
        r"\btl;? ?dr\b",
        r"\bno (need|fluff|preamble|intro\w*|filler|explanations?|essays?|lectures?)\b",
        r"\b(one|a single|single|a few|few|two|three|\d+) (short |brief )?(sentences?|words?|lines?|paragraphs?)\b",
        r"\bkey (facts?|points?)\b",
        r"\bsummar(y|ize|ise) (first|only)\b",
    ),
    "shape": (
        r"\b(bullet(ed)?( points?)?|numbered list|as a list|in a list|in a table|markdown|json|code blocks?|"
        r"plain text)\b",
    ),
    "language": (r"\bin (english|french|german|spanish|italian|portuguese|chinese|japanese|dutch|russian)\b",),
    "case": (r"\b(lower|upper)case\b",),
    "tone": (r"\btoo (formal|casual)\b", r"\b(tone|more formal|less formal|informal|friendlier|more polite)\b"),
    "rule": (
        r"\b(don't|do not|dont|stop|never|always|please don't) (explain\w*|apologi[sz]\w*|repeat\w*|us\w+|add\w*|"
        r"start\w*|say\w*|includ\w*|ask\w*|writ\w*|mention\w*|lectur\w*|hedg\w*)\b",
        r"\bfrom now on\b",
    ),
}
_FORM_CUES = re.compile("|".join(cue for cues in _CUES_BY_KIND.values() for cue in cues), re.IGNORECASE)
# Each standing rule is a wish of its own, however it is worded: not a kind two lessons can share.
_KIND_CUES = {kind: re.compile("|".join(cues), re.IGNORECASE) for kind, cues in _CUES_BY_KIND.items() if kind != "rule"}


def form_kinds(text: str) -> frozenset[str]:
    """What a lesson's wording is about ("length", "shape", "language", "case", "tone"): two lessons that share a
    kind are the same wish in other words, and the newer one may replace the older (see
    :mod:`openclaw_cli.learn.lessons`). A standing rule has no kind here: each is its own wish."""
    return frozenset(kind for kind, cue in _KIND_CUES.items() if cue.search(text))


def form_cue_sentences(text: str) -> list[str]:
    """The sentences of ``text`` that correct the form of answers (see the module docstring), opening "No," dropped."""
    if len(_WORD.findall(text)) > MAX_WORDS:
        return []
    found = []
    for match in _SENTENCE.finditer(text):
        sentence = match.group(0).strip()
        if sentence and _FORM_CUES.search(sentence):
            found.append(sentence)
    if found:
        found[0] = _LEADING_NO.sub("", found[0]).strip()
        if found[0]:
            found[0] = found[0][0].upper() + found[0][1:]
    return [sentence for sentence in found if sentence]


def lesson_from_reply(text: str, max_chars: int) -> str | None:
    """The lesson a user's reply teaches, in their own words, or None when it corrects no form of answer."""
    sentences = form_cue_sentences(text)
    if not sentences:
        return None
    lesson = " ".join(" ".join(sentences).split())
    return lesson[:max_chars].rstrip() or None


def is_form_correction(text: str) -> bool:
    return bool(form_cue_sentences(text))
