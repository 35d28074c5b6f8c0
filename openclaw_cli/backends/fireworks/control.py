"""The Fireworks control plane: deployments, LoRA models on deployments, datasets and fine-tuning jobs.

Every call goes through the official ``fireworks-ai`` SDK (``Fireworks(api_key, account_id, base_url)``); its
resources cover everything used here (``deployments``, ``lora`` = deployedModels, ``models``, ``datasets``,
``supervised_fine_tuning_jobs``), so no raw HTTP is needed. The SDK's own retries are switched off
(``max_retries=0``): it would retry a 409 "already exists" as if it were a lock timeout, and a scaled-to-zero 503 for
far less time than a cold start takes. Callers get a :class:`~openclaw_cli.backend.BackendError` for every API
failure (``retryable`` for 408/429/5xx and connection errors).

The calls block; the async backend runs them in a worker thread. Waiting is polling: a resource is fetched every
``poll_interval_s`` until it reaches its ready state (deployment READY, dataset READY, job COMPLETED, model READY,
deployed model DEPLOYED), fails, or the timeout passes. A transient error while polling is tolerated until then.

**Cost.** Creating a deployment and starting a training job are billed, so both are logged at INFO and capped by
``fireworks.max_deployments`` / ``fireworks.max_steps_per_day`` through :class:`UsageLedger`, a small JSON file in
``fireworks.state_dir`` (a restart does not reset the caps). **Secrets.** The API key goes to the SDK and nowhere
else; no message or log line here is built from it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from openclaw_cli.backend import BackendError
from openclaw_cli.settings import env_secret

if TYPE_CHECKING:
    from fireworks import Fireworks
    from fireworks.types import Deployment, Model, SupervisedFineTuningJob
    from fireworks.types.shared import DeployedModel

    from openclaw_cli.settings import Settings

log = logging.getLogger("openclaw.fireworks")

DAY_S = 24 * 3600.0
JOB_DONE = frozenset({"JOB_STATE_COMPLETED", "JOB_STATE_EARLY_STOPPED"})  # early stop still writes the model
JOB_FAILED = frozenset({"JOB_STATE_FAILED", "JOB_STATE_CANCELLED", "JOB_STATE_EXPIRED", "JOB_STATE_PAUSED"})
AddonMode = str  # "multi_lora" | "hot_reload" (FireworksSettings.addon_mode)
T = TypeVar("T")


# ---------------------------------------------------------------------------------------------------------------
# Errors


def api_error(exc: Exception, doing: str) -> BackendError:
    """One clear BackendError for an SDK exception (anything else is re-raised unchanged)."""
    import fireworks

    if isinstance(exc, fireworks.APIStatusError):
        status = exc.status_code
        code, message = error_detail(exc.body)
        detail = f"{code}: {message}" if code and message else (message or code or str(exc))
        retryable = status in (408, 429) or status >= 500
        return BackendError(f"Fireworks {doing} failed ({status}): {detail}", retryable=retryable, status_code=status)
    if isinstance(exc, fireworks.APIConnectionError):
        return BackendError(f"cannot reach Fireworks while {doing}: {exc}", retryable=True, status_code=503)
    raise exc


def error_detail(body: object) -> tuple[str, str]:
    """(code, message) from a Fireworks error body: control plane ``{"code", "message"}``, inference
    ``{"error": {"code", "message"}}``; empty strings when absent."""
    if isinstance(body, dict):
        error = body.get("error")
        inner = error if isinstance(error, dict) else body
        code = inner.get("code")
        message = inner.get("message")
        # Control-plane codes are numeric gRPC codes, which add nothing to the HTTP status; names are kept.
        named = isinstance(code, str) and not code.isdigit()
        return (code if isinstance(code, str) and named else "", str(message) if message else "")
    if isinstance(body, str):
        return "", body
    return "", ""


def status_of(exc: BaseException) -> int | None:
    return getattr(exc, "status_code", None)


# ---------------------------------------------------------------------------------------------------------------
# Settings


KEY_ENV, ACCOUNT_ENV, BASE_URL_ENV = "FIREWORKS_API_KEY", "FIREWORKS_ACCOUNT_ID", "FIREWORKS_BASE_URL"


@dataclass(frozen=True)
class Credentials:
    api_key: str = field(repr=False)  # never shown, not even in a repr
    account_id: str
    base_url: str | None


def resolve_credentials(settings: Settings) -> Credentials:
    """Key and account from settings, else ``FIREWORKS_API_KEY`` / ``FIREWORKS_ACCOUNT_ID`` (and the base URL from
    ``FIREWORKS_BASE_URL``); a missing one is a BackendError saying where to set it."""
    fw = settings.fireworks
    api_key = env_secret(fw.api_key, KEY_ENV)
    if not api_key:
        raise BackendError(f"no Fireworks API key: set {KEY_ENV} or fireworks.api_key")
    account_id = fw.account_id or os.environ.get(ACCOUNT_ENV)
    if not account_id:
        raise BackendError(f"no Fireworks account id: set {ACCOUNT_ENV} or fireworks.account_id")
    return Credentials(api_key, account_id, fw.base_url or os.environ.get(BASE_URL_ENV) or None)


def resolve_base_model(settings: Settings) -> str | None:
    """``fireworks.base_model``, else ``model`` when it is a Fireworks resource name (``accounts/...``)."""
    if settings.fireworks.base_model:
        return settings.fireworks.base_model
    model = (settings.model or "").strip()
    return model if model.startswith("accounts/") else None


def resolve_tokenizer_source(settings: Settings) -> str | None:
    """``fireworks.tokenizer``, else ``model`` when it is an HF id or a local path rather than a Fireworks name."""
    if settings.fireworks.tokenizer:
        return settings.fireworks.tokenizer
    model = (settings.model or "").strip()
    return model if model and not model.startswith("accounts/") else None


# ---------------------------------------------------------------------------------------------------------------
# Cost caps


class UsageLedger:
    """What openclaw created on Fireworks that costs money, persisted so caps survive restarts.

    ``deployments``: id -> creation time, for deployments openclaw created and has not deleted. ``jobs``: the
    training jobs started, with their start times (the daily cap counts those in the last 24 hours).
    """

    def __init__(self, path: Path, *, clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {"deployments": {}, "jobs": []}
        if path.is_file():
            try:
                loaded = json.loads(path.read_text())
                self._data["deployments"] = dict(loaded.get("deployments", {}))
                self._data["jobs"] = list(loaded.get("jobs", []))
            except (OSError, ValueError) as exc:
                # Refusing to start would be worse than a reset cap, but the reset must be visible.
                log.warning("cannot read the Fireworks usage ledger %s (%s); starting a new one", path, exc)

    def deployments(self) -> list[str]:
        with self._lock:
            return list(self._data["deployments"])

    def jobs_today(self) -> int:
        cutoff = self._clock() - DAY_S
        with self._lock:
            return sum(1 for job in self._data["jobs"] if job["at"] > cutoff)

    def reserve_deployment(self, deployment_id: str, cap: int) -> None:
        with self._lock:
            created = self._data["deployments"]
            if deployment_id in created:
                return
            if len(created) >= cap:
                raise BackendError(
                    f"cost cap: openclaw already created {len(created)} Fireworks deployment(s) "
                    f"({', '.join(sorted(created)) or 'none'}) and fireworks.max_deployments is {cap}; delete one, "
                    "raise the cap, or name an existing deployment in fireworks.deployment"
                )
            created[deployment_id] = self._clock()
            self._save()

    def release_deployment(self, deployment_id: str) -> None:
        with self._lock:
            if self._data["deployments"].pop(deployment_id, None) is not None:
                self._save()

    def reserve_job(self, job_id: str, cap: int) -> None:
        now = self._clock()
        with self._lock:
            jobs = [job for job in self._data["jobs"] if job["at"] > now - DAY_S]  # older entries are not needed
            if len(jobs) >= cap:
                next_free = min(job["at"] for job in jobs) + DAY_S if jobs else now
                raise BackendError(
                    f"cost cap: {len(jobs)} Fireworks training job(s) started in the last 24 h and "
                    f"fireworks.max_steps_per_day is {cap}; the next one may start in "
                    f"{max(0.0, next_free - now) / 60:.0f} min (queued samples are kept)",
                    retryable=True,
                )
            jobs.append({"id": job_id, "at": now})
            self._data["jobs"] = jobs
            self._save()

    def release_job(self, job_id: str) -> None:
        with self._lock:
            before = len(self._data["jobs"])
            self._data["jobs"] = [job for job in self._data["jobs"] if job["id"] != job_id]
            if len(self._data["jobs"]) != before:
                self._save()

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._data, indent=1))
        os.replace(tmp, self.path)


# ---------------------------------------------------------------------------------------------------------------
# The control plane


@dataclass(frozen=True)
class DeploymentSpec:
    """A deployment openclaw may create (when it does not exist yet) and the features it must have."""

    deployment_id: str
    base_model: str
    addon_mode: AddonMode
    min_replicas: int = 0
    max_replicas: int = 1
    deployment_shape: str | None = None
    accelerator_type: str | None = None


def resource_id(name: str) -> str:
    """``accounts/a/models/x`` -> ``x`` (an id stays an id)."""
    return name.rstrip("/").rsplit("/", 1)[-1]


def make_client(api_key: str, account_id: str, base_url: str | None, *, timeout_s: float = 60.0) -> Fireworks:
    from fireworks import Fireworks

    return Fireworks(api_key=api_key, account_id=account_id, base_url=base_url, max_retries=0, timeout=timeout_s)


@dataclass(eq=False)  # a service object: equal only to itself, and hashable
class FireworksControl:
    """Blocking control-plane operations for one account (see the module docstring)."""

    client: Fireworks
    account_id: str
    ledger: UsageLedger
    _: KW_ONLY
    poll_interval_s: float
    max_deployments: int
    max_steps_per_day: int
    sleep: Callable[[float], None] = time.sleep

    def name(self, collection: str, resource: str) -> str:
        """Full resource name, e.g. ``name("models", "x")`` -> ``accounts/<a>/models/x``."""
        if resource.startswith("accounts/"):
            return resource
        return f"accounts/{self.account_id}/{collection}/{resource}"

    # -- deployments ----------------------------------------------------------------------------------------------

    def get_deployment(self, deployment_id: str) -> Deployment | None:
        try:
            return self.client.deployments.get(resource_id(deployment_id))
        except Exception as exc:
            if status_of(exc) == 404:
                return None
            raise api_error(exc, f"reading deployment {deployment_id}") from exc

    def create_or_get_deployment(self, spec: DeploymentSpec) -> Deployment:
        """The deployment ``spec.deployment_id``: created (cost-capped and logged) when missing, else reused after
        checking it serves the same base model with the LoRA feature ``spec.addon_mode`` needs."""
        existing = self.get_deployment(spec.deployment_id)
        if existing is not None:
            check_deployment(existing, spec.base_model, spec.addon_mode)
            return existing
        self.ledger.reserve_deployment(spec.deployment_id, self.max_deployments)
        log.info(
            "Fireworks: creating deployment %s for %s (%s, replicas %d-%d); it is billed while replicas run",
            spec.deployment_id,
            spec.base_model,
            spec.addon_mode,
            spec.min_replicas,
            spec.max_replicas,
        )
        options: dict[str, Any] = {
            "min_replica_count": spec.min_replicas,
            "max_replica_count": spec.max_replicas,
        }
        # Multi-LoRA and hot reload exclude each other (the API answers 400 to both).
        if spec.addon_mode == "hot_reload":
            options["enable_hot_reload_latest_addon"] = True
        else:
            options["enable_addons"] = True
        if spec.deployment_shape:
            options["deployment_shape"] = spec.deployment_shape
        if spec.accelerator_type:
            options["accelerator_type"] = spec.accelerator_type
        try:
            return self.client.deployments.create(
                base_model=spec.base_model, deployment_id=spec.deployment_id, **options
            )
        except Exception as exc:
            if status_of(exc) == 409:  # created meanwhile (another process, or a retried request): reuse it
                self.ledger.release_deployment(spec.deployment_id)
                found = self.get_deployment(spec.deployment_id)
                if found is not None:
                    check_deployment(found, spec.base_model, spec.addon_mode)
                    return found
            self.ledger.release_deployment(spec.deployment_id)
            raise api_error(exc, f"creating deployment {spec.deployment_id}") from exc

    def wait_deployment_ready(self, deployment_id: str, timeout_s: float) -> Deployment:
        def fetch() -> Deployment:
            found = self.get_deployment(deployment_id)
            if found is None:
                raise BackendError(f"Fireworks deployment {deployment_id} disappeared while starting")
            return found

        return self._poll(
            f"deployment {deployment_id}",
            fetch,
            state=lambda d: d.state or "STATE_UNSPECIFIED",
            done={"READY"},
            failed={"FAILED", "DELETING", "DELETED"},
            timeout_s=timeout_s,
        )

    def scale_deployment(self, deployment_id: str, replicas: int) -> None:
        log.info("Fireworks: scaling deployment %s to %d replica(s)", deployment_id, replicas)
        try:
            self.client.deployments.scale(resource_id(deployment_id), replica_count=replicas)
        except Exception as exc:
            raise api_error(exc, f"scaling deployment {deployment_id}") from exc

    def delete_deployment(self, deployment_id: str) -> None:
        log.info("Fireworks: deleting deployment %s", deployment_id)
        try:
            self.client.deployments.delete(resource_id(deployment_id))
        except Exception as exc:
            if status_of(exc) != 404:
                raise api_error(exc, f"deleting deployment {deployment_id}") from exc
        self.ledger.release_deployment(resource_id(deployment_id))

    # -- datasets -------------------------------------------------------------------------------------------------

    def upload_dataset(self, dataset_id: str, rows: list[dict[str, Any]], *, timeout_s: float) -> str:
        """Create a CHAT dataset, upload ``rows`` as JSONL and wait until it is READY; returns its resource name."""
        body = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows).encode()
        try:
            self.client.datasets.create(
                dataset_id=dataset_id,
                dataset={"example_count": str(len(rows)), "format": "CHAT", "user_uploaded": {}},
            )
        except Exception as exc:
            # Ids carry a per-run random part, so an existing one is ours (a request retried after a lost reply).
            if status_of(exc) != 409:
                raise api_error(exc, f"creating dataset {dataset_id}") from exc
        try:
            self.client.datasets.upload(dataset_id, file=(f"{dataset_id}.jsonl", body, "application/jsonl"))
        except Exception as exc:
            raise api_error(exc, f"uploading dataset {dataset_id}") from exc
        self._poll(
            f"dataset {dataset_id}",
            lambda: self._get(self.client.datasets.get, dataset_id, "dataset"),
            state=lambda d: d.state or "STATE_UNSPECIFIED",
            done={"READY"},
            failed=set(),
            timeout_s=timeout_s,
        )
        return self.name("datasets", dataset_id)

    def delete_dataset(self, dataset_id: str) -> None:
        try:
            self.client.datasets.delete(resource_id(dataset_id))
        except Exception as exc:
            if status_of(exc) != 404:
                raise api_error(exc, f"deleting dataset {dataset_id}") from exc

    # -- supervised fine-tuning -----------------------------------------------------------------------------------

    def start_sft_job(
        self,
        job_id: str,
        *,
        dataset: str,
        output_model: str,
        base_model: str | None,
        warm_start_from: str | None,
        lora_rank: int,
        epochs: int,
        learning_rate: float,
    ) -> SupervisedFineTuningJob:
        """Start one LoRA SFT job (cost-capped and logged): from ``warm_start_from`` (a LoRA) when given, else
        from ``base_model`` with a fresh adapter of rank ``lora_rank``."""
        if (base_model is None) == (warm_start_from is None):
            raise ValueError("give exactly one of base_model and warm_start_from")
        self.ledger.reserve_job(job_id, self.max_steps_per_day)
        source = warm_start_from or base_model
        log.info("Fireworks: starting SFT job %s from %s -> %s (billed)", job_id, source, output_model)
        options: dict[str, Any] = {"epochs": epochs, "learning_rate": learning_rate, "eval_auto_carveout": False}
        if warm_start_from is not None:
            options["warm_start_from"] = warm_start_from  # the rank is the warm-start adapter's
        else:
            options["base_model"] = base_model
            options["lora_rank"] = lora_rank
        try:
            return self.client.supervised_fine_tuning_jobs.create(
                dataset=dataset,
                supervised_fine_tuning_job_id=job_id,
                output_model=output_model,
                display_name=f"openclaw {job_id}",
                **options,
            )
        except Exception as exc:
            if status_of(exc) == 409:  # our own earlier request got through: follow that job
                return self._get(self.client.supervised_fine_tuning_jobs.get, job_id, "SFT job")
            self.ledger.release_job(job_id)
            raise api_error(exc, f"creating SFT job {job_id}") from exc

    def wait_job(self, job_id: str, timeout_s: float) -> SupervisedFineTuningJob:
        return self._poll(
            f"SFT job {job_id}",
            lambda: self._get(self.client.supervised_fine_tuning_jobs.get, job_id, "SFT job"),
            state=lambda j: j.state or "JOB_STATE_UNSPECIFIED",
            done=JOB_DONE,
            failed=JOB_FAILED,
            timeout_s=timeout_s,
        )

    def wait_model_ready(self, model: str, timeout_s: float) -> Model:
        return self._poll(
            f"model {model}",
            lambda: self._get(self.client.models.get, resource_id(model), "model"),
            state=lambda m: m.state or "STATE_UNSPECIFIED",
            done={"READY"},
            failed=set(),
            timeout_s=timeout_s,
        )

    # -- LoRA on a deployment (deployedModels) --------------------------------------------------------------------

    def load_lora(self, model: str, deployment_id: str, *, replace_merged: bool) -> DeployedModel:
        """Load a LoRA model onto a deployment. ``replace_merged`` (hot-reload deployments) swaps the merged addon
        in place; otherwise the LoRA is added beside those already loaded. Already loaded: the existing entry."""
        model_name = self.name("models", model)
        deployment = self.name("deployments", deployment_id)
        options: dict[str, Any] = {"replace_merged_addon": True} if replace_merged else {}
        try:
            return self.client.lora.load(model=model_name, deployment=deployment, **options)
        except Exception as exc:
            if status_of(exc) == 409:
                found = self.find_lora(model_name, deployment)
                if found is not None:
                    return found
            raise api_error(exc, f"loading {model_name} onto {deployment}") from exc

    def find_lora(self, model: str, deployment_id: str) -> DeployedModel | None:
        model_name, deployment = self.name("models", model), self.name("deployments", deployment_id)
        try:
            for entry in self.client.lora.list():
                if entry.model == model_name and entry.deployment == deployment:
                    return entry
        except Exception as exc:
            raise api_error(exc, "listing deployed models") from exc
        return None

    def wait_lora_deployed(self, deployed_model: str, timeout_s: float) -> DeployedModel:
        return self._poll(
            f"deployed model {deployed_model}",
            lambda: self._get(self.client.lora.get, resource_id(deployed_model), "deployed model"),
            state=lambda d: d.state or "STATE_UNSPECIFIED",
            done={"DEPLOYED"},
            failed={"UNDEPLOYING"},
            timeout_s=timeout_s,
        )

    def unload_lora(self, deployed_model: str) -> None:
        try:
            self.client.lora.unload(resource_id(deployed_model))
        except Exception as exc:
            if status_of(exc) != 404:
                raise api_error(exc, f"unloading {deployed_model}") from exc

    # -- helpers --------------------------------------------------------------------------------------------------

    def _get(self, getter: Callable[[str], T], resource: str, what: str) -> T:
        try:
            return getter(resource)
        except Exception as exc:
            raise api_error(exc, f"reading {what} {resource}") from exc

    def _poll(
        self,
        what: str,
        fetch: Callable[[], T],
        *,
        state: Callable[[T], str],
        done: set[str] | frozenset[str],
        failed: set[str] | frozenset[str],
        timeout_s: float,
    ) -> T:
        deadline = time.monotonic() + timeout_s
        last = "unknown"
        while True:
            try:
                current = fetch()
            except BackendError as exc:
                if not exc.retryable:
                    raise
                log.warning("Fireworks: polling %s failed (%s); will retry", what, exc)
            else:
                last = state(current)
                if last in done:
                    return current
                if last in failed:
                    reason = _status_message(current)
                    raise BackendError(f"Fireworks {what} ended in {last}" + (f": {reason}" if reason else ""))
            if time.monotonic() >= deadline:
                raise BackendError(f"Fireworks {what} is still {last} after {timeout_s:.0f} s", retryable=True)
            self.sleep(self.poll_interval_s)


def check_deployment(deployment: Deployment, base_model: str, addon_mode: AddonMode) -> None:
    """Refuse a deployment that serves another model, or lacks the LoRA feature the addon mode relies on."""
    name = deployment.name or "the deployment"
    if deployment.base_model and deployment.base_model != base_model:
        raise BackendError(
            f"Fireworks {name} serves {deployment.base_model}, not {base_model}; set fireworks.base_model to match "
            "or use another deployment"
        )
    if addon_mode == "hot_reload" and not deployment.enable_hot_reload_latest_addon:
        raise BackendError(
            f"Fireworks {name} was not created with enableHotReloadLatestAddon; use fireworks.addon_mode = "
            "'multi_lora' (needs enableAddons) or another deployment"
        )
    if addon_mode == "multi_lora" and not deployment.enable_addons:
        raise BackendError(
            f"Fireworks {name} does not have LoRA addons enabled (enableAddons); use fireworks.addon_mode = "
            "'hot_reload' if it hot-reloads, or another deployment"
        )


def _status_message(resource: Any) -> str:
    status = getattr(resource, "status", None)
    return (getattr(status, "message", None) or "") if status is not None else ""


__all__ = [
    "Credentials",
    "DeploymentSpec",
    "FireworksControl",
    "UsageLedger",
    "api_error",
    "check_deployment",
    "error_detail",
    "make_client",
    "resolve_base_model",
    "resolve_credentials",
    "resolve_tokenizer_source",
    "resource_id",
]
