"""The lesson and feedback routes: what the bot took from its users, in their hands.

- ``GET /v1/openclaw/lessons``: the caller's lessons (their owner's: see :mod:`openclaw_cli.lesson_prompt`), each with
  status, origin, the turns it came from, how many turns it shaped and its evidence. ``?status=active`` filters.
- ``GET /v1/openclaw/lessons/{id}``: one of them.
- ``POST /v1/openclaw/lessons`` with ``{"text": "..."}``: teach one directly; active from the next request.
- ``DELETE /v1/openclaw/lessons/{id}``: forget it (no longer served, text erased; weights already trained keep it
  until a rollback, and the answer says so).
- ``POST /v1/openclaw/feedback`` with ``{"turn_id": N | "response_id": "..." | "session_id": "...", "rating": "up" |
  "down" (or 1 / -1), "text": "..."}``: a rating that overrides the judge's verdict of that turn (a session: its
  latest main-line turn), its text the turn's hint and a lesson candidate.

Bad input is a 400 (404 for an unknown lesson or turn) in the OpenAI error format, and changes nothing. Without a
store behind the proxy (a test app) the routes answer 501.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from openclaw_cli.lesson_prompt import FORGET_NOTE, LessonError
from openclaw_cli.proxy.errors import ProxyError
from openclaw_cli.proxy.respond import request_owner
from openclaw_cli.proxy.state import ProxyState, proxy_state
from openclaw_cli.proxy.validation import read_json_body

LESSONS_PATH = "/v1/openclaw/lessons"
FEEDBACK_PATH = "/v1/openclaw/feedback"
MAX_BODY_BYTES = 16 * 1024
_RATINGS = {"up": 1, "down": -1, "+1": 1, "-1": -1, "good": 1, "bad": -1}
_STATUSES = ("candidate", "active", "retired", "rejected", "forgotten")


class LessonDesk(Protocol):
    """What the routes need (implemented by :class:`openclaw_cli.learn.lessons.LessonKeeper`)."""

    store: Any

    async def add(self, owner: str, text: str) -> Any: ...
    async def forget(self, lesson_id: int, owner: str | None) -> Any: ...
    async def get(self, lesson_id: int, owner: str | None) -> Any: ...
    async def feedback(
        self, turn_id: int, rating: int, text: str | None, owner: str | None = None
    ) -> dict[str, Any]: ...


def _desk(state: ProxyState) -> LessonDesk:
    desk = state.lesson_desk
    if desk is None:
        raise ProxyError(
            501, "lessons need the capture store: run `openclaw serve` or `openclaw launch`", kind="unsupported"
        )
    return desk


def _owner(request: Request, state: ProxyState, body: dict[str, Any] | None = None) -> str:
    return request_owner(request, state.settings, body or {})


async def _call(desk: LessonDesk, coro: Any) -> Any:
    try:
        return await coro
    except LessonError as exc:
        raise ProxyError(exc.status, str(exc), kind="not_found" if exc.status == 404 else "invalid_request") from None


def _lesson_id(request: Request) -> int:
    raw = request.path_params["lesson_id"]
    if not raw.isdigit():
        raise ProxyError(400, f"lesson id must be a number, got {raw!r}", param="lesson_id")
    return int(raw)


async def list_lessons(request: Request) -> JSONResponse:
    state = proxy_state(request)
    desk = _desk(state)
    status = request.query_params.get("status")
    if status is not None and status not in _STATUSES:
        raise ProxyError(400, f"status must be one of {', '.join(_STATUSES)}, got {status!r}", param="status")
    owner = _owner(request, state)
    lessons = await asyncio.to_thread(desk.store.lessons, owner=owner, statuses=[status] if status else None)
    return JSONResponse({"owner": owner, "lessons": [lesson.to_json() for lesson in lessons]})


async def get_lesson(request: Request) -> JSONResponse:
    state = proxy_state(request)
    desk = _desk(state)
    lesson = await _call(desk, desk.get(_lesson_id(request), _owner(request, state)))
    return JSONResponse(lesson.to_json())


async def add_lesson(request: Request) -> JSONResponse:
    state = proxy_state(request)
    desk = _desk(state)
    body = await read_json_body(request, MAX_BODY_BYTES)
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ProxyError(400, "'text' must be the lesson as a non-empty string", param="text")
    lesson = await _call(desk, desk.add(_owner(request, state), text))
    return JSONResponse(lesson.to_json(), status_code=201)


async def forget_lesson(request: Request) -> JSONResponse:
    state = proxy_state(request)
    desk = _desk(state)
    lesson = await _call(desk, desk.forget(_lesson_id(request), _owner(request, state)))
    return JSONResponse({**lesson.to_json(), "note": FORGET_NOTE})


def _rating(value: Any) -> int:
    if isinstance(value, bool):
        value = None
    if isinstance(value, int) and value in (1, -1):
        return value
    if isinstance(value, str) and value.strip().lower() in _RATINGS:
        return _RATINGS[value.strip().lower()]
    raise ProxyError(400, '\'rating\' must be "up" or "down" (or 1 / -1)', param="rating")


async def _feedback_turn(desk: LessonDesk, body: dict[str, Any]) -> int:
    store = desk.store
    turn_id, response_id, session_id = body.get("turn_id"), body.get("response_id"), body.get("session_id")
    given = [name for name, v in (("turn_id", turn_id), ("response_id", response_id), ("session_id", session_id)) if v]
    if len(given) != 1:
        raise ProxyError(400, "name exactly one of 'turn_id', 'response_id' or 'session_id'", param="turn_id")
    if turn_id is not None:
        if isinstance(turn_id, bool) or not isinstance(turn_id, int):
            raise ProxyError(400, "'turn_id' must be an integer", param="turn_id")
        return turn_id
    if response_id is not None:
        if not isinstance(response_id, str):
            raise ProxyError(400, "'response_id' must be a string", param="response_id")
        found = await asyncio.to_thread(store.turn_by_request_id, response_id)
        if found is None:
            raise ProxyError(404, f"no captured reply with id {response_id!r}", kind="not_found", param="response_id")
        return int(found)
    if not isinstance(session_id, str):
        raise ProxyError(400, "'session_id' must be a string", param="session_id")
    turns = await asyncio.to_thread(store.main_turns_of_session, session_id)
    if not turns:
        raise ProxyError(404, f"no main-line turn in session {session_id!r}", kind="not_found", param="session_id")
    return int(turns[-1])


async def feedback(request: Request) -> JSONResponse:
    state = proxy_state(request)
    desk = _desk(state)
    body = await read_json_body(request, MAX_BODY_BYTES)
    rating = _rating(body.get("rating"))
    text = body.get("text")
    if text is not None and not isinstance(text, str):
        raise ProxyError(400, "'text' must be a string", param="text")
    turn_id = await _feedback_turn(desk, body)
    owner = _owner(request, state, body)
    return JSONResponse(await _call(desk, desk.feedback(turn_id, rating, text, owner)), status_code=201)


routes = [
    Route(LESSONS_PATH, list_lessons, methods=["GET"]),
    Route(LESSONS_PATH, add_lesson, methods=["POST"]),
    Route(LESSONS_PATH + "/{lesson_id}", get_lesson, methods=["GET"]),
    Route(LESSONS_PATH + "/{lesson_id}", forget_lesson, methods=["DELETE"]),
    Route(FEEDBACK_PATH, feedback, methods=["POST"]),
]
