"""The Fireworks control plane through the real fireworks-ai SDK against the local HTTP double: state transitions
over polls, 409 / 400 handling, the cost caps and their ledger, and that the API key never reaches a log or file."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from openclaw_cli.backend import BackendError
from openclaw_cli.backends.fireworks import FireworksBackend
from openclaw_cli.backends.fireworks.control import (
    DeploymentSpec,
    FireworksControl,
    UsageLedger,
    api_error,
    make_client,
    resolve_credentials,
)
from openclaw_cli.settings import FireworksSettings, Settings
from openclaw_cli.testing.fireworks_double import ACCOUNT, API_KEY, BASE_MODEL, FireworksDouble, double_settings

pytestmark = pytest.mark.timeout(120)

SFT_ROW = {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello!", "weight": 1}]}


@pytest.fixture(scope="module")
def double(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    with FireworksDouble(tiny_model_dir, work_dir=tmp_path_factory.mktemp("fw-double"), polls=3) as fw:
        yield fw


@pytest.fixture
def control(double: FireworksDouble, tmp_path: Path):
    client = make_client(API_KEY, ACCOUNT, double.base_url)
    ledger = UsageLedger(tmp_path / "usage.json")
    yield FireworksControl(client, ACCOUNT, ledger, poll_interval_s=0.0, max_deployments=2, max_steps_per_day=2)
    client.close()


def spec(deployment_id: str, **overrides) -> DeploymentSpec:
    return DeploymentSpec(deployment_id=deployment_id, base_model=BASE_MODEL, addon_mode="multi_lora", **overrides)


def start_job(control: FireworksControl, job_id: str, dataset: str, output_model: str, **overrides: Any) -> Any:
    """An SFT job with the small settings these tests use (rank 8, one epoch); ``overrides`` change any of them."""
    settings: dict[str, Any] = {
        "base_model": BASE_MODEL,
        "warm_start_from": None,
        "lora_rank": 8,
        "epochs": 1,
        "learning_rate": 1e-3,
    }
    return control.start_sft_job(job_id, dataset=dataset, output_model=output_model, **(settings | overrides))


# -- deployments ---------------------------------------------------------------------------------------------------


def test_deployment_is_created_once_and_becomes_ready_after_polls(
    control: FireworksControl, double: FireworksDouble
) -> None:
    created = control.create_or_get_deployment(spec("ctl-a", min_replicas=0, max_replicas=2))
    assert (created.name, created.state) == (f"accounts/{ACCOUNT}/deployments/ctl-a", "CREATING")
    sent = double.deployments["ctl-a"].body
    assert (sent["baseModel"], sent["enableAddons"], sent["minReplicaCount"], sent["maxReplicaCount"]) == (
        BASE_MODEL,
        True,
        0,
        2,
    )
    assert sent["enableHotReloadLatestAddon"] is False  # multi-LoRA and hot reload exclude each other
    gets_before = double.count_calls("GET", "/deployments/ctl-a")
    ready = control.wait_deployment_ready("ctl-a", timeout_s=10)
    assert ready.state == "READY"
    assert double.count_calls("GET", "/deployments/ctl-a") - gets_before == 3  # CREATING, CREATING, READY
    assert control.ledger.deployments() == ["ctl-a"]

    again = control.create_or_get_deployment(spec("ctl-a"))  # exists: reused, nothing created, cap untouched
    assert again.name == created.name and double.count_calls("POST", "deploymentId=ctl-a") == 1


def test_a_409_from_a_concurrent_create_reuses_that_deployment(
    control: FireworksControl, double: FireworksDouble, monkeypatch: pytest.MonkeyPatch
) -> None:
    double.add_deployment("ctl-race")
    real_get = control.get_deployment
    seen: list[str] = []

    def first_miss(deployment_id: str):
        seen.append(deployment_id)
        return None if len(seen) == 1 else real_get(deployment_id)  # as if created between our GET and POST

    monkeypatch.setattr(control, "get_deployment", first_miss)
    found = control.create_or_get_deployment(spec("ctl-race"))
    assert found.state == "READY" and seen == ["ctl-race", "ctl-race"]
    assert double.count_calls("POST", "deploymentId=ctl-race") == 1  # the POST got the 409
    assert control.ledger.deployments() == []  # not ours: the cap is not charged


def test_400_for_both_lora_features_surfaces_as_a_permanent_error(control: FireworksControl) -> None:
    with pytest.raises(Exception) as raw:
        control.client.deployments.create(
            base_model=BASE_MODEL, deployment_id="ctl-bad", enable_addons=True, enable_hot_reload_latest_addon=True
        )
    error = api_error(raw.value, "creating deployment ctl-bad")
    assert str(error) == (
        "Fireworks creating deployment ctl-bad failed (400): enableAddons and enableHotReloadLatestAddon "
        "cannot both be set"
    )
    assert error.status_code == 400 and not error.retryable


async def test_existing_deployment_without_the_needed_lora_feature_is_refused(
    double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path
) -> None:
    double.add_deployment("no-addons", addons=False)
    backend = FireworksBackend(double_settings(double, tiny_model_dir, tmp_path, deployment="no-addons"))
    with pytest.raises(BackendError, match=r"does not have LoRA addons enabled \(enableAddons\)"):
        await backend.start()
    hot = FireworksBackend(
        double_settings(double, tiny_model_dir, tmp_path, deployment="no-addons", addon_mode="hot_reload")
    )
    with pytest.raises(BackendError, match="was not created with enableHotReloadLatestAddon"):
        await hot.start()


def test_deployment_cap_is_checked_before_creating_and_persists(
    control: FireworksControl, double: FireworksDouble, tmp_path: Path
) -> None:
    control.max_deployments = 1
    control.create_or_get_deployment(spec("cap-1"))
    with pytest.raises(BackendError, match=r"cost cap: openclaw already created 1 Fireworks deployment\(s\) \(cap-1\)"):
        control.create_or_get_deployment(spec("cap-2"))
    assert "cap-2" not in double.deployments
    reloaded = UsageLedger(tmp_path / "usage.json")  # a restart keeps the count
    assert reloaded.deployments() == ["cap-1"]
    control.delete_deployment("cap-1")
    assert "cap-1" not in double.deployments and UsageLedger(tmp_path / "usage.json").deployments() == []
    control.create_or_get_deployment(spec("cap-2"))  # room again


def test_job_cap_counts_the_last_24_hours(tmp_path: Path) -> None:
    now = [1_000_000.0]
    ledger = UsageLedger(tmp_path / "usage.json", clock=lambda: now[0])
    ledger.reserve_job("j1", cap=2)
    now[0] += 3600
    ledger.reserve_job("j2", cap=2)
    with pytest.raises(
        BackendError, match=r"2 Fireworks training job\(s\) started in the last 24 h .* in 1380 min"
    ) as c:
        ledger.reserve_job("j3", cap=2)
    assert c.value.retryable
    now[0] += 23 * 3600 + 1  # j1 is older than 24 h now
    ledger.reserve_job("j3", cap=2)
    assert UsageLedger(tmp_path / "usage.json", clock=lambda: now[0]).jobs_today() == 2
    ledger.release_job("j3")
    assert ledger.jobs_today() == 1


# -- datasets, jobs, models, deployed models -----------------------------------------------------------------------


def test_dataset_upload_and_its_400_for_too_few_rows(control: FireworksControl, double: FireworksDouble) -> None:
    name = control.upload_dataset("ds-ok", [SFT_ROW] * 3, timeout_s=10)
    assert name == f"accounts/{ACCOUNT}/datasets/ds-ok"
    assert double.datasets["ds-ok"].body["state"] == "READY"
    assert double.datasets["ds-ok"].private["rows"] == [SFT_ROW] * 3  # the multipart JSONL arrived intact
    with pytest.raises(BackendError, match=r"uploading dataset ds-few failed \(400\): .*at least 3 examples, got 2"):
        control.upload_dataset("ds-few", [SFT_ROW] * 2, timeout_s=10)
    with pytest.raises(Exception) as dup:
        control.client.datasets.create(dataset_id="ds-ok", dataset={"format": "CHAT"})
    assert api_error(dup.value, "x").status_code == 409


def test_sft_job_runs_to_a_ready_model_that_loads_onto_the_deployment(
    control: FireworksControl, double: FireworksDouble
) -> None:
    double.add_deployment("ctl-serve")
    dataset = control.upload_dataset("ds-job", [SFT_ROW] * 3, timeout_s=10)
    output = control.name("models", "job-model")
    job = start_job(control, "job-1", dataset, output)
    assert job.state == "JOB_STATE_CREATING" and control.ledger.jobs_today() == 1
    sent = double.jobs["job-1"].body
    assert (sent["baseModel"], sent["loraRank"], sent["epochs"], sent["evalAutoCarveout"]) == (BASE_MODEL, 8, 1, False)
    done = control.wait_job("job-1", timeout_s=60)
    assert done.state == "JOB_STATE_COMPLETED" and done.output_model == output
    assert control.wait_model_ready(output, timeout_s=10).state == "READY"

    deployed = control.load_lora(output, "ctl-serve", replace_merged=False)
    assert deployed.state == "DEPLOYING" and deployed.model == output
    assert control.wait_lora_deployed(deployed.name, timeout_s=10).state == "DEPLOYED"
    again = control.load_lora(output, "ctl-serve", replace_merged=False)  # 409: the loaded entry is found
    assert again.name == deployed.name
    control.unload_lora(deployed.name)
    assert control.find_lora(output, "ctl-serve") is None


def test_failed_job_and_job_400s_are_clear_errors(control: FireworksControl, double: FireworksDouble) -> None:
    dataset = control.upload_dataset("ds-fail", [SFT_ROW] * 3, timeout_s=10)
    double.fail_next_job = True
    start_job(control, "job-fails", dataset, control.name("models", "never"))
    with pytest.raises(BackendError, match=r"SFT job job-fails ended in JOB_STATE_FAILED: RuntimeError: training"):
        control.wait_job("job-fails", timeout_s=60)
    with pytest.raises(BackendError, match=r"\(400\): loraRank must be between 4 and 64, got 128") as bad:
        start_job(control, "job-bad-rank", dataset, control.name("models", "bad"), lora_rank=128)
    assert not bad.value.retryable
    assert control.ledger.jobs_today() == 1  # the rejected job does not count against the daily cap
    with pytest.raises(BackendError, match="cost cap: 1 Fireworks training job"):
        control.max_steps_per_day = 1
        start_job(control, "job-capped", dataset, control.name("models", "capped"))
    assert "job-capped" not in double.jobs


def test_polling_gives_up_with_a_retryable_error_after_the_timeout(control: FireworksControl) -> None:
    control.upload_dataset("ds-slow", [SFT_ROW] * 3, timeout_s=10)
    with pytest.raises(BackendError, match=r"reading model missing failed \(404\)"):
        control.wait_model_ready("missing", timeout_s=1)  # 404 is permanent: no waiting
    control.poll_interval_s = 0.05
    control.create_or_get_deployment(spec("ctl-slow"))
    with pytest.raises(BackendError, match="deployment ctl-slow is still CREATING after 0 s") as caught:
        control.wait_deployment_ready("ctl-slow", timeout_s=0.0)
    assert caught.value.retryable


# -- credentials and secrets ---------------------------------------------------------------------------------------


def test_credentials_come_from_settings_or_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FIREWORKS_API_KEY", "FIREWORKS_ACCOUNT_ID", "FIREWORKS_BASE_URL"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(BackendError, match=r"no Fireworks API key: set FIREWORKS_API_KEY or fireworks\.api_key"):
        resolve_credentials(Settings())
    monkeypatch.setenv("FIREWORKS_API_KEY", "fw-from-env")
    with pytest.raises(BackendError, match="no Fireworks account id: set FIREWORKS_ACCOUNT_ID"):
        resolve_credentials(Settings())
    monkeypatch.setenv("FIREWORKS_ACCOUNT_ID", "acct-env")
    creds = resolve_credentials(Settings())
    assert (creds.api_key, creds.account_id, creds.base_url) == ("fw-from-env", "acct-env", None)
    assert "fw-from-env" not in repr(creds)
    explicit = resolve_credentials(Settings(fireworks=FireworksSettings(api_key="fw-set", account_id="a")))
    assert (explicit.api_key, explicit.account_id) == ("fw-set", "a")


async def test_api_key_never_reaches_logs_or_state_files(
    double: FireworksDouble, tiny_model_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from openclaw_cli.types import AdamParams, SamplingParams, datum_from_completion

    caplog.set_level(logging.DEBUG)
    backend = FireworksBackend(double_settings(double, tiny_model_dir, tmp_path))
    await backend.start()
    try:
        tokenizer = backend.tokenizer()
        datums = []
        for i in range(3):
            prompt = tokenizer.render([{"role": "user", "content": f"secret test {i}"}])
            reply = await backend.sample(prompt, SamplingParams(max_tokens=4, seed=i))
            datums.append(datum_from_completion(prompt, reply.tokens, logprobs=reply.logprobs, advantages=1.0))
        await backend.forward_backward(datums, "ppo")
        await backend.optim_step(AdamParams())
        await backend.publish("step-1")
        checkpoint = await backend.save_state("step-00000001")
    finally:
        await backend.close()
    logged = "\n".join(f"{r.getMessage()} {r.args!r}" for r in caplog.records)
    assert "Fireworks: starting SFT job" in logged  # cost-relevant actions are logged...
    assert API_KEY not in logged  # ...and the key never is
    for path in [*tmp_path.rglob("*.json"), *tmp_path.rglob("*.jsonl")]:
        assert API_KEY not in path.read_text(), path
    assert json.loads((Path(checkpoint) / "openclaw-state.json").read_text())["backend"] == "fireworks"
