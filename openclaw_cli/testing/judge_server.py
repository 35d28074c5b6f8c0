"""TEST DOUBLE: a tiny OpenAI-compatible judge endpoint on loopback, answering from a script, running no model.

``FakeJudgeServer(answer)`` serves ``POST /v1/chat/completions`` in a background thread on a free 127.0.0.1 port;
``answer(messages)`` returns the reply text, or an ``(http_status, text)`` pair to fail the call (``text`` becomes
the error message, in OpenAI's error format). Point ``judge.base_url`` at :attr:`FakeJudgeServer.base_url` (with any
``judge.model``) and a real :class:`~openclaw_cli.learn.judge.OpenAIJudgeClient` (the openai SDK) talks to it, so a
judge can run beside a separate ``openclaw launch`` process. Every request's messages are kept in :attr:`requests`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Answer = Callable[[list[dict[str, Any]]], "str | tuple[int, str]"]


class FakeJudgeServer:
    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[list[dict[str, Any]]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._reply(404, {"error": {"message": f"no route {self.path}", "type": "not_found"}})
                    return
                messages = body.get("messages", [])
                server.requests.append(messages)
                outcome = server.answer(messages)
                if isinstance(outcome, tuple):
                    status, text = outcome
                    self._reply(status, {"error": {"message": text, "type": "invalid_request_error"}})
                    return
                self._reply(
                    200,
                    {
                        "id": f"judge-{len(server.requests)}",
                        "object": "chat.completion",
                        "created": 0,
                        "model": body.get("model", "judge"),
                        "choices": [
                            {
                                "index": 0,
                                "message": {"role": "assistant", "content": outcome},
                                "finish_reason": "stop",
                            }
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    },
                )

            def _reply(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return None

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="fake-judge", daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> FakeJudgeServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


__all__ = ["FakeJudgeServer"]
