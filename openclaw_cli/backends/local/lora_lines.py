"""Policy versions served by name as LoRA adapters: what a vLLM engine (in-process, or a server of the team's own)
needs of the local backend's versions.

Each adapter (:mod:`openclaw_cli.adapters`) has a line of versions numbered on its own; version 0 is the base model
in every line. A published version is written once as a PEFT adapter directory under a name never used before
(``openclaw-<run>-<adapter>-v<N>``: a server keeps adapters by name, and reloading changed weights under an old name
serves stale ones), then handed to ``load``; a version that falls out of an adapter's newest ``keep`` is retired,
and ``unload``-ed and deleted once no request still uses it. From the first publish on the base model is served as
an all-zero adapter too (vLLM's CPU LoRA kernels give a LoRA-less request batched with LoRA ones the last slot's
adapter: upstream PR #48421; with every request a LoRA request the base's output is exact on every platform).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import shutil
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from openclaw_cli.adapters import SHARED_ADAPTER, adapter_dirname
from openclaw_cli.backend import BASE_VERSION, BackendError
from openclaw_cli.backends.local.lora_delta import LoraDelta, LoraWeights, write_peft_adapter
from openclaw_cli.types import PolicyVersion

# (adapter directory, never-reused name, what it is for messages) -> what the engine serves it by
Load = Callable[[Path, str, str], Awaitable[Any]]
Unload = Callable[[Any], Awaitable[None]]


@dataclass
class ServedLora:
    info: PolicyVersion
    handle: Any  # what the engine serves this version by (None: the base model, before any publish)
    path: Path | None
    in_flight: int = 0


@dataclass
class _Line:
    current: ServedLora
    published: OrderedDict[int, ServedLora] = field(default_factory=OrderedDict)
    latest: int = BASE_VERSION


def _zero(delta: LoraDelta) -> LoraDelta:
    return LoraDelta(delta.a.new_zeros(delta.a.shape), delta.b.new_zeros(delta.b.shape), delta.scaling)


class LoraLines:
    """Every adapter's servable versions (see the module docstring). ``load`` puts an adapter directory into the
    engine and returns its handle; ``unload`` takes a handle out again (failures there are the engine's LRU having
    done it already, and are ignored)."""

    def __init__(self, *, keep: int, adapter_dir: Path, model_path: Path, load: Load, unload: Unload) -> None:
        self.keep = keep
        self.adapter_dir = Path(adapter_dir)
        self.model_path = Path(model_path)
        # What each adapter's config names as its base (vLLM's filesystem resolver loads an adapter only when this is
        # the server's --model string exactly): the model's path here unless the sampler knows the server's name.
        self.base_model_name = str(model_path)
        self.run = secrets.token_hex(3)  # names stay new across restarts of this process, against a server that stays
        self._load, self._unload = load, unload
        self.base = ServedLora(PolicyVersion(BASE_VERSION, "base"), None, None)
        self._lines: dict[str, _Line] = {}
        self._retired: list[ServedLora] = []
        self._lock = asyncio.Lock()  # version numbers are handed out in publish order

    def _line(self, adapter: str) -> _Line:
        line = self._lines.get(adapter)
        if line is None:
            line = self._lines[adapter] = _Line(current=self.base)
        return line

    def current(self, adapter: str = SHARED_ADAPTER) -> PolicyVersion:
        return self._line(adapter).current.info

    def servable(self, adapter: str = SHARED_ADAPTER) -> list[int]:
        return [BASE_VERSION, *self._line(adapter).published]

    def loaded(self) -> Iterator[ServedLora]:
        """Every version the engine must hold now: the base's adapter, each line's servable versions, and retired
        ones a request still uses (what a server that restarted must be given again)."""
        if self.base.handle is not None:
            yield self.base
        for line in self._lines.values():
            yield from line.published.values()
        yield from (s for s in self._retired if s.in_flight)

    async def publish(
        self,
        weights: LoraWeights,
        name: str | None = None,
        *,
        version: int | None = None,
        make_current: bool = True,
        adapter: str = SHARED_ADAPTER,
    ) -> PolicyVersion:
        """Load ``weights`` as ``adapter``'s next version (``version`` when above every number it used: resuming a
        checkpoint) and, with ``make_current``, serve it from the next request on (else only staged: servable when
        pinned). Loaded before switching, so the first request on it pays nothing."""
        async with self._lock:
            if self.base.handle is None:
                zeros = {
                    k: LoraDelta(d.a.new_zeros(d.a.shape), d.b.new_zeros(d.b.shape), d.scaling)
                    for k, d in weights.items()
                }
                self.base.handle, self.base.path = await self._write_and_load(
                    zeros, "base", "the base model's zero adapter"
                )
            line = self._line(adapter)
            number = version if version is not None and version > line.latest else line.latest + 1
            info = PolicyVersion(number, name or f"v{number}", time.time())
            what = f"the LoRA adapter for version {number}" + ("" if adapter == SHARED_ADAPTER else f" of {adapter}")
            label = "shared" if adapter == SHARED_ADAPTER else adapter_dirname(adapter)
            handle, path = await self._write_and_load(weights, f"{label}-v{number}", what)
            served = ServedLora(info, handle, path)
            line.published[number] = served
            line.latest = number
            if make_current:
                line.current = served
            while len(line.published) > self.keep:
                # Oldest out first, but never the current version (after a rollback it need not be the newest).
                oldest = next(n for n, s in line.published.items() if s is not line.current)
                self._retired.append(line.published.pop(oldest))
        await self._free_retired()
        return info

    async def _write_and_load(self, weights: LoraWeights, label: str, what: str) -> tuple[Any, Path]:
        name = f"openclaw-{self.run}-{label}"
        path = self.adapter_dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        await asyncio.to_thread(write_peft_adapter, weights, path, self.base_model_name)
        try:
            return await self._load(path, name, what), path
        except Exception:
            shutil.rmtree(path, ignore_errors=True)
            raise

    def make_current(self, version: int, adapter: str = SHARED_ADAPTER) -> PolicyVersion:
        """Serve an already servable version of ``adapter`` from now on (rollback, or promoting a staged one)."""
        served = self.find(version, adapter)
        self._line(adapter).current = served
        return served.info

    def find(self, version: int | None, adapter: str = SHARED_ADAPTER) -> ServedLora:
        """``adapter``'s ``version`` (its current one for None); a 400 naming the servable ones when it is not."""
        line = self._line(adapter)
        if version is None:
            return line.current
        if version == BASE_VERSION:
            return self.base
        if version in line.published:
            return line.published[version]
        known = ", ".join(str(v) for v in self.servable(adapter))
        raise BackendError(f"policy version {version} is not servable; servable versions: {known}", status_code=400)

    def acquire(self, version: int | None, adapter: str = SHARED_ADAPTER) -> ServedLora:
        """:meth:`find`, pinned for a request until :meth:`release`."""
        served = self.find(version, adapter)
        served.in_flight += 1
        return served

    async def release(self, served: ServedLora) -> None:
        served.in_flight -= 1
        if served in self._retired:
            await self._free_retired()

    async def _free_retired(self) -> None:
        """Unload retired versions nobody uses any more and delete their adapter dirs."""
        for served in [s for s in self._retired if s.in_flight == 0]:
            self._retired.remove(served)
            if served.handle is not None:
                with contextlib.suppress(Exception):
                    await self._unload(served.handle)
            if served.path is not None:
                shutil.rmtree(served.path, ignore_errors=True)
