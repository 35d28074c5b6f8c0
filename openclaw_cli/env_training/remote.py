"""Environments that live in another process or machine (SWE sandboxes, GUI emulators), over a small JSON protocol.

The environment server answers four POST routes (JSON in, JSON out); messages and tools are OpenAI chat format:

- ``/reset``  ``{"seed": int, "env_args": {..}}`` -> ``{"episode_id": str, "messages": [..], "tools": [..]}``
  (``tools`` optional): a fresh episode and the conversation the agent starts from.
- ``/step``   ``{"episode_id": str, "message": {assistant message}}`` -> ``{"messages": [..], "done": bool}``:
  the server applies the agent's reply (runs its tool calls) and returns the new messages (tool results, a user
  turn); ``done`` ends the episode.
- ``/reward`` ``{"episode_id": str}`` -> ``{"reward": float, "solved": bool | null, "info": {..}}``
- ``/close``  ``{"episode_id": str}`` -> ``{}``: the server may free the episode (failures here are ignored).

:data:`env` is a ready rollout hook for any server speaking it::

    openclaw train --env openclaw_cli.env_training.remote:env --env-arg url=http://127.0.0.1:8765 --env-arg max_turns=8

Members of a GRPO group reset with the same seed (``ctx.seed``), so a server that picks its task from the seed
gives the whole group the same task.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from typing import Any, cast
from urllib.parse import urlsplit

import httpx

from openclaw_cli.env_training.rollout import RolloutContext, Trajectory
from openclaw_cli.loopback import is_loopback
from openclaw_cli.types import Message

DEFAULT_MAX_TURNS = 8
DEFAULT_TIMEOUT_S = 60.0


class RemoteEnvError(RuntimeError):
    """The environment server could not be reached or answered something outside the protocol."""


@dataclass
class Episode:
    episode_id: str
    messages: list[Message]
    tools: list[dict[str, Any]] | None = None


@dataclass
class EnvStep:
    messages: list[Message]
    done: bool


@dataclass
class EnvReward:
    reward: float
    solved: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)


class RemoteEnvClient:
    """Async client of the protocol above (one per event loop; close with :meth:`aclose`)."""

    def __init__(self, base_url: str, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.base_url = base_url.rstrip("/")
        # A server on loopback is never reached through an HTTP proxy from the environment.
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s, trust_env=not _is_loopback(base_url))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def reset(self, seed: int, env_args: dict[str, str] | None = None) -> Episode:
        body = await self._post("/reset", {"seed": seed, "env_args": dict(env_args or {})})
        episode_id, messages = body.get("episode_id"), body.get("messages")
        if not isinstance(episode_id, str) or not _is_message_list(messages):
            raise RemoteEnvError(f"{self.base_url}/reset must return episode_id (string) and messages (list)")
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            raise RemoteEnvError(f"{self.base_url}/reset returned tools that are not a list")
        return Episode(episode_id, list(cast(list[Message], messages)), tools)

    async def step(self, episode_id: str, message: Message) -> EnvStep:
        body = await self._post("/step", {"episode_id": episode_id, "message": message})
        messages, done = body.get("messages", []), body.get("done")
        if not _is_message_list(messages) or not isinstance(done, bool):
            raise RemoteEnvError(f"{self.base_url}/step must return messages (list) and done (bool)")
        return EnvStep(list(messages), done)

    async def reward(self, episode_id: str) -> EnvReward:
        body = await self._post("/reward", {"episode_id": episode_id})
        reward, solved, info = body.get("reward"), body.get("solved"), body.get("info", {})
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise RemoteEnvError(f"{self.base_url}/reward must return a numeric reward, got {reward!r}")
        if solved is not None and not isinstance(solved, bool):
            raise RemoteEnvError(f"{self.base_url}/reward returned solved={solved!r}; expected true, false or null")
        return EnvReward(float(reward), solved, info if isinstance(info, dict) else {})

    async def close_episode(self, episode_id: str) -> None:
        # Freeing an episode is the server's courtesy; the rollout's result stands either way.
        with contextlib.suppress(RemoteEnvError):
            await self._post("/close", {"episode_id": episode_id})

    async def _post(self, path: str, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            response = await self._http.post(path, json=payload)
        except httpx.HTTPError as exc:
            raise RemoteEnvError(f"cannot reach the environment server at {self.base_url}{path}: {exc}") from None
        if response.status_code >= 400:
            raise RemoteEnvError(
                f"{self.base_url}{path} answered HTTP {response.status_code}: {response.text[:300].strip()}"
            )
        try:
            body = response.json()
        except ValueError:
            raise RemoteEnvError(f"{self.base_url}{path} did not answer JSON") from None
        if not isinstance(body, dict):
            raise RemoteEnvError(f"{self.base_url}{path} answered {type(body).__name__}, expected a JSON object")
        return body


async def remote_episode(ctx: RolloutContext, client: RemoteEnvClient, *, max_turns: int) -> Trajectory:
    """Play one episode: reset, then reply / step until the server says done or ``max_turns`` replies, then
    ask for the reward."""
    episode = await client.reset(ctx.seed, ctx.env_args)
    try:
        messages = list(episode.messages)
        done = False
        for _ in range(max_turns):
            reply = await ctx.policy.chat(messages, episode.tools)
            messages.append(reply.message)
            outcome = await client.step(episode.episode_id, reply.message)
            messages.extend(outcome.messages)
            if outcome.done:
                done = True
                break
        scored = await client.reward(episode.episode_id)
    finally:
        await client.close_episode(episode.episode_id)
    return ctx.trajectory(scored.reward, solved=scored.solved, info={**scored.info, "done": done})


class RemoteEnv:
    """A rollout hook over :class:`RemoteEnvClient`. The server URL comes from the constructor or from
    ``--env-arg url=...``; ``--env-arg max_turns=N`` caps the agent's replies per episode."""

    def __init__(self, url: str | None = None, *, max_turns: int = DEFAULT_MAX_TURNS) -> None:
        self.url = url
        self.max_turns = max_turns
        self._client: RemoteEnvClient | None = None
        self._lock = asyncio.Lock()

    async def rollout(self, ctx: RolloutContext) -> Trajectory:
        client = await self._connect(ctx)
        max_turns = int(ctx.env_args.get("max_turns", self.max_turns))
        return await remote_episode(ctx, client, max_turns=max_turns)

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def _connect(self, ctx: RolloutContext) -> RemoteEnvClient:
        async with self._lock:
            if self._client is None:
                url = self.url or ctx.env_args.get("url")
                if not url:
                    raise RemoteEnvError("no environment server: pass --env-arg url=http://HOST:PORT")
                self._client = RemoteEnvClient(url)
            return self._client


env = RemoteEnv()
"""``--env openclaw_cli.env_training.remote:env --env-arg url=http://HOST:PORT``"""


def _is_message_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(m, dict) and "role" in m for m in value)


def _is_loopback(url: str) -> bool:
    return is_loopback(urlsplit(url).hostname or "")
