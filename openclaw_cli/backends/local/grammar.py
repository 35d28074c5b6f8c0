"""Constrained decoding for the transformers sampler: an llguidance matcher per constrained row, a token mask per step.

Why llguidance (not xgrammar, the other library made for this): on SmolLM2's 49k vocabulary both compute a step's
mask far below a decode step's cost (llguidance 0.04-0.17 ms a token, xgrammar 0.01 ms, against 50-90 ms a step
on 2 cores) and compile a schema in 1-10 ms; llguidance has no dependencies, where xgrammar pulls triton (1 GB, for
GPUs) and tvm-ffi into a CPU install, and llguidance's Lark grammars hold a JSON Schema inline (``%json``), so a tool
call in the model's own frame is one grammar (see :mod:`openclaw_cli.structured_output`).

The mask only shapes what is sampled: a row's raw log-probabilities (what training's importance ratio reads) stay
those of the unmasked policy, its sampling log-probabilities are those of the masked distribution it was drawn from.
The turn's end (any stop token) is allowed exactly when the grammar accepts what was written.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import torch

from openclaw_cli.backend import BackendError
from openclaw_cli.backends.local.budget_close import ClosingVocabulary, JsonScan, closing_path
from openclaw_cli.structured_output import lark_grammar
from openclaw_cli.tokenizer import PYTHON_TAG, THINK_CLOSE, THINK_OPEN, TOOL_CLOSE, TOOL_OPEN
from openclaw_cli.types import OutputConstraint

_MARKERS = (TOOL_OPEN, TOOL_CLOSE, THINK_OPEN, THINK_CLOSE, PYTHON_TAG)


class GrammarMasks:
    """Matchers for one tokenizer and vocabulary; the llguidance tokenizer is built on first use (about 0.4 s)."""

    def __init__(self, chat_tokenizer: Any, vocab_size: int, stop_ids: Sequence[int]) -> None:
        self._chat_tokenizer = chat_tokenizer
        self._vocab_size = vocab_size
        self._stop_ids = torch.tensor(sorted(set(stop_ids)), dtype=torch.long)
        self._ll_tokenizer: Any = None
        self._closing: ClosingVocabulary | None = None

    def grammar(self, constraint: OutputConstraint) -> str:
        return grammar_for(self._chat_tokenizer, constraint)

    def error(self, constraint: OutputConstraint) -> str | None:
        """Why the constraint cannot be enforced here (llguidance rejects its grammar), or None."""
        return grammar_error(self.grammar(constraint))

    def row(self, constraint: OutputConstraint) -> ConstrainedRow:
        """A fresh matcher for one request (raises a 400 BackendError for a grammar llguidance rejects)."""
        import llguidance

        matcher = llguidance.LLMatcher(
            self._tokenizer(), llguidance.LLMatcher.grammar_from_lark(self.grammar(constraint))
        )
        if matcher.is_error():
            raise BackendError(f"the output constraint cannot be enforced: {matcher.get_error()}", status_code=400)
        if self._closing is None:
            self._closing = ClosingVocabulary(self._chat_tokenizer.encode, self._chat_tokenizer.decode)
        return ConstrainedRow(matcher, self._vocab_size, self._stop_ids, self._closing)

    def _tokenizer(self) -> Any:
        if self._ll_tokenizer is None:
            import llguidance.hf

            hf = getattr(self._chat_tokenizer, "hf", None)
            if hf is None:
                raise BackendError("constrained decoding needs a Hugging Face fast tokenizer", status_code=400)
            self._ll_tokenizer = llguidance.hf.from_tokenizer(hf, n_vocab=self._vocab_size)
        return self._ll_tokenizer


_BIT_POSITIONS = torch.arange(32, dtype=torch.int32)


def unpacked(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """llguidance's packed mask (int32 words, token ``i`` at bit ``i % 32`` of word ``i // 32``) as one bool per token.
    Written here rather than with ``llguidance.torch.apply_token_bitmask_inplace``: that one is ``torch.compile``d,
    which on CPU compiles with a C toolchain on first use (the first constrained request took 8-13 s) and mixes a CPU
    mask with the logits' device."""
    return ((bitmask.unsqueeze(-1) >> _BIT_POSITIONS) & 1).flatten()[:vocab_size].bool()


def grammar_for(chat_tokenizer: Any, constraint: OutputConstraint) -> str:
    """The constraint's Lark grammar for this tokenizer (the vLLM sampler hands vLLM the same text)."""
    return lark_grammar(constraint, _single_tokens(chat_tokenizer))


@lru_cache(maxsize=8)
def _single_tokens(chat_tokenizer: Any) -> dict[str, int]:
    """Frame markers the vocabulary holds as one token (often special, so with no text llguidance could match): the
    grammar names them by id, as the template writes them."""
    found = {}
    for marker in _MARKERS:
        ids = chat_tokenizer.encode(marker)
        if len(ids) == 1:
            found[marker] = int(ids[0])
    return found


@lru_cache(maxsize=256)
def grammar_error(grammar: str) -> str | None:
    """Why llguidance rejects a Lark grammar (for example a schema feature it does not support), or None."""
    import llguidance

    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
        llguidance.LLMatcher.grammar_from_lark(grammar)
    )
    if not is_error:
        return None
    return "; ".join(messages)[:300] or "llguidance rejected the grammar"


class ConstrainedRow:
    """One request's matcher: the masked logits to sample its next token from, then the token it took. Near the end of
    its token budget the row writes the shortest completion it finds instead (:mod:`.budget_close`), so the reply
    still parses."""

    CHECK_EVERY = 4  # steps between looks at the closing distance while the budget is far
    CHECK_MARGIN = 24  # tokens of budget beyond the last closing distance from which it is looked at every step
    # One token can lengthen the shortest completion by several (a token that opens an array item or an object with
    # required keys adds that object's shortest completion), so the completion starts before it would exactly fill
    # the budget: at least this many tokens, or the shortest completion of the whole reply (measured at its start)
    # where that is more. Measured: with 8 alone, 1 of 50 schema replies opened an order item 9 tokens from the end.
    CLOSE_MARGIN = 8

    def __init__(self, matcher: Any, vocab_size: int, stop_ids: torch.Tensor, closing: ClosingVocabulary) -> None:
        import llguidance.torch as llg_torch

        self._matcher = matcher
        self._stop_ids = stop_ids
        self._stop_set = frozenset(int(t) for t in stop_ids.tolist())
        self._bitmask = llg_torch.allocate_token_bitmask(1, vocab_size)
        self._scratch = llg_torch.allocate_token_bitmask(1, vocab_size)
        self._fill = llg_torch.fill_next_token_bitmask
        self._vocab = closing
        self._scan = JsonScan()
        self._steps = 0
        self._distance = 0  # tokens the last closing path needed
        self._margin: int | None = None  # CLOSE_MARGIN or the reply's shortest completion, measured at its start
        self._closing: list[int] | None = None  # the completion being written, once the budget calls for it
        self.forced = False  # whether the last mask allowed exactly one token

    def masked(self, logits: torch.Tensor, remaining: int) -> torch.Tensor:
        """A copy of 1-D ``logits`` with every token the grammar forbids at -inf (a stop token allowed exactly when
        the reply so far is complete). ``remaining``: tokens the budget has left, this one included; when they are
        just enough for the shortest completion, only its next token is allowed."""
        self._plan_closing(remaining)
        if self._closing is not None:
            allowed = torch.zeros(logits.shape[-1], dtype=torch.bool)
            allowed[self._closing[:1] if self._closing else self._stop_ids] = True
        else:
            self._fill(self._matcher, self._bitmask, 0)
            allowed = unpacked(self._bitmask[0], logits.shape[-1])
            allowed[self._stop_ids] = self._matcher.is_accepting()
        self.forced = int(allowed.sum()) == 1
        # The mask is built on the CPU (llguidance writes it there) and moved once, to wherever the logits are.
        return logits.float().masked_fill(~allowed.to(logits.device), float("-inf"))

    def _plan_closing(self, remaining: int) -> None:
        self._steps += 1
        if self._closing is not None or self._matcher.is_accepting():
            return
        far = self._margin is not None and remaining > self._distance + self._margin + self.CHECK_MARGIN
        if far and self._steps % self.CHECK_EVERY:
            return
        path = closing_path(self._matcher, self._scan, self._vocab, self._fill_scratch)
        if path is None:
            return
        self._distance = len(path)
        if self._margin is None:
            self._margin = max(self.CLOSE_MARGIN, len(path))
        if remaining <= len(path) + 1 + self._margin:  # the path and a stop token, with room to spare
            self._closing = path

    def _fill_scratch(self, matcher: Any) -> torch.Tensor:
        self._fill(matcher, self._scratch, 0)
        return self._scratch[0]

    def advance(self, token: int) -> None:
        """The row sampled ``token`` (a stop token ends the row and is not fed to the grammar)."""
        if int(token) in self._stop_set:
            return
        if not self._matcher.consume_token(int(token)):
            raise BackendError(
                f"constrained decoding broke: the grammar refused token {token} ({self._matcher.get_error()})"
            )
        self._scan.feed(self._vocab.text(int(token)))
        if self._closing:
            self._closing.pop(0)
