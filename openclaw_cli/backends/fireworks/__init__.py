"""The Fireworks backend: serving from a Fireworks deployment, training in one of two modes.

``fireworks.mode``:

- ``stepwise`` (default): the Tinker-compatible step-wise training SDK (``fireworks.training.sdk``, private preview)
  — :class:`openclaw_cli.backends.fireworks.stepwise.FireworksStepwiseBackend`, imported on start;
- ``batch``: judged samples become SFT jobs warm-started from the last LoRA, each new LoRA is loaded onto the
  deployment and then served — :class:`openclaw_cli.backends.fireworks.batch.FireworksBatchBackend`. Works on any
  account.

:class:`FireworksBackend` (the ``fireworks`` entry point) picks the mode on :meth:`FireworksBackend.start` and hands
every protocol call to it, the optional version control (``stage`` / ``activate`` / ``servable_versions``, for
``openclaw rollback`` and ``train.promotion_gate``) included: both modes have it. Construction does no I/O and
imports neither mode.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from openclaw_cli.adapters import SHARED_ADAPTER
from openclaw_cli.backend import BackendError, Check, DelegatingBackend, NotYetAvailable, adapter_backend
from openclaw_cli.settings import env_secret

if TYPE_CHECKING:
    from openclaw_cli.backend import Backend
    from openclaw_cli.settings import Settings

STEPWISE_MODULE = "openclaw_cli.backends.fireworks.stepwise"
TRAINING_SDK_MODULE = "fireworks.training.sdk"
KEY_ENV, ACCOUNT_ENV = "FIREWORKS_API_KEY", "FIREWORKS_ACCOUNT_ID"
_USE_BATCH = "set fireworks.mode = 'batch' (SFT jobs on any account)"


class FireworksBackend(DelegatingBackend):
    """Delegates the Backend protocol to the mode ``settings.fireworks.mode`` selects (see the module docstring).
    Both modes have ``discard_gradients`` (batch: a no-op, its rows are keyed by tokens; stepwise: the Tinker-shaped
    one), so the trainer may retry a failed step here too."""

    name = "fireworks"

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.mode = settings.fireworks.mode
        self.impl: Backend | None = None

    def _make_impl(self) -> Backend:
        if self.mode == "stepwise":
            try:
                module = importlib.import_module(STEPWISE_MODULE)
            except ModuleNotFoundError as exc:
                if exc.name == STEPWISE_MODULE:
                    raise NotYetAvailable(f"the Fireworks step-wise mode is not built yet; {_USE_BATCH}") from exc
                raise BackendError(f"the Fireworks step-wise mode cannot be imported ({exc}); {_USE_BATCH}") from exc
            return module.FireworksStepwiseBackend(self.settings)
        from openclaw_cli.backends.fireworks.batch import FireworksBatchBackend

        return FireworksBatchBackend(self.settings)

    def delegate(self) -> Backend:
        if self.impl is None:
            raise BackendError("the Fireworks backend is not started; call start() first")
        return self.impl

    # -- an adapter per owner (SupportsAdapters): step-wise mode only, a training run per owner -----------------------

    @property
    def serves_adapters(self) -> bool:
        """Whether this mode trains an adapter per owner (openclaw_cli.backend.supports_adapters reads it): step-wise
        mode does, a training run per owner as the Tinker backend does; batch mode does on a multi-LoRA deployment
        (an SFT chain and LoRAs per owner), not on a hot-reload one (it holds one LoRA)."""
        return self.mode == "stepwise" or self.settings.fireworks.addon_mode == "multi_lora"

    @property
    def no_adapters_because(self) -> str | None:
        """Why this mode cannot serve owners apart (None when it can), for the error at start."""
        if self.serves_adapters:
            return None
        from openclaw_cli.backends.fireworks.batch import HOT_RELOAD_HOLDS_ONE_LORA

        return HOT_RELOAD_HOLDS_ONE_LORA

    def adapter(self, name: str) -> Backend:
        if name == SHARED_ADAPTER:
            return self
        if not self.serves_adapters:
            raise BackendError(f"{self.no_adapters_because}, or set lora.scope = 'shared'", status_code=501)
        return adapter_backend(self.delegate(), name)

    # -- lifecycle ------------------------------------------------------------------------------------------------

    async def start(self) -> None:
        if self.impl is not None:
            return
        impl = self._make_impl()
        await impl.start()
        self.impl = impl

    async def close(self) -> None:
        if self.impl is not None:
            await self.impl.close()

    # -- readiness ------------------------------------------------------------------------------------------------

    @classmethod
    def diagnose(cls, settings: Settings) -> list[Check]:
        """SDK, credentials, model/tokenizer settings and the chosen mode's prerequisites. No network calls."""
        fw = settings.fireworks
        checks: list[Check] = []
        installed = find_spec("fireworks") is not None
        version = _version("fireworks-ai") if installed else None
        checks.append(
            Check(
                "sdk installed",
                installed,
                f"fireworks-ai {version}" if installed else "pip install 'openclaw-cli[fireworks]'",
            )
        )
        key = env_secret(fw.api_key, KEY_ENV)
        checks.append(Check("api key", key is not None, "set" if key else f"set {KEY_ENV} or fireworks.api_key"))
        account = fw.account_id or os.environ.get(ACCOUNT_ENV)
        checks.append(Check("account id", bool(account), account or f"set {ACCOUNT_ENV} or fireworks.account_id"))
        from openclaw_cli.backends.fireworks.control import resolve_base_model, resolve_tokenizer_source

        base = resolve_base_model(settings)
        base_hint = "set fireworks.base_model (accounts/.../models/...)"
        checks.append(Check("base model", base is not None, base or base_hint))
        tokenizer = resolve_tokenizer_source(settings)
        checks.append(
            Check("tokenizer", tokenizer is not None, tokenizer or "set fireworks.tokenizer (HF id or local path)")
        )
        deployment = fw.deployment or "created on start (fireworks.max_deployments caps it)"
        checks.append(Check("deployment", True, f"{deployment}; LoRA serving: {fw.addon_mode}"))
        checks.extend(_mode_checks(settings))
        return checks


def _mode_checks(settings: Settings) -> list[Check]:
    fw = settings.fireworks
    if fw.mode == "batch":
        checks = [
            Check(
                "mode",
                True,
                f"batch: an SFT job per {fw.batch_samples} positively judged samples, at most "
                f"{fw.max_steps_per_day} per day",
            )
        ]
        if settings.train.promotion_gate and fw.addon_mode == "hot_reload":
            detail = "needs fireworks.addon_mode = 'multi_lora' (hot reload cannot stage a candidate)"
            checks.append(Check("promotion gate", False, detail))
        return checks
    checks = [Check("mode", True, "stepwise (private preview training SDK)")]
    sdk_ok, detail = _training_sdk_importable()
    checks.append(
        Check(
            "training sdk",
            sdk_ok,
            detail if sdk_ok else f"{detail}; the step-wise SDK is in private preview; or {_USE_BATCH}",
        )
    )
    built = find_spec(STEPWISE_MODULE) is not None
    checks.append(Check("stepwise mode", built, "available" if built else f"not built yet; {_USE_BATCH}"))
    if built and sdk_ok:
        checks.extend(_stepwise_checks(settings))
    return checks


def _stepwise_checks(settings: Settings) -> list[Check]:
    """The step-wise backend's own readiness checks (its base model, tokenizer and training endpoint), minus the
    ones already listed above under the same name."""
    try:
        module = importlib.import_module(STEPWISE_MODULE)
        own = list(module.FireworksStepwiseBackend.diagnose(settings))
    except Exception as exc:  # a broken preview SDK must not take the listing down
        return [Check("stepwise checks", False, f"{type(exc).__name__}: {exc}")]
    already = {"training sdk", "api key"}
    return [Check(f"stepwise {c.name}", c.ok, c.detail) for c in own if c.name not in already]


def _training_sdk_importable() -> tuple[bool, str]:
    try:
        importlib.import_module(TRAINING_SDK_MODULE)
    except Exception as exc:  # an incompatible pre-release can fail with anything, not only ImportError
        return False, f"{TRAINING_SDK_MODULE} does not import ({type(exc).__name__}: {exc})"
    return True, f"{TRAINING_SDK_MODULE} imports"


def _version(distribution: str) -> str | Any:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "unknown version"


__all__ = ["FireworksBackend"]
