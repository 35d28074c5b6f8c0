"""Rollback: the local backend switches the served version at once and the trainer continues from its weights;
staged versions serve only when pinned; the current version is never evicted; the control route answers 200 / 400 /
404 (listing the servable versions) / 501 / 401 in OpenAI's error format; `openclaw rollback` drives it."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from torch import nn
from typer.testing import CliRunner

from openclaw_cli.backend import BackendError
from openclaw_cli.backends.local import LocalBackend
from openclaw_cli.backends.local.lora_delta import LoraDelta
from openclaw_cli.backends.local.serving import PolicyVersions
from openclaw_cli.cli import app as cli_app
from openclaw_cli.proxy import BackgroundServer, create_app
from openclaw_cli.settings import LocalSettings, LoraSettings, Settings
from openclaw_cli.testing.fake_backend import FakeBackend, MemorySink
from openclaw_cli.types import AdamParams, SamplingParams, datum_from_completion

pytestmark = pytest.mark.timeout(120)

ADAM = AdamParams(learning_rate=0.05, beta2=0.99)


# -- PolicyVersions: staging, switching, eviction --------------------------------------------------------------------


class OneLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q_proj = nn.Linear(2, 2, bias=False)
        with torch.no_grad():
            self.q_proj.weight.copy_(torch.eye(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.q_proj(x)


def delta(value: float) -> dict[str, LoraDelta]:
    """A rank-1 delta adding ``value`` to every output: A = [1, 0], B = [[value], [value]], scaling 1."""
    return {"q_proj": LoraDelta(a=torch.tensor([[1.0, 0.0]]), b=torch.tensor([[value], [value]]), scaling=1.0)}


def output(versions: PolicyVersions, model: nn.Module, version: int | None = None) -> list[float]:
    with versions.activate(versions.acquire(version)), torch.no_grad():
        return model(torch.tensor([[1.0, 2.0]]))[0].tolist()


def test_make_current_staging_and_eviction_never_drop_the_current_version() -> None:
    model = OneLayer()
    versions = PolicyVersions(model, ["q_proj"], keep=2)
    assert versions.publish(delta(10.0)).version == 1
    staged = versions.publish(delta(20.0), make_current=False)
    # Staged: servable when pinned, not current. y = x + value * x[0] for input [1, 2].
    assert staged.version == 2 and versions.current().version == 1
    assert output(versions, model) == [11.0, 12.0] and output(versions, model, 2) == [21.0, 22.0]
    assert versions.make_current(0).version == 0 and output(versions, model) == [1.0, 2.0]
    versions.make_current(1)
    # keep=2 and three published: the oldest that is not current goes (2), version 1 stays because it serves.
    assert versions.publish(delta(30.0), make_current=False).version == 3
    assert versions.servable() == [0, 1, 3] and versions.current().version == 1
    with pytest.raises(BackendError, match="servable versions: 0, 1, 3"):
        versions.make_current(2)
    assert versions.current().version == 1


# -- the local backend: activate with train_from -----------------------------------------------------------------


@pytest.fixture
async def local(tiny_model_dir: Path, tmp_path: Path) -> AsyncIterator[LocalBackend]:
    settings = Settings(
        model=str(tiny_model_dir),
        lora=LoraSettings(rank=4, alpha=8),
        local=LocalSettings(state_dir=tmp_path / "ckpt", keep_versions=3, max_concurrent_requests=2),
    )
    backend = LocalBackend(settings)
    await backend.start()
    yield backend
    await backend.close()


async def step_and_publish(backend: LocalBackend, prompt: list[int], seed: int) -> int:
    result = await backend.sample(prompt, SamplingParams(max_tokens=8, seed=seed))
    datum = datum_from_completion(prompt, result.tokens, logprobs=result.logprobs, advantages=1.0)
    await backend.forward_backward([datum], "importance_sampling")
    await backend.optim_step(ADAM)
    return (await backend.publish()).version


async def test_rollback_serves_the_old_version_and_training_continues_from_its_weights(local: LocalBackend) -> None:
    prompt = local.tokenizer().render([{"role": "user", "content": "What is the capital of France?"}])
    assert [await step_and_publish(local, prompt, seed) for seed in (1, 2)] == [1, 2]
    assert local.servable_versions() == [0, 1, 2]

    info = await local.activate(1, train_from=True)
    assert info.version == 1 and local.current_version().version == 1
    sampled = await local.sample(prompt, SamplingParams(max_tokens=8, seed=5))
    assert sampled.version == 1
    # The trainer holds version 1's weights again: its log-probs of a version-1 sample equal the sampler's.
    datum = datum_from_completion(prompt, sampled.tokens, logprobs=sampled.logprobs, advantages=1.0)
    out = await local.forward_backward([datum], "importance_sampling")
    learner = out.logprobs[0][len(prompt) - 1 :]
    assert max(abs(a - b) for a, b in zip(learner, sampled.logprobs, strict=True)) < 1e-4
    await local.optim_step(ADAM)  # a fresh optimizer takes the step
    assert (await local.publish()).version == 3  # numbers keep growing after a rollback

    # A checkpoint right after a rollback records the served version as exactly the trainer's weights.
    await local.activate(2, train_from=True)
    saved = json.loads((Path(await local.save_state("after-rollback")) / "openclaw-state.json").read_text())
    assert (saved["version"], saved["weights_are_version"]) == (2, True)

    # Staging: servable when pinned, not served until activated; promoting it leaves the trainer alone.
    staged = await local.stage("candidate")
    assert staged.version == 4 and local.current_version().version == 2
    assert (await local.sample(prompt, SamplingParams(max_tokens=4), version=4)).version == 4
    assert (await local.activate(4)).version == 4
    saved = json.loads((Path(await local.save_state("promoted")) / "openclaw-state.json").read_text())
    assert (saved["version"], saved["weights_are_version"]) == (4, True)

    with pytest.raises(BackendError, match=r"servable versions: 0, 2, 3, 4"):
        await local.activate(1)  # keep_versions=3: version 1 is gone
    assert local.current_version().version == 4


# -- the control route and the CLI --------------------------------------------------------------------------------


class NoVersionControl(FakeBackend):
    stage = None  # type: ignore[assignment]
    activate = None  # type: ignore[assignment]


@pytest.fixture
def proxy(tiny_tokenizer: Any) -> Iterator[Any]:
    servers: list[BackgroundServer] = []

    def start(backend: FakeBackend | None = None, settings: Settings | None = None) -> tuple[FakeBackend, str]:
        backend = backend or FakeBackend(tiny_tokenizer)
        server = BackgroundServer(create_app(backend, MemorySink(), settings or Settings())).start()
        servers.append(server)
        return backend, server.base_url

    yield start
    for server in servers:
        server.stop()


async def publish_versions(backend: FakeBackend, n: int) -> None:
    for _ in range(n):
        await backend.publish()


def test_rollback_route_switches_serving_and_reports_errors_in_openai_format(proxy: Any) -> None:
    import asyncio

    backend, url = proxy()
    asyncio.run(publish_versions(backend, 3))
    assert httpx.get(url + "/v1/openclaw/versions").json() == {
        "adapter": "shared",
        "current": 3,
        "current_name": "fake-v3",
        "servable": [0, 1, 2, 3],
    }
    answer = httpx.post(url + "/v1/openclaw/rollback", json={"version": 1}).json()
    assert (answer["policy_version"], answer["previous_version"]) == (1, 3)
    assert answer["servable_versions"] == [0, 1, 2, 3] and "continues from this version" in answer["trainer"]
    assert backend.activations == [(1, True)]
    reply = httpx.post(
        url + "/v1/chat/completions", json={"model": "openclaw", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert reply.headers["x-openclaw-policy-version"] == "1"
    status = httpx.get(url + "/v1/openclaw/status").json()
    assert status["policy_version"] == 1 and status["versions"]["rollbacks"][-1]["previous_version"] == 3

    missing = httpx.post(url + "/v1/openclaw/rollback", json={"version": 7})
    assert missing.status_code == 404
    error = missing.json()["error"]
    assert error["param"] == "version" and "servable versions: 0, 1, 2, 3" in error["message"]
    for bad in ({}, {"version": "2"}, {"version": -1}, {"version": True}):
        resp = httpx.post(url + "/v1/openclaw/rollback", json=bad)
        assert resp.status_code == 400 and resp.json()["error"]["param"] == "version"
    assert backend.current_version().version == 1 and len(backend.activations) == 1


def test_rollback_needs_a_capable_backend_and_the_api_key(proxy: Any, tiny_tokenizer: Any) -> None:
    _, url = proxy(NoVersionControl(tiny_tokenizer))
    resp = httpx.post(url + "/v1/openclaw/rollback", json={"version": 0})
    assert resp.status_code == 501 and resp.json()["error"]["code"] == "unsupported"
    assert "cannot switch the served policy version" in resp.json()["error"]["message"]
    assert "versions" not in httpx.get(url + "/v1/openclaw/status").json()

    _, url = proxy(settings=Settings(api_key="sekrit"))
    assert httpx.post(url + "/v1/openclaw/rollback", json={"version": 0}).status_code == 401
    ok = httpx.post(url + "/v1/openclaw/rollback", json={"version": 0}, headers={"Authorization": "Bearer sekrit"})
    assert ok.status_code == 200 and ok.json()["policy_version"] == 0


def test_openclaw_rollback_command(proxy: Any) -> None:
    import asyncio

    backend, url = proxy(settings=Settings(api_key="sekrit"))
    asyncio.run(publish_versions(backend, 2))
    port = url.rsplit(":", 1)[1]
    runner = CliRunner()
    env = {"OPENCLAW_API_KEY": "sekrit"}

    listed = runner.invoke(cli_app, ["rollback", "--port", port], env=env)
    assert listed.exit_code == 0, listed.output
    assert "serving version 2 (fake-v2); servable: 0, 1, 2" in listed.output

    done = runner.invoke(cli_app, ["rollback", "--to", "1", "--port", port], env=env)
    assert done.exit_code == 0, done.output
    assert "serving version 1 (fake-v1) from now on, was 2" in done.output
    assert backend.current_version().version == 1

    unknown = runner.invoke(cli_app, ["rollback", "--to", "9", "--port", port], env=env)
    assert unknown.exit_code == 2 and "servable versions: 0, 1, 2" in unknown.output

    refused = runner.invoke(cli_app, ["rollback", "--to", "0", "--port", port], env={"OPENCLAW_API_KEY": "wrong"})
    assert refused.exit_code == 1 and "refused the API key" in refused.output

    with_json = runner.invoke(cli_app, ["rollback", "--to", "0", "--json", "--port", port], env=env)
    assert with_json.exit_code == 0 and json.loads(with_json.output)["policy_version"] == 0


def test_openclaw_rollback_without_a_server(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    result = CliRunner().invoke(cli_app, ["rollback", "--to", "1", "--port", str(port)])
    assert result.exit_code == 1 and f"no openclaw server on 127.0.0.1:{port}" in result.output
