"""The conversations of recent Responses API replies, so a request can continue one by ``previous_response_id``."""

from __future__ import annotations

from collections import OrderedDict

from openclaw_cli.types import Message

KEEP_RESPONSES = 256  # stored conversations previous_response_id can continue (in memory only)


class StoredResponses:
    """The conversations (chat messages including the reply) of the newest stored responses, by response id."""

    def __init__(self, keep: int = KEEP_RESPONSES) -> None:
        self.keep = keep
        self._items: OrderedDict[str, list[Message]] = OrderedDict()

    def put(self, response_id: str, conversation: list[Message]) -> None:
        self._items[response_id] = conversation
        while len(self._items) > self.keep:
            self._items.popitem(last=False)

    def get(self, response_id: str) -> list[Message] | None:
        return self._items.get(response_id)
