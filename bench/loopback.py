"""The one helper the bench scripts share: serve an ASGI app with uvicorn on a free 127.0.0.1 port."""

from __future__ import annotations

import asyncio
import socket
from typing import Any


async def serve_on_loopback(app: Any) -> tuple[Any, asyncio.Task[None], str]:
    """Start ``app`` and return (server, its task, base URL) once it accepts connections; set
    ``server.should_exit`` and await the task to stop it."""
    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()  # it failed to start: raise why
        await asyncio.sleep(0.01)
    return server, task, f"http://127.0.0.1:{sock.getsockname()[1]}"
