"""The Tinker backend: the backend protocol on Thinking Machines' Tinker service, through the ``tinker`` SDK.

A thin binding of :class:`openclaw_cli.backends.tinker_shaped.TinkerShapedBackend` (which holds all the logic and
documents serving, streaming, training and checkpoints). What is Tinker-specific lives here: credentials
(``tinker.api_key`` or ``TINKER_API_KEY``; ``tinker.base_url`` or ``TINKER_BASE_URL``), the SDK's types and error
classes, and the readiness checks for ``openclaw backends`` / ``doctor``.

Tinker samples a whole completion per call, so a streamed reply arrives in one piece once sampling ends.

``service_client_factory`` replaces ``tinker.ServiceClient`` (it is called with ``base_url=`` and ``api_key=``);
tests pass :class:`openclaw_cli.testing.tinker_double.TinkerDouble`'s factory there.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Callable
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any, ClassVar

from openclaw_cli.backend import BackendError, Check
from openclaw_cli.backends.tinker_shaped import TinkerShapedBackend, TinkerShapedSdk
from openclaw_cli.backends.tinker_wire import backend_error
from openclaw_cli.settings import env_secret

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings

KEY_ENV = "TINKER_API_KEY"
BASE_URL_ENV = "TINKER_BASE_URL"
INSTALL_HINT = "pip install 'openclaw-cli[tinker]'"
EXAMPLE_MODEL = "Qwen/Qwen3-4B-Instruct-2507"

# Base models Tinker listed for LoRA training and sampling (its "model lineup" page, checked for tinker 0.38).
# The lineup changes over time: `diagnose(settings, online=True)` asks the service instead of trusting this list.
SUPPORTED_MODELS: tuple[str, ...] = (
    "Qwen/Qwen3-235B-A22B-Instruct-2507",
    "Qwen/Qwen3-30B-A3B-Instruct-2507",
    "Qwen/Qwen3-30B-A3B",
    "Qwen/Qwen3-30B-A3B-Base",
    "Qwen/Qwen3-32B",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen3-8B-Base",
    "Qwen/Qwen3-4B-Instruct-2507",
    "meta-llama/Llama-3.3-70B-Instruct",
    "meta-llama/Llama-3.1-70B",
    "meta-llama/Llama-3.1-8B",
    "meta-llama/Llama-3.1-8B-Instruct",
    "meta-llama/Llama-3.2-3B",
    "meta-llama/Llama-3.2-1B",
)
# Families Tinker serves whose exact names are not in the list above (newer releases): reported as plausible.
SUPPORTED_FAMILIES: tuple[tuple[str, str], ...] = (
    ("Qwen/Qwen3.5-", "Qwen3.5"),
    ("Qwen/Qwen3-", "Qwen3"),
    ("meta-llama/Llama-3", "Llama 3"),
)
_ONLINE_TIMEOUT_S = 15.0


def _tinker_service_client(*, base_url: str | None, api_key: str | None) -> Any:
    import tinker
    from tinker.auth import tinker_has_credentials

    # The SDK only notices a missing credential on its first request, after the tokenizer download; say it now.
    if api_key is None and not tinker_has_credentials():
        raise BackendError(f"no Tinker credentials: set {KEY_ENV} (a tml-... key) or tinker.api_key", status_code=401)
    return tinker.ServiceClient(base_url=base_url, api_key=api_key)


def _tinker_rest_client(*, base_url: str | None, api_key: str | None) -> Any:
    import tinker

    return tinker.RestClient(base_url=base_url, api_key=api_key)


class TinkerBackend(TinkerShapedBackend):
    """The Backend protocol on Tinker (see the module docstring and :mod:`openclaw_cli.backends.tinker_shaped`)."""

    name: ClassVar[str] = "tinker"

    def __init__(self, settings: Settings, *, service_client_factory: Callable[..., Any] | None = None) -> None:
        self._api_key = env_secret(settings.tinker.api_key, KEY_ENV)
        super().__init__(
            settings,
            keep_versions=settings.tinker.keep_versions,
            sample_timeout_s=settings.tinker.sample_timeout_s,
            redact=[self._api_key] if self._api_key else [],
        )
        self._service_client_factory = service_client_factory or _tinker_service_client

    def make_sdk(self) -> TinkerShapedSdk:
        try:
            import tinker
            from tinker import types
        except ImportError as exc:
            raise BackendError(f"the tinker SDK is not installed ({exc}); {INSTALL_HINT}") from exc
        factory, base_url, api_key = self._service_client_factory, self.settings.tinker.base_url, self._api_key
        return TinkerShapedSdk(
            title="Tinker",
            key_env=KEY_ENV,
            types=types,
            # api_key None lets the SDK fall back to its own sources (TINKER_CREDENTIAL_CMD, credentials file).
            connect=lambda: factory(base_url=base_url, api_key=api_key),
            publish_mode="save_weights_and_get_sampling_client",
            timeout_errors=(tinker.APITimeoutError,),
            connection_errors=(tinker.APIConnectionError,),
            close_service=lambda service: service.close("success"),
        )

    @classmethod
    def diagnose(
        cls,
        settings: Settings,
        *,
        online: bool = False,
        rest_client_factory: Callable[..., Any] | None = None,
    ) -> list[Check]:
        """SDK installed, key set, model known; with ``online=True`` and a key, also ask the service (through
        ``rest_client_factory``, default ``tinker.RestClient``) whether it offers the model. Offline by default:
        listing backends must never wait on the network."""
        installed = find_spec("tinker") is not None
        checks = [
            Check(
                "sdk installed",
                installed,
                f"tinker {importlib.metadata.version('tinker')}" if installed else INSTALL_HINT,
            )
        ]
        key = env_secret(settings.tinker.api_key, KEY_ENV)
        source = "tinker.api_key" if settings.tinker.api_key is not None and key else KEY_ENV
        detail = f"from {source}" if key else f"set {KEY_ENV} or tinker.api_key"
        checks.append(Check("api key", key is not None, detail))
        base_url = settings.tinker.base_url or os.environ.get(BASE_URL_ENV)
        if base_url:
            checks.append(Check("service url", True, base_url))
        checks.append(model_check(settings.model))
        if online and key and installed:
            checks.append(_online_model_check(settings, key, rest_client_factory or _tinker_rest_client))
        return checks


def model_check(model: str | None) -> Check:
    """Whether ``model`` is a base model Tinker is known to offer (static list, then known families)."""
    spec = (model or "").strip()
    if not spec:
        return Check("model", False, f"set --model to a Tinker base model, e.g. {EXAMPLE_MODEL}")
    if spec in SUPPORTED_MODELS:
        return Check("model", True, f"{spec} (in Tinker's model lineup)")
    for prefix, family in SUPPORTED_FAMILIES:
        if spec.startswith(prefix):
            return Check("model", True, f"{spec}: {family} family, not in the built-in list; check the Tinker console")
    return Check(
        "model",
        False,
        f"{spec} is not a model Tinker is known to offer (Qwen3, Qwen3.5 and Llama 3 families, e.g. {EXAMPLE_MODEL})",
    )


def _online_model_check(settings: Settings, key: str, rest_client_factory: Callable[..., Any]) -> Check:
    import tinker

    model = (settings.model or "").strip()
    try:
        client = rest_client_factory(base_url=settings.tinker.base_url, api_key=key)
        capabilities = client.get_server_capabilities().result(timeout=_ONLINE_TIMEOUT_S)
    except Exception as exc:
        error = backend_error(
            exc,
            doing="listing models",
            title="Tinker",
            key_env=KEY_ENV,
            timeout_errors=(tinker.APITimeoutError,),
            connection_errors=(tinker.APIConnectionError,),
            redact=[key],
        )
        return Check("service", False, str(error))
    offered = {m.model_name: m for m in capabilities.supported_models if m.model_name}
    entry = offered.get(model)
    if entry is None:
        names = ", ".join(sorted(offered)[:8]) or "none"
        return Check("service", False, f"the service does not offer {model or '(no model set)'}; it offers {names}")
    if entry.trainable is False:
        return Check("service", False, f"the service offers {model} for sampling only, not for training")
    limit = f", context {entry.max_context_length}" if entry.max_context_length else ""
    return Check("service", True, f"the service offers {model}{limit}")
