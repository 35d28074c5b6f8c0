"""Closing a constrained reply before its token budget runs out, so it still parses.

A grammar says what may come next, not when to stop: a small model at temperature 0 can repeat array items or grow a
string until ``max_tokens`` cuts the JSON (SmolLM2 on 50 schema requests: 29 replies cut that way). So as the
budget nears its end, the row checks how many tokens the shortest completion it can find from the grammar's current
state needs (:func:`closing_path`), and when the tokens left are just enough, it writes that completion: close the
open string, close the containers, give each required property still missing its shortest value. Those tokens are
forced (the sampler records them in ``forced_tokens``: certain under the masked distribution, no gradient), and the
reply ends on a stop token with valid JSON.

The path is found greedily on a copy of the matcher: forced tokens first (llguidance's fast-forward), then a closing
quote inside a string, a closing bracket or brace, a separator, and the shortest values (``0``, ``true``, ``null``,
``""``, ``[]``, ``{}``) in that order; a token of the vocabulary that is none of these (a string with a minimum
length, an enum) is the lowest-numbered one the grammar allows. Where the greedy walk finds no end within
:data:`MAX_CLOSING_TOKENS`, the row is left to the budget.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

MAX_CLOSING_TOKENS = 96
_CLOSERS = ("}", "]", ",", "0", "true", "false", "null", '"', "[", "{")


class JsonScan:
    """Whether a growing JSON text is inside a string (quote and escape aware); the one fact the closing order needs."""

    def __init__(self, in_string: bool = False, escaped: bool = False) -> None:
        self.in_string, self.escaped = in_string, escaped

    def copy(self) -> JsonScan:
        return JsonScan(self.in_string, self.escaped)

    def feed(self, text: str) -> None:
        for char in text:
            if self.escaped:
                self.escaped = False
            elif self.in_string and char == "\\":
                self.escaped = True
            elif char == '"':
                self.in_string = not self.in_string


class ClosingVocabulary:
    """The token ids of the closing pieces and a way to read a token's text, for one tokenizer."""

    def __init__(self, encode: Callable[[str], Sequence[int]], decode: Callable[[Sequence[int]], str]) -> None:
        self.decode = decode
        self.quote = _single(encode, '"')
        self.order = [token for token in (_single(encode, text) for text in _CLOSERS) if token is not None]
        self._texts: dict[int, str] = {}

    def text(self, token: int) -> str:
        if token not in self._texts:
            self._texts[token] = self.decode([token])
        return self._texts[token]


def _single(encode: Callable[[str], Sequence[int]], text: str) -> int | None:
    ids = list(encode(text))
    return int(ids[0]) if len(ids) == 1 else None


def closing_path(
    matcher: Any, scan: JsonScan, vocab: ClosingVocabulary, fill: Callable[[Any], torch.Tensor]
) -> list[int] | None:
    """Tokens that take ``matcher`` (left unchanged) to a complete reply, or None when the greedy walk finds none.
    ``fill(matcher)`` gives the grammar's allowed-token bitmask (int32, 32 tokens a word) for a matcher."""
    walker, scan = matcher.deep_copy(), scan.copy()
    path: list[int] = []
    while len(path) <= MAX_CLOSING_TOKENS:
        if walker.is_accepting():
            return path
        forced = walker.compute_ff_tokens()
        if forced:
            chosen = forced
        else:
            bitmask = fill(walker)
            token = _pick(bitmask, scan, vocab)
            if token is None:
                return None
            chosen = [token]
        for token in chosen:
            if not walker.consume_token(token):
                return None
            scan.feed(vocab.text(token))
            path.append(token)
    return None


def _allowed(bitmask: torch.Tensor, token: int) -> bool:
    return bool((int(bitmask[token // 32]) >> (token % 32)) & 1)


def _pick(bitmask: torch.Tensor, scan: JsonScan, vocab: ClosingVocabulary) -> int | None:
    # Inside a string every closer is text: only the quote ends it.
    candidates = ([vocab.quote] if vocab.quote is not None else []) if scan.in_string else vocab.order
    for token in candidates:
        if _allowed(bitmask, token):
            return token
    words = torch.nonzero(bitmask).flatten()
    if not len(words):
        return None
    word = int(words[0])
    bits = int(bitmask[word]) & 0xFFFFFFFF
    return word * 32 + (bits & -bits).bit_length() - 1
