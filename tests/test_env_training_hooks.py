"""Hook resolution: every spec form, and a clear error for each way a spec can be wrong."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from openclaw_cli.env_training import HookError, resolve_env, resolve_loss, resolve_reward
from openclaw_cli.env_training.hooks import FunctionEnv


def write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


@pytest.fixture
def hooks_file(tmp_path: Path) -> Path:
    return write(
        tmp_path / "my_hooks.py",
        """
        async def rollout(ctx):
            return None

        def reward(trajectory):
            return 1.0

        def loss(inputs):
            return inputs.logprobs[0].sum()

        def two_args(a, b):
            return 0

        class Env:
            def __init__(self):
                self.closed = False
            async def rollout(self, ctx):
                return None
            def close(self):
                self.closed = True

        class Scorer:
            @staticmethod
            def score(trajectory):
                return 0.5

        NOT_CALLABLE = 42
        """,
    )


def test_file_specs_resolve_with_default_and_explicit_names(hooks_file: Path) -> None:
    env = resolve_env(str(hooks_file))  # no name: "env", then "rollout" (this file has only rollout)
    assert isinstance(env, FunctionEnv) and env.fn.__name__ == "rollout"
    assert resolve_reward(str(hooks_file))(None) == 1.0
    assert callable(resolve_loss(f"{hooks_file}:loss"))
    instance = resolve_env(f"{hooks_file}:Env")  # a class is instantiated without arguments
    assert type(instance).__name__ == "Env" and instance.closed is False
    assert resolve_reward(f"{hooks_file}:Scorer.score")(None) == 0.5  # a dotted name reaches into a class


def test_module_specs_and_builtin_losses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "envrl_spec_module.py", "def rollout(ctx):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_env("envrl_spec_module:rollout").fn.__name__ == "rollout"
    assert resolve_loss("ppo") == "ppo" and resolve_loss("importance_sampling") == "importance_sampling"


def test_entry_point_names_resolve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A package that registers ``[project.entry-points."openclaw.rollouts"]`` is found by name."""
    write(tmp_path / "envrl_ep_module.py", "def play(ctx):\n    return None\n")
    dist = tmp_path / "envrl_ep_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: envrl-ep-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[openclaw.rollouts]\nmy-env = envrl_ep_module:play\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve_env("my-env").fn.__name__ == "play"
    with pytest.raises(HookError, match=r"no rollout named 'other-env'.*'openclaw.rollouts' \(registered: my-env\)"):
        resolve_env("other-env")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("no_such_module_xyz:rollout", "no module named 'no_such_module_xyz'"),
        ("json:no_such_function", r"json has no attribute 'no_such_function'; it defines .*loads"),
        ("does/not/exist.py", "file not found: does/not/exist.py"),
        ("some_env_name", "no rollout named 'some_env_name' is registered under the entry-point group"),
        ("json:", "expected MODULE:NAME"),
        (":rollout", "expected MODULE:NAME"),
        ("", "empty rollout spec"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(HookError, match=message):
        resolve_env(spec)


def test_bad_hook_shapes_and_broken_files(hooks_file: Path, tmp_path: Path) -> None:
    with pytest.raises(HookError, match=r"must take exactly one argument \(the RolloutContext\).*\(a, b\)"):
        resolve_env(f"{hooks_file}:two_args")
    with pytest.raises(HookError, match="expected a rollout function or an object with a rollout method, got int"):
        resolve_env(f"{hooks_file}:NOT_CALLABLE")
    with pytest.raises(HookError, match="expected a reward function"):
        resolve_reward(f"{hooks_file}:NOT_CALLABLE")
    with pytest.raises(HookError, match=r"no loss named 'mystery'.*built-in losses: ppo, importance_sampling"):
        resolve_loss("mystery")
    broken = write(tmp_path / "broken.py", "def rollout(ctx)\n    return 1\n")
    with pytest.raises(HookError, match=r"syntax error in .*broken.py line 1"):
        resolve_env(str(broken))
    needs = write(tmp_path / "needs_dep.py", "import no_such_dependency_xyz\n")
    with pytest.raises(HookError, match=r"importing .*needs_dep\.py failed: ModuleNotFoundError"):
        resolve_env(str(needs))
    empty = write(tmp_path / "empty.py", "X = 1\n")
    with pytest.raises(HookError, match=r"defines no 'env' or 'rollout'; name the rollout explicitly"):
        resolve_env(str(empty))


def test_a_module_with_a_missing_dependency_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path / "envrl_needs_dep.py", "import no_such_dependency_abc\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(HookError, match="needs 'no_such_dependency_abc', which is not installed"):
        resolve_env("envrl_needs_dep:rollout")
