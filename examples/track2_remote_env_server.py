"""A tiny environment server for ``examples/track2_remote_env.py``: a SWE-style "fix the config file" task.

    python examples/track2_remote_env_server.py --port 8765      # then, in another shell:
    openclaw train --env examples/track2_remote_env.py --env-arg url=http://127.0.0.1:8765

It speaks the JSON protocol of :mod:`openclaw_cli.env_training.remote` (``/reset``, ``/step``, ``/reward``, ``/close``)
with only the standard library, to show how little an environment needs: each episode holds an in-memory workspace
with ``settings.ini``; the task (chosen from the reset seed) is to change one setting. The agent has the tools
``read_file`` and ``write_file``; a reply without tool calls ends the episode. The reward is 1.0 when the file
parses and holds exactly the requested change (every other setting as it was), else 0.

Binds 127.0.0.1 by default; it executes nothing the agent sends, it only stores file text.
"""

from __future__ import annotations

import argparse
import configparser
import contextlib
import json
import random
import threading
import uuid
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

CONFIG_FILE = "settings.ini"
ORIGINAL = {"name": "demo", "debug": "true", "workers": "4", "log_level": "info"}
CHANGES = [("debug", "false"), ("workers", "8"), ("log_level", "warning"), ("name", "production")]
MAX_STEPS = 16  # the server's own cap, whatever the client's max_turns
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the project.",
            "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Replace a file's whole content.",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path", "content"],
            },
        },
    },
]


def render_config(values: dict[str, str]) -> str:
    return "[app]\n" + "".join(f"{key} = {value}\n" for key, value in values.items())


@dataclass
class Episode:
    key: str
    value: str
    files: dict[str, str] = field(default_factory=lambda: {CONFIG_FILE: render_config(ORIGINAL)})
    steps: int = 0
    done: bool = False

    def run_tool(self, name: str, arguments: dict[str, Any]) -> str:
        path = arguments.get("path")
        if not isinstance(path, str):
            return "error: 'path' must be a string"
        if name == "read_file":
            return self.files.get(path, f"error: no such file: {path}")
        if name == "write_file":
            content = arguments.get("content")
            if not isinstance(content, str):
                return "error: 'content' must be a string"
            self.files[path] = content
            return f"wrote {len(content)} characters to {path}"
        return f"error: unknown tool {name!r}"

    def reward(self) -> tuple[float, dict[str, Any]]:
        parser = configparser.ConfigParser()
        try:
            parser.read_string(self.files.get(CONFIG_FILE, ""))
            found = dict(parser["app"])
        except (configparser.Error, KeyError) as exc:
            return 0.0, {"error": f"{CONFIG_FILE} does not parse: {type(exc).__name__}"}
        wanted = {**ORIGINAL, self.key: self.value}
        return (1.0 if found == wanted else 0.0), {"found": found}


class EnvState:
    def __init__(self) -> None:
        self.episodes: dict[str, Episode] = {}
        self.lock = threading.Lock()

    def reset(self, body: dict[str, Any]) -> dict[str, Any]:
        seed = body.get("seed", 0)
        key, value = random.Random(seed).choice(CHANGES)
        episode_id = uuid.uuid4().hex
        with self.lock:
            self.episodes[episode_id] = Episode(key, value)
        task = f"In {CONFIG_FILE}, set {key} to {value} and leave everything else as it is. Reply DONE when finished."
        return {"episode_id": episode_id, "messages": [{"role": "user", "content": task}], "tools": TOOLS}

    def step(self, body: dict[str, Any]) -> dict[str, Any]:
        episode = self._episode(body)
        message = body.get("message") or {}
        calls = message.get("tool_calls") or []
        out = []
        for call in calls:
            function = call.get("function", {})
            try:
                arguments = json.loads(function.get("arguments") or "{}")
            except json.JSONDecodeError:
                arguments = None
            result = (
                episode.run_tool(str(function.get("name")), arguments)
                if isinstance(arguments, dict)
                else "error: arguments must be a JSON object"
            )
            out.append({"role": "tool", "tool_call_id": call.get("id"), "content": result})
        episode.steps += 1
        episode.done = not calls or episode.steps >= MAX_STEPS
        return {"messages": out, "done": episode.done}

    def reward(self, body: dict[str, Any]) -> dict[str, Any]:
        episode = self._episode(body)
        reward, info = episode.reward()
        return {"reward": reward, "solved": reward == 1.0, "info": info}

    def close(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            self.episodes.pop(str(body.get("episode_id")), None)
        return {}

    def _episode(self, body: dict[str, Any]) -> Episode:
        with self.lock:
            episode = self.episodes.get(str(body.get("episode_id")))
        if episode is None:
            raise LookupError(f"unknown episode {body.get('episode_id')!r}")
        return episode


class _Handler(BaseHTTPRequestHandler):
    state: EnvState  # set on the subclass made per server

    def do_POST(self) -> None:
        routes = {"/reset": self.state.reset, "/step": self.state.step, "/reward": self.state.reward}
        routes["/close"] = self.state.close
        route = routes.get(self.path)
        if route is None:
            self._reply(404, {"error": f"no route {self.path}"})
            return
        try:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            self._reply(200, route(body))
        except LookupError as exc:
            self._reply(404, {"error": str(exc)})
        except ValueError as exc:
            self._reply(400, {"error": str(exc)})

    def _reply(self, status: int, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # quiet: one line per request would drown the training progress


class EnvServer:
    """The server in a background thread: ``start()`` returns its URL, ``stop()`` shuts it down."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0) -> None:
        handler = type("Handler", (_Handler,), {"state": EnvState()})
        self._server = ThreadingHTTPServer((host, port), handler)
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> str:
        self._thread = threading.Thread(target=self._server.serve_forever, name="env-server", daemon=True)
        self._thread.start()
        return self.url

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted."""
        try:
            self._server.serve_forever()
        finally:
            self._server.server_close()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    args = parser.parse_args()
    server = EnvServer(args.host, args.port)
    print(f"environment server on {server.url} (Ctrl-C stops)")
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
