"""The backend protocol every backend implements, and discovery of backends by entry point.

Backends register under the entry-point group ``openclaw.backends`` (the built-ins too), so a third-party backend
installs without touching core code::

    [project.entry-points."openclaw.backends"]
    mycloud = "mypkg.backend:MyCloudBackend"

A backend class is constructed with the effective :class:`~openclaw_cli.settings.Settings` and must not do slow
work (loading weights, network calls) before :meth:`Backend.start`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast, runtime_checkable

from pydantic import BaseModel

from openclaw_cli.types import (
    AdamParams,
    Datum,
    FwdBwdResult,
    LossName,
    Message,
    OutputConstraint,
    ParsedAssistant,
    PolicyVersion,
    SampleResult,
    SamplingParams,
    StepResult,
    StreamEvent,
)

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings

SectionT = TypeVar("SectionT", bound=BaseModel)

ENTRY_POINT_GROUP = "openclaw.backends"


class BackendError(RuntimeError):
    """A backend failure worth showing to a user as one clear line (bad credentials, model missing, …).

    ``retryable`` tells callers (the proxy, the trainer) whether trying again later can help; the proxy maps a
    retryable error to 503 with Retry-After and a permanent one to 500/502.
    """

    def __init__(self, message: str, *, retryable: bool = False, status_code: int | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status_code = status_code


class NotYetAvailable(BackendError):
    """The capability exists in the design but has not been built yet; the message says what to use instead."""


@runtime_checkable
class ChatTokenizer(Protocol):
    """Chat-template rendering and completion parsing for one model family, shared by all backends."""

    @property
    def eos_token_ids(self) -> Sequence[int]: ...

    @property
    def context_length(self) -> int: ...

    def render(
        self, messages: list[Message], tools: list[dict[str, Any]] | None = None, *, add_generation_prompt: bool = True
    ) -> list[int]: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def parse_assistant(self, text: str) -> ParsedAssistant:
        """The assistant's text split into content, reasoning and tool calls. A tokenizer may also take a keyword
        ``tools_offered`` (False: leave tool-call-looking text as content); the proxy passes it when it does."""
        ...


BASE_VERSION = 0  # every backend numbers the frozen base model 0 (``sample(..., version=BASE_VERSION)``)


class Serves(Protocol):
    """Sampling a completion, whole or streamed, from a policy version (None = the current one): what a backend
    answers requests with, and what a sampler that keeps versions offers a backend built on it."""

    async def sample(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> SampleResult: ...

    def stream(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> AsyncIterator[StreamEvent]: ...


@runtime_checkable
class Backend(Serves, Protocol):
    name: str

    async def start(self) -> None:
        """Load models / open sessions. Raises BackendError with a clear message on failure."""

    def tokenizer(self) -> ChatTokenizer: ...

    def current_version(self) -> PolicyVersion: ...

    async def compute_logprobs(self, tokens: list[int], *, base: bool = False, start: int = 1) -> list[float | None]:
        """log p(tokens[i] | tokens[:i]) for every position from ``start`` on; entries before it are None (index 0
        always, Tinker's convention). ``base=True`` scores with the frozen base model (the default OPD teacher), else
        the current policy. Callers that read a completion pass its first position: a local model then skips the
        output layer over the prompt."""

    async def forward_backward(
        self, datums: list[Datum], loss: LossName, loss_config: dict[str, float] | None = None
    ) -> FwdBwdResult:
        """Accumulate gradients of the summed loss; several calls before one optim_step accumulate."""

    async def discard_gradients(self) -> None:
        """Drop every gradient accumulated since the last optim_step (a no-op when there is none). The trainer loop
        calls it before each step attempt, so a retry after a failed forward_backward / optim_step never counts a
        datum twice."""

    async def optim_step(self, adam: AdamParams) -> StepResult: ...

    async def publish(self, name: str | None = None) -> PolicyVersion:
        """Make the trained weights the serving policy atomically: requests already running finish on the
        version they started with; later ones get the new version."""

    async def save_state(self, name: str) -> str:
        """Checkpoint weights + optimizer state; returns a path/URI that ``load_state`` accepts."""

    async def load_state(self, path: str) -> PolicyVersion: ...

    async def close(self) -> None: ...


@runtime_checkable
class SupportsVersionControl(Protocol):
    """Optional capability: choose which servable version serves, and publish without serving.

    Used by ``openclaw rollback`` (``activate(n, train_from=True)``) and the promotion gate (``stage`` a new
    version, evaluate it pinned, then ``activate`` it or not). Check with :func:`supports_version_control`; a
    backend without it answers rollback with 501 and cannot run with ``train.promotion_gate``.
    """

    async def stage(self, name: str | None = None) -> PolicyVersion:
        """Like ``publish``, but the new version is only servable when pinned; the current one keeps serving."""

    async def activate(self, version: int, *, train_from: bool = False) -> PolicyVersion:
        """Serve ``version`` from now on. Unknown or no longer kept: a BackendError with a 4xx ``status_code``
        naming the servable versions. ``train_from``: also continue training from that version's weights."""

    def servable_versions(self) -> list[int]:
        """Version numbers ``activate`` accepts now, oldest first (0 = the base model)."""


@runtime_checkable
class SupportsConstrainedDecoding(Protocol):
    """Optional capability: decode under an :class:`~openclaw_cli.types.OutputConstraint` (``SamplingParams.
    constraint``), so the first sample has the demanded form. The proxy asks before each constrained request; a
    backend without it (Tinker) gets plain samples that the proxy checks and resamples
    (:mod:`openclaw_cli.proxy.constraints`)."""

    def accepts_constraint(self, constraint: OutputConstraint) -> str | None:
        """None when sampling with ``constraint`` enforces it; else why not (the proxy then resamples)."""


class DelegatingBackend:
    """The Backend protocol (and version control, where the delegate has it) forwarded to :meth:`delegate`: for a
    backend that picks its implementation at start (e.g. by a mode setting). A subclass sets ``name``, implements
    ``start``, ``close`` and ``delegate`` (raising BackendError before start), and adds what it does itself."""

    name: str

    def delegate(self) -> Backend:
        raise NotImplementedError

    def tokenizer(self) -> ChatTokenizer:
        return self.delegate().tokenizer()

    def current_version(self) -> PolicyVersion:
        return self.delegate().current_version()

    def accepts_constraint(self, constraint: OutputConstraint) -> str | None:
        """The delegate's answer (see :class:`Backend`'s optional ``accepts_constraint``)."""
        check = getattr(self.delegate(), "accepts_constraint", None)
        return f"the {self.name} backend's mode has no constrained decoding" if check is None else check(constraint)

    async def sample(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> SampleResult:
        return await self.delegate().sample(prompt_tokens, params, version)

    def stream(
        self, prompt_tokens: list[int], params: SamplingParams, version: int | None = None
    ) -> AsyncIterator[StreamEvent]:
        return self.delegate().stream(prompt_tokens, params, version)

    async def compute_logprobs(self, tokens: list[int], *, base: bool = False, start: int = 1) -> list[float | None]:
        return await self.delegate().compute_logprobs(tokens, base=base, start=start)

    async def forward_backward(
        self, datums: list[Datum], loss: LossName, loss_config: dict[str, float] | None = None
    ) -> FwdBwdResult:
        return await self.delegate().forward_backward(datums, loss, loss_config)

    async def discard_gradients(self) -> None:
        await self.delegate().discard_gradients()

    async def optim_step(self, adam: AdamParams) -> StepResult:
        return await self.delegate().optim_step(adam)

    async def publish(self, name: str | None = None) -> PolicyVersion:
        return await self.delegate().publish(name)

    async def save_state(self, name: str) -> str:
        return await self.delegate().save_state(name)

    async def load_state(self, path: str) -> PolicyVersion:
        return await self.delegate().load_state(path)

    # -- version control (SupportsVersionControl), where the delegate has it ---------------------------------------

    async def stage(self, name: str | None = None) -> PolicyVersion:
        return await self._version_control().stage(name)

    async def activate(self, version: int, *, train_from: bool = False) -> PolicyVersion:
        return await self._version_control().activate(version, train_from=train_from)

    def servable_versions(self) -> list[int]:
        return self._version_control().servable_versions()

    def _version_control(self) -> SupportsVersionControl:
        delegate = self.delegate()
        if not isinstance(delegate, SupportsVersionControl):
            # Name the implementation: which one the backend picked (e.g. a mode) is why it cannot.
            kind = type(delegate).__name__
            raise BackendError(f"the {self.name} backend ({kind}) cannot switch policy versions", status_code=501)
        return delegate


def none_before(values: Sequence[float | None], start: int) -> list[float | None]:
    """``values`` with the entries before ``start`` set to None (compute_logprobs's contract, for backends whose
    service scores every position anyway)."""
    return [None if i < start else v for i, v in enumerate(values)]


async def completion_logprobs(
    backend: Backend, prompt: list[int], completion: list[int], *, base: bool = False
) -> list[float] | None:
    """log p of each ``completion`` token after ``prompt`` (the frozen base model with ``base``, else the current
    policy), or None when the backend scored fewer positions or left one unscored. Backend errors propagate."""
    scored = await backend.compute_logprobs(prompt + completion, base=base, start=len(prompt))
    tail = scored[len(prompt) :]
    if len(tail) != len(completion) or any(v is None for v in tail):
        return None
    return [float(v) for v in tail if v is not None]


@runtime_checkable
class SupportsAdapters(Protocol):
    """Optional capability: an adapter per owner (``lora.scope = "owner"``, openclaw_cli.adapters).

    ``adapter(name)`` returns the backend as that adapter sees it: ``sample``/``stream`` serve the adapter's versions
    (``current_version`` is its current one; 0, the base model, until its first publish), ``compute_logprobs``
    scores with them, and the training calls, ``publish``, version control and checkpoints act on that adapter
    alone. Adapter :data:`~openclaw_cli.adapters.SHARED_ADAPTER` is the backend itself. A backend without it serves
    one adapter only; launch refuses to start it where owners would get adapters of their own.
    """

    def adapter(self, name: str) -> Backend: ...


def adapter_backend(backend: Backend, name: str) -> Backend:
    """``backend`` as adapter ``name`` sees it (see :class:`SupportsAdapters`); raises BackendError when the backend
    keeps one adapter for everyone and ``name`` is another."""
    from openclaw_cli.adapters import SHARED_ADAPTER

    if name == SHARED_ADAPTER:
        return backend
    views = getattr(backend, "adapter", None)
    if not callable(views):
        raise BackendError(
            f"the {backend.name} backend keeps one adapter for everyone; set lora.scope = 'shared'", status_code=501
        )
    return cast("Backend", views(name))


def supports_adapters(backend: object) -> bool:
    """Whether ``backend`` gives owners adapters of their own (a backend whose support depends on its settings says
    so in a ``serves_adapters`` attribute)."""
    return callable(getattr(backend, "adapter", None)) and bool(getattr(backend, "serves_adapters", True))


def supports_version_control(backend: object) -> bool:
    return all(callable(getattr(backend, name, None)) for name in ("stage", "activate", "servable_versions"))


@dataclass
class BackendInfo:
    name: str
    target: str  # "module:attr" from the entry point
    distribution: str | None


def available_backends() -> dict[str, BackendInfo]:
    """Every backend registered under the entry-point group, by name."""
    found: dict[str, BackendInfo] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        found[ep.name] = BackendInfo(ep.name, ep.value, dist.name if dist is not None else None)
    return found


def load_backend_class(name: str) -> type:
    eps = {ep.name: ep for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name not in eps:
        known = ", ".join(sorted(eps)) or "none (is openclaw-cli installed? try `pip install -e .`)"
        raise BackendError(f"unknown backend {name!r}; installed backends: {known}")
    return eps[name].load()


def plugin_settings(settings: Settings, name: str, section: type[SectionT]) -> SectionT:
    """A third-party backend's own typed settings: the ``[plugins.<name>]`` table of openclaw.toml (also
    ``OPENCLAW_PLUGINS__<NAME>__<KEY>`` and ``--set plugins.<name>.<key>=...``) validated by the backend's pydantic
    model ``section``. A bad value raises SettingsError naming ``plugins.<name>.<key>``, as for built-in sections."""
    from pydantic import ValidationError

    from openclaw_cli.settings import SettingsError

    raw = settings.plugins.get(name, {})
    try:
        return section.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(
            f"plugins.{name}.{'.'.join(str(part) for part in error['loc'])}: {error['msg']}" for error in exc.errors()
        )
        raise SettingsError(f"invalid setting {problems}") from None


def create_backend(settings: Settings) -> Backend:
    """Construct (not start) the backend named by ``settings.backend``."""
    cls = load_backend_class(settings.backend)
    return cls(settings)


@dataclass
class Check:
    """One line of `openclaw backends` / `doctor`: what was checked, whether it passed, and what to do if not."""

    name: str
    ok: bool
    detail: str = ""


def diagnose_backend(name: str, settings: Settings) -> list[Check]:
    """Ask a backend class for its readiness checks (classmethod ``diagnose(settings)``), without starting it.

    A backend without ``diagnose`` is reported as installed with no further checks.
    """
    try:
        cls = load_backend_class(name)
    except Exception as exc:  # a broken third-party entry point must not take the listing down
        return [Check("installed", False, f"cannot import: {exc}")]
    diagnose = getattr(cls, "diagnose", None)
    if diagnose is None:
        return [Check("installed", True, "no readiness checks provided")]
    return list(diagnose(settings))
