"""Finding user hooks (rollouts, rewards, losses) from a string, without touching core code.

A hook spec is one of:

- an entry-point name registered by an installed package, in the group for that kind of hook::

      [project.entry-points."openclaw.rollouts"]
      calculator = "mypkg.envs:rollout"

- ``package.module:attribute`` (the attribute may be dotted: ``mypkg.envs:MathEnv.rollout``);
- ``path/to/file.py`` or ``path/to/file.py:attribute`` (a file loaded as a module; without an attribute the kind's
  default names are tried: ``env`` then ``rollout`` for rollouts, ``reward`` for rewards, ``loss`` for losses).

Every failure is a :class:`HookError` whose message names the spec and says what to fix.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType
from typing import Any, Literal, Protocol, cast, runtime_checkable

from openclaw_cli.env_training.rollout import RewardFn, RolloutContext, RolloutFn, Trajectory

ROLLOUT_GROUP = "openclaw.rollouts"
REWARD_GROUP = "openclaw.rewards"
LOSS_GROUP = "openclaw.losses"
BUILTIN_LOSSES: tuple[str, ...] = ("ppo", "importance_sampling")

HookKind = Literal["rollout", "reward", "loss"]
_GROUPS: dict[HookKind, str] = {"rollout": ROLLOUT_GROUP, "reward": REWARD_GROUP, "loss": LOSS_GROUP}
_DEFAULT_ATTRS: dict[HookKind, tuple[str, ...]] = {
    "rollout": ("env", "rollout"),
    "reward": ("reward",),
    "loss": ("loss",),
}


class HookError(ValueError):
    """A hook spec that cannot be used; the message says which and why."""


@runtime_checkable
class Env(Protocol):
    """An environment object: ``rollout`` plays one episode; ``close`` (optional, sync or async) frees resources
    once training ends. A plain rollout function is wrapped into one."""

    def rollout(self, ctx: RolloutContext) -> Awaitable[Trajectory] | Trajectory: ...


@dataclass
class FunctionEnv:
    """An :class:`Env` around a plain rollout function."""

    fn: RolloutFn

    def rollout(self, ctx: RolloutContext) -> Awaitable[Trajectory] | Trajectory:
        return self.fn(ctx)


def load_hook(spec: str, kind: HookKind) -> Any:
    """The object a spec names (not yet checked for its shape)."""
    spec = spec.strip()
    if not spec:
        raise HookError(f"empty {kind} spec")
    target, attr = _split_spec(spec)
    if _looks_like_file(target):
        module = _load_file(Path(target), spec)
    elif attr is None:
        return _load_entry_point(spec, kind)
    else:
        module = _import_module(target, spec)
    if attr is not None:
        return _get_attr(module, attr, spec)
    for name in _DEFAULT_ATTRS[kind]:
        if hasattr(module, name):
            return getattr(module, name)
    wanted = " or ".join(repr(n) for n in _DEFAULT_ATTRS[kind])
    raise HookError(f"{spec}: the file defines no {wanted}; name the {kind} explicitly as {spec}:NAME")


def resolve_env(spec: str) -> Env:
    """A rollout function, an object with ``rollout``, or a class (instantiated without arguments)."""
    found = load_hook(spec, "rollout")
    if inspect.isclass(found):
        try:
            found = found()
        except TypeError as exc:
            raise HookError(f"{spec}: an env class must be constructible without arguments ({exc})") from None
    if isinstance(found, Env) and callable(found.rollout):
        _require_one_argument(found.rollout, spec, "an env's rollout method", "the RolloutContext")
        return found
    if callable(found):
        _require_one_argument(found, spec, "a rollout function", "the RolloutContext")
        return FunctionEnv(cast(RolloutFn, found))
    raise HookError(f"{spec}: expected a rollout function or an object with a rollout method, got {_kind(found)}")


def resolve_reward(spec: str) -> RewardFn:
    found = load_hook(spec, "reward")
    if not callable(found):
        raise HookError(f"{spec}: expected a reward function (trajectory -> float), got {_kind(found)}")
    _require_one_argument(found, spec, "a reward function", "the Trajectory")
    return cast(RewardFn, found)


def resolve_loss(spec: str) -> str | Callable[..., Any]:
    """A built-in backend loss name (``ppo``, ``importance_sampling``), or a custom loss function."""
    if spec.strip() in BUILTIN_LOSSES:
        return spec.strip()
    found = load_hook(spec, "loss")
    if not callable(found):
        raise HookError(f"{spec}: expected a loss function (LossInputs -> tensor), got {_kind(found)}")
    _require_one_argument(found, spec, "a custom loss", "the LossInputs")
    return cast(Callable[..., Any], found)


async def maybe_await(value: Any) -> Any:
    """Hooks may be sync or async; this takes either result."""
    return await value if inspect.isawaitable(value) else value


# -- internals ------------------------------------------------------------------------------------------------


def _split_spec(spec: str) -> tuple[str, str | None]:
    # The last ':' separates the attribute; a Windows drive letter ("C:\\...") is not an attribute separator.
    head, sep, tail = spec.rpartition(":")
    if not sep or (len(head) == 1 and head.isalpha() and tail[:1] in ("\\", "/")):
        return spec, None
    if not head or not tail:
        raise HookError(f"{spec}: expected MODULE:NAME, PATH.py[:NAME] or an entry-point name")
    return head, tail


def _looks_like_file(target: str) -> bool:
    return target.endswith(".py") or "/" in target or "\\" in target


def _load_file(path: Path, spec: str) -> ModuleType:
    resolved = path.expanduser().resolve()
    if not resolved.is_file():
        raise HookError(f"{spec}: file not found: {path}")
    if resolved.suffix != ".py":
        raise HookError(f"{spec}: {path} is not a .py file")
    # One module per file path, kept in sys.modules so dataclasses, pickling and a second resolve all see it.
    name = f"openclaw_hook_{resolved.stem}_{abs(hash(str(resolved))):x}"
    if name in sys.modules:
        return sys.modules[name]
    loader_spec = importlib.util.spec_from_file_location(name, resolved)
    if loader_spec is None or loader_spec.loader is None:
        raise HookError(f"{spec}: cannot load {path} as a module")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module
    try:
        loader_spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[name]
        raise HookError(f"{spec}: syntax error in {path} line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        del sys.modules[name]
        raise HookError(f"{spec}: importing {path} failed: {type(exc).__name__}: {exc}") from exc
    return module


def _import_module(name: str, spec: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise HookError(f"{spec}: no module named {name!r} (is it installed, or on PYTHONPATH?)") from None
        raise HookError(f"{spec}: module {name!r} needs {exc.name!r}, which is not installed") from None
    except SyntaxError as exc:
        raise HookError(f"{spec}: syntax error in {exc.filename} line {exc.lineno}: {exc.msg}") from None
    except Exception as exc:
        raise HookError(f"{spec}: importing {name!r} failed: {type(exc).__name__}: {exc}") from exc


def _get_attr(module: ModuleType, attr: str, spec: str) -> Any:
    found: Any = module
    for part in attr.split("."):
        if not hasattr(found, part):
            public = sorted(n for n, v in vars(module).items() if not n.startswith("_") and callable(v))
            hint = f"; it defines {', '.join(public[:12])}" if public else ""
            raise HookError(f"{spec}: {module.__name__} has no attribute {attr!r}{hint}")
        found = getattr(found, part)
    return found


def _load_entry_point(name: str, kind: HookKind) -> Any:
    group = _GROUPS[kind]
    found = {ep.name: ep for ep in entry_points(group=group)}
    if name not in found:
        known = ", ".join(sorted(found)) or "none"
        builtins = f"; built-in losses: {', '.join(BUILTIN_LOSSES)}" if kind == "loss" else ""
        raise HookError(
            f"{name}: not a MODULE:NAME or PATH.py spec, and no {kind} named {name!r} is registered under the "
            f"entry-point group {group!r} (registered: {known}{builtins})"
        )
    try:
        return found[name].load()
    except Exception as exc:
        raise HookError(f"{name}: the entry point {found[name].value!r} cannot load: {exc}") from exc


def _require_one_argument(fn: Callable[..., Any], spec: str, what: str, argument: str) -> None:
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # builtins and some C callables have no signature: let the call itself decide
    try:
        signature.bind(object())
    except TypeError:
        raise HookError(
            f"{spec}: {what} must take exactly one argument ({argument}); its signature is {signature}"
        ) from None


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"[:120]
