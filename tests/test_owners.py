"""An adapter per owner (lora.scope = owner): who gets which adapter, each adapter's own versions and trainer state on
one model, the store's per-adapter claims and ledger, the migration of a store written before adapters, and a
request of one owner never served by another's adapter, on all three APIs."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from backend_helpers import running, user_prompt

from openclaw_cli.adapters import (
    SHARED_ADAPTER,
    adapter_dirname,
    adapter_of,
    adapter_state_dir,
    separate_adapters,
    trainer_consumer,
)
from openclaw_cli.backend import BackendError
from openclaw_cli.backends.local import LocalBackend
from openclaw_cli.lesson_prompt import key_owner
from openclaw_cli.settings import (
    LessonSettings,
    LocalSettings,
    LoraSettings,
    Settings,
    SettingsError,
    load_settings,
)
from openclaw_cli.store import Store
from openclaw_cli.store.schema import MIGRATIONS
from openclaw_cli.testing.store_turns import new_turn
from openclaw_cli.types import AdamParams, SamplingParams, datum_from_completion

ALICE, BOB, CAROL = "sk-alice-0123456789", "sk-bob-0123456789", "sk-carol-0123456789"
ADAM = AdamParams(learning_rate=0.05, beta2=0.99)


# --- who gets which adapter ------------------------------------------------------------------------------------------
def test_each_key_is_its_own_adapter_and_one_owner_is_the_shared_one() -> None:
    keys = Settings(api_key=ALICE, api_keys=[BOB])
    assert adapter_of(keys, key_owner(ALICE)) == key_owner(ALICE) != adapter_of(keys, key_owner(BOB))
    assert separate_adapters(keys)
    # One owner (no key, or one key): nothing to separate, so the shared adapter, as before adapters per owner.
    assert adapter_of(Settings(), "local") == SHARED_ADAPTER and not separate_adapters(Settings())
    assert adapter_of(Settings(api_key=ALICE), key_owner(ALICE)) == SHARED_ADAPTER
    shared = Settings(api_key=ALICE, api_keys=[BOB], lora=LoraSettings(scope="shared"))
    assert adapter_of(shared, key_owner(ALICE)) == SHARED_ADAPTER and not separate_adapters(shared)
    sessions = Settings(lessons=LessonSettings(scope="session"))
    assert adapter_of(sessions, "session:chat-1") == "session:chat-1" and separate_adapters(sessions)


def test_a_group_shares_one_adapter() -> None:
    team = [key_owner(ALICE), key_owner(BOB)]
    settings = Settings(api_key=ALICE, api_keys=[BOB, CAROL], lora=LoraSettings(groups={"team": team}))
    assert adapter_of(settings, key_owner(ALICE)) == adapter_of(settings, key_owner(BOB)) == "team"
    assert adapter_of(settings, key_owner(CAROL)) == key_owner(CAROL)


@pytest.mark.parametrize(
    ("groups", "message"),
    [
        ({"team": [ALICE]}, "never put an API key itself in a group"),
        ({"shared": ["key:0123456789abcdef"]}, "not shared or local"),
        ({"a": ["key:0123456789abcdef"], "b": ["key:0123456789abcdef"]}, "in two groups"),
    ],
)
def test_bad_groups_are_refused_without_echoing_a_key(groups: dict[str, list[str]], message: str) -> None:
    with pytest.raises(SettingsError, match=message) as caught:
        load_settings({"lora": {"groups": groups}})
    assert str(caught.value).startswith("invalid setting lora.groups: ") and ALICE not in str(caught.value)


def test_adapter_directories_never_hold_a_client_string_raw(tmp_path: Path) -> None:
    in_tmp = Settings(local=LocalSettings(state_dir=tmp_path))
    assert adapter_state_dir(in_tmp, SHARED_ADAPTER) == tmp_path.resolve()  # an existing checkpoint dir: the shared
    assert adapter_dirname(key_owner(ALICE)) == "key-" + key_owner(ALICE)[4:]
    assert adapter_dirname("team") == "group-team"
    odd = adapter_dirname("session:../../etc/passwd")
    assert odd.startswith("owner-") and "/" not in odd and ".." not in odd


# --- the store -------------------------------------------------------------------------------------------------------
def _ready_turn(store: Store, owner: str, adapter: str, index: int) -> int:
    session = f"s-{owner}"
    with store.transaction() as tx:
        if tx.get_session(session) is None:
            tx.create_session(session, scope="", id_source="test", now=100.0)
        metadata = {"owner": owner, "adapter": adapter}
        return tx.insert_turn(new_turn(session, index=index, status="ready", metadata=metadata))


def test_a_trainer_of_one_adapter_claims_its_turns_only(tmp_path: Path) -> None:
    alice, bob = key_owner(ALICE), key_owner(BOB)
    with Store(tmp_path / "store.sqlite3") as store:
        mine = [_ready_turn(store, alice, alice, i) for i in range(3)]
        theirs = [_ready_turn(store, bob, bob, i) for i in range(2)]
        shared = _ready_turn(store, "local", SHARED_ADAPTER, 9)
        claimed = store.claim_ready(trainer_consumer(alice), 10, 60.0)
        assert sorted(t.id for t in claimed) == mine
        assert [t.id for t in store.claim_ready(trainer_consumer(bob), 10, 60.0)] == theirs
        assert [t.id for t in store.claim_ready(trainer_consumer(SHARED_ADAPTER), 10, 60.0)] == [shared]
        assert store.backlog(trainer_consumer(alice))[0] == 3
        assert store.adapters_since(0) == (shared, sorted([SHARED_ADAPTER, alice, bob]))
        # Steps and checkpoints are numbered per adapter: both adapters have a step 1.
        store.commit_step(1, 1, {"loss": 1.0}, trainer_consumer(alice), {t: {} for t in mine}, adapter=alice)
        store.commit_step(1, 1, {"loss": 2.0}, trainer_consumer(bob), {t: {} for t in theirs}, adapter=bob)
        assert [m["loss"] for *_, m in store.steps(adapter=alice)] == [1.0]
        assert [m["loss"] for *_, m in store.steps(adapter=bob)] == [2.0]
        assert store.backlog(trainer_consumer(alice))[0] == 0
        # Undoing alice's step reopens alice's turns and leaves bob's step alone.
        assert sorted(store.discard_steps_after(0, trainer_consumer(alice), alice)) == mine
        assert store.steps(adapter=alice) == [] and len(store.steps(adapter=bob)) == 1


def test_a_store_written_before_adapters_migrates_to_the_shared_one(tmp_path: Path) -> None:
    """A store at schema 5 (the release before adapters per owner), with a step, a checkpoint and an owned turn."""
    path = tmp_path / "old.sqlite3"
    conn = sqlite3.connect(path, isolation_level=None)
    for migration in MIGRATIONS[:5]:
        for statement in migration:
            assert isinstance(statement, str)  # the released steps are plain SQL
            conn.execute(statement)
    conn.execute("PRAGMA application_id=0x4F434C57")
    conn.execute("PRAGMA user_version=5")
    conn.execute("INSERT INTO steps (step, version, created_at, metrics) VALUES (7, 3, 1.0, '{\"loss\": 0.5}')")
    conn.execute("INSERT INTO checkpoints (step, path, created_at) VALUES (7, '/ckpt/step-00000007', 1.0)")
    conn.execute(
        "INSERT INTO sessions (id, scope, id_source, created_at, last_seen_at) VALUES ('s', '', 'test', 1.0, 1.0)"
    )
    conn.execute(
        "INSERT INTO turns (id, session_id, turn_index, turn_type, type_reason, api, model, stream, choice_index, "
        "n_prompt_tokens, n_completion_tokens, version, finish_reason, started_at, first_token_at, finished_at, "
        "status, created_at) VALUES (1, 's', 0, 'main', 't', 'openai.chat', 'm', 0, 0, 1, 1, 3, 'stop', 1, 1, 1, "
        "'pending', 1)"
    )
    conn.execute("INSERT INTO turn_owners (turn_id, owner) VALUES (1, 'key:00112233445566aa')")
    conn.close()
    with Store(path) as store:
        assert store.steps() == [(7, 3, 1.0, {"loss": 0.5})]
        assert store.checkpoints() == [(7, "/ckpt/step-00000007")]
        assert store.adapters_since(0) == (1, [SHARED_ADAPTER])
        assert store.turn_owner(1) == "key:00112233445566aa"
    with Store(path) as store:  # opening again changes nothing
        assert store.steps() == [(7, 3, 1.0, {"loss": 0.5})]


# --- the local backend: one model, an adapter per owner --------------------------------------------------------------
def _settings(model_dir: Path, tmp_path: Path, **lora: Any) -> Settings:
    return Settings(
        model=str(model_dir),
        api_key=ALICE,
        api_keys=[BOB],
        lora=LoraSettings(rank=4, alpha=8, **lora),
        local=LocalSettings(state_dir=tmp_path / "ckpt", keep_versions=2, max_concurrent_requests=4),
    )


async def _step(view: Any, prompt: list[int], advantage: float) -> None:
    result = await view.sample(prompt, SamplingParams(max_tokens=6, temperature=1.0, seed=3))
    datum = datum_from_completion(prompt, result.tokens, logprobs=result.logprobs, advantages=advantage)
    await view.discard_gradients()
    await view.forward_backward([datum], "importance_sampling")
    await view.optim_step(ADAM)


async def _greedy(view: Any, prompt: list[int]) -> list[float]:
    result = await view.sample(prompt, SamplingParams(max_tokens=6, temperature=0.0))
    scored = await view.compute_logprobs(prompt + result.tokens, start=len(prompt))
    return [float(v) for v in scored[len(prompt) :] if v is not None]


@pytest.mark.parametrize("resident", [8, 1], ids=["in-memory", "spilled-to-disk"])
async def test_each_adapter_trains_and_serves_its_own_versions(
    tiny_model_dir: Path, tmp_path: Path, resident: int
) -> None:
    alice, bob = key_owner(ALICE), key_owner(BOB)
    async with running(LocalBackend(_settings(tiny_model_dir, tmp_path, resident_adapters=resident))) as backend:
        a, b = backend.adapter(alice), backend.adapter(bob)
        prompt = user_prompt(backend)
        base = await _greedy(backend, prompt)
        await _step(a, prompt, 1.0)
        published = await a.publish()
        assert published.version == 1
        assert a.current_version().version == 1
        assert b.current_version().version == backend.current_version().version == 0
        assert b.servable_versions() == [0] and a.servable_versions() == [0, 1]
        with pytest.raises(BackendError, match=f"version 1 of adapter {bob} is not servable"):
            await b.sample(prompt, SamplingParams(max_tokens=1), version=1)
        assert await _greedy(b, prompt) == base  # bob is served by the base model until his own first step
        served_a = await _greedy(a, prompt)
        assert served_a != base
        # Bob trains from the base, not from alice's weights; alice's state comes back intact after bob's step.
        await _step(b, prompt, -1.0)
        await b.publish()
        assert b.current_version().version == 1
        assert await _greedy(a, prompt) == served_a
        await _step(a, prompt, 1.0)  # alice's second step continues her optimizer, then publishes her version 2
        assert (await a.publish()).version == 2
        assert b.current_version().version == 1
        if resident == 1:
            assert backend._states is not None and backend._states.in_memory == 1


async def test_two_owners_decode_in_one_batch_each_on_their_adapter(tiny_model_dir: Path, tmp_path: Path) -> None:
    """Rows of different adapters share decode steps and still give exactly what each adapter gives alone."""
    import asyncio

    alice, bob = key_owner(ALICE), key_owner(BOB)
    async with running(LocalBackend(_settings(tiny_model_dir, tmp_path))) as backend:
        a, b = backend.adapter(alice), backend.adapter(bob)
        prompt = user_prompt(backend)
        await _step(a, prompt, 1.0)
        await a.publish()
        await _step(b, prompt, -1.0)
        await b.publish()
        base = backend.adapter("key:00000000000000cc")  # a third owner, still on the base model
        params = SamplingParams(max_tokens=8, temperature=0.0)
        views = (a, b, base)
        alone = [await view.sample(prompt, params) for view in views]
        from openclaw_cli.backends.local import serving

        concatenated: list[int] = []
        original = serving.concat_versions
        serving.concat_versions = lambda versions, keys: concatenated.append(len(versions)) or original(versions, keys)  # type: ignore[assignment]
        try:
            together = await asyncio.gather(*(view.sample(prompt, params) for view in views))
        finally:
            serving.concat_versions = original
        assert concatenated == [2]  # one batch: the two adapters' deltas side by side once, for all its decode steps
        assert [r.tokens for r in together] == [r.tokens for r in alone]
        assert len({tuple(r.tokens) for r in alone}) > 1  # the adapters answer differently, so rows were told apart
        for got, want in zip(together, alone, strict=True):
            assert max(abs(x - y) for x, y in zip(got.logprobs, want.logprobs, strict=True)) < 1e-4


async def test_a_checkpoint_is_its_adapters_own(tiny_model_dir: Path, tmp_path: Path) -> None:
    alice = key_owner(ALICE)
    settings = _settings(tiny_model_dir, tmp_path)
    async with running(LocalBackend(settings)) as backend:
        a = backend.adapter(alice)
        prompt = user_prompt(backend)
        await _step(a, prompt, 1.0)
        await a.publish()
        path = await a.save_state("step-00000001")
        assert (
            Path(path).parent
            == adapter_state_dir(settings, alice)
            == (tmp_path / "ckpt").resolve() / "adapters" / ("key-" + alice[4:])
        )
        served = await _greedy(a, prompt)
        with pytest.raises(BackendError, match="not shared's"):
            await backend.load_state(path)
    async with running(LocalBackend(settings)) as restarted:
        a = restarted.adapter(alice)
        assert (await a.load_state(path)).version == 1
        assert await _greedy(a, prompt) == served
        assert restarted.current_version().version == 0


def test_vllm_lora_slots_hold_the_resident_owners_in_one_batch() -> None:
    """vLLM's multi-LoRA sizes: one shared adapter batches its kept versions (+ one finishing, + the base's zero
    adapter); owners' adapters batch lora.resident_adapters owners (+ the base), and memory holds their versions."""
    from openclaw_cli.backends.local.vllm_sampler import vllm_lora_slots

    shared = Settings(api_key=ALICE, local={"keep_versions": 3})
    assert vllm_lora_slots(shared) == (5, 5)
    owners = Settings(api_key=ALICE, api_keys=[BOB], local={"keep_versions": 3}, lora={"resident_adapters": 16})
    assert vllm_lora_slots(owners) == (17, 16 * 4 + 1)
    few = owners.model_copy(update={"lora": LoraSettings(resident_adapters=1)})
    assert vllm_lora_slots(few) == (5, 5)  # never fewer slots than one adapter's own versions need


@pytest.mark.parametrize("name", ["fireworks"])
def test_a_backend_without_adapters_is_refused_at_launch(name: str) -> None:
    from openclaw_cli.backend import create_backend
    from openclaw_cli.launch import require_adapter_support

    hot_reload = {"mode": "batch", "addon_mode": "hot_reload"}
    owners = Settings(backend=name, api_key=ALICE, api_keys=[BOB], fireworks=hot_reload)
    with pytest.raises(BackendError, match=r"hot-reload Fireworks deployment holds one LoRA.*lora.scope = 'shared'"):
        require_adapter_support(create_backend(owners), owners)
    for mode in ({"mode": "batch"}, {"mode": "stepwise"}):  # multi-LoRA batch mode and step-wise serve owners apart
        serves = Settings(backend=name, api_key=ALICE, api_keys=[BOB], fireworks=mode)
        require_adapter_support(create_backend(serves), serves)
    for fine in (
        Settings(backend=name, api_key=ALICE),
        owners.model_copy(update={"lora": LoraSettings(scope="shared")}),
    ):
        require_adapter_support(create_backend(fine), fine)  # one owner, or one adapter asked for: nothing to refuse
    gated = Settings(api_key=ALICE, api_keys=[BOB], train={"promotion_gate": True})
    require_adapter_support(LocalBackend(gated), gated)  # each owner's adapter has a gate of its own


def test_an_owners_promotion_gate_evaluates_on_that_owners_untrained_turns_only(tmp_path: Path) -> None:
    """The held-out set an adapter's promotion gate evaluates on: the turns that adapter served and its own trainer
    has not trained, one per session; another owner's conversations never enter it."""
    from openclaw_cli.learn.promotion import held_out_items

    alice, bob = key_owner(ALICE), key_owner(BOB)
    with Store(tmp_path / "store.sqlite3") as store:
        hers = [_ready_turn(store, alice, alice, i) for i in range(2)]
        his = _ready_turn(store, bob, bob, 0)
        shared = _ready_turn(store, "local", SHARED_ADAPTER, 0)
        assert [item.source for item in held_out_items(store, 5, alice)] == [f"turn:{hers[1]}"]
        assert [item.source for item in held_out_items(store, 5, bob)] == [f"turn:{his}"]
        assert [item.source for item in held_out_items(store, 5)] == [f"turn:{shared}"]
        store.complete(trainer_consumer(alice), hers[1], "{}")  # trained by alice's trainer: no longer held out
        store.complete(trainer_consumer(bob), hers[0], "{}")  # another trainer's mark does not count for hers
        assert [item.source for item in held_out_items(store, 5, alice)] == [f"turn:{hers[0]}"]


# --- the proxy: every API serves each owner from its own adapter -----------------------------------------------------
API_CALLS = {
    "chat": ("/v1/chat/completions", {"model": "openclaw-policy", "max_tokens": 6, "temperature": 0}),
    "responses": ("/v1/responses", {"model": "openclaw-policy", "max_output_tokens": 6, "temperature": 0}),
    "messages": ("/v1/messages", {"model": "openclaw-policy", "max_tokens": 6, "temperature": 0}),
}


def _body(api: str, stream: bool) -> tuple[str, dict[str, Any]]:
    path, body = API_CALLS[api]
    question = "What is the capital of France?"
    conversation = {"input": question} if api == "responses" else {"messages": [{"role": "user", "content": question}]}
    return path, {**body, **conversation, "stream": stream}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("api", sorted(API_CALLS))
async def test_each_owner_is_served_by_its_own_adapter_on_every_api(
    tiny_model_dir: Path, tmp_path: Path, api: str, stream: bool
) -> None:
    from openclaw_cli.proxy import BackgroundServer, create_app
    from openclaw_cli.testing.fake_backend import MemorySink

    alice, bob = key_owner(ALICE), key_owner(BOB)
    settings = _settings(tiny_model_dir, tmp_path)
    async with running(LocalBackend(settings)) as backend:
        a = backend.adapter(alice)
        await _step(a, user_prompt(backend), 1.0)
        await a.publish()
        sink = MemorySink()
        server = BackgroundServer(create_app(backend, sink, settings)).start()
        path, body = _body(api, stream)
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
                replies = {
                    who: await client.post(path, json=body, headers={"Authorization": f"Bearer {key}"})
                    for who, key in (("alice", ALICE), ("bob", BOB))
                }
                nobody = await client.post(path, json=body)
        finally:
            server.stop()
    assert {who: r.status_code for who, r in replies.items()} == {"alice": 200, "bob": 200}
    assert nobody.status_code == 401
    assert replies["alice"].headers["x-openclaw-adapter"] == alice
    assert replies["alice"].headers["x-openclaw-policy-version"] == "1"
    assert replies["bob"].headers["x-openclaw-adapter"] == bob
    assert replies["bob"].headers["x-openclaw-policy-version"] == "0"  # bob's adapter has not stepped: the base
    recorded = {e.metadata["owner"]: e for e in sink.exchanges}
    assert recorded[alice].metadata["adapter"] == alice and recorded[alice].version == 1
    assert recorded[bob].metadata["adapter"] == bob and recorded[bob].version == 0


async def test_session_owners_get_their_own_adapters(tiny_model_dir: Path, tmp_path: Path) -> None:
    from openclaw_cli.proxy import BackgroundServer, create_app
    from openclaw_cli.testing.fake_backend import MemorySink

    settings = Settings(
        model=str(tiny_model_dir),
        lora=LoraSettings(rank=4, alpha=8),
        lessons=LessonSettings(scope="session"),
        local=LocalSettings(state_dir=tmp_path / "ckpt", keep_versions=2),
    )
    async with running(LocalBackend(settings)) as backend:
        first = backend.adapter("session:chat-1")
        await _step(first, user_prompt(backend), 1.0)
        await first.publish()
        server = BackgroundServer(create_app(backend, MemorySink(), settings)).start()
        path, body = _body("chat", False)
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
                one = await client.post(path, json=body, headers={"x-session-id": "chat-1"})
                two = await client.post(path, json=body, headers={"x-session-id": "chat-2"})
        finally:
            server.stop()
    assert (one.headers["x-openclaw-adapter"], one.headers["x-openclaw-policy-version"]) == ("session:chat-1", "1")
    assert (two.headers["x-openclaw-adapter"], two.headers["x-openclaw-policy-version"]) == ("session:chat-2", "0")


def test_parked_trainer_state_round_trips_through_a_file(tiny_model_dir: Path, tmp_path: Path) -> None:
    from openclaw_cli.backends.local.model_loading import load_model
    from openclaw_cli.backends.local.trainer import LoraTrainer

    settings = _settings(tiny_model_dir, tmp_path)
    trainer = LoraTrainer(load_model(settings).model, settings.lora, seed=0)
    with torch.no_grad():
        for param in trainer._lora_params:
            param.add_(0.25)
    parked = trainer.park()
    trainer.save_parked(parked, tmp_path / "parked.pt")
    back = trainer.load_parked(tmp_path / "parked.pt")
    assert all(torch.equal(x, y) for x, y in zip(parked.weights, back.weights, strict=True))
    assert back.step == parked.step and back.optimizer is None


# --- fairness: the adapter that stepped longest ago goes first -------------------------------------------------------
class _StubLoop:
    """A TrainerLoop stand-in with a number of full batches waiting."""

    def __init__(self, name: str, batches: int, log: list[str]) -> None:
        from openclaw_cli.learn.trainer_loop import TrainerStats

        self.name, self.batches, self.log, self.stats = name, batches, log, TrainerStats()
        self.pending_turns = 0

    async def run_once(self) -> Any:
        from openclaw_cli.learn.trainer_loop import StepReport

        if not self.batches:
            return None
        self.batches -= 1
        self.log.append(self.name)
        return StepReport(step=1, version=1, metrics={}, trained_turn_ids=[], batch_turn_ids=[])


async def test_an_owner_with_a_backlog_does_not_starve_the_others(tmp_path: Path) -> None:
    from openclaw_cli.learn.trainer_pool import TrainerPool
    from openclaw_cli.testing.fake_backend import FakeBackend

    log: list[str] = []
    with Store(tmp_path / "store.sqlite3") as store:
        pool = TrainerPool(store, FakeBackend(None), Settings())  # type: ignore[arg-type]
        for name, batches in (("shared", 0), ("busy", 6), ("a", 2), ("b", 1)):
            pool.loops[name] = _StubLoop(name, batches, log)  # type: ignore[assignment]
            pool._last_step_at[name] = 0.0
        while await pool.run_once():
            pass
    # Every owner with a full batch steps once before the busy one steps again; then the busy one drains.
    assert log == ["busy", "a", "b", "busy", "a", "busy", "busy", "busy", "busy"]


# --- the owner's own controls: versions and rollback act on the caller's adapter only ---------------------------------
async def test_versions_and_rollback_are_the_callers_own(tiny_model_dir: Path, tmp_path: Path) -> None:
    from openclaw_cli.proxy import BackgroundServer, create_app
    from openclaw_cli.testing.fake_backend import MemorySink

    alice, bob = key_owner(ALICE), key_owner(BOB)
    settings = _settings(tiny_model_dir, tmp_path)
    async with running(LocalBackend(settings)) as backend:
        a = backend.adapter(alice)
        for _ in range(2):
            await _step(a, user_prompt(backend), 1.0)
            await a.publish()
        server = BackgroundServer(create_app(backend, MemorySink(), settings)).start()
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:

                def as_(key: str) -> dict[str, str]:
                    return {"Authorization": f"Bearer {key}"}

                listed = {
                    who: (await client.get("/v1/openclaw/versions", headers=as_(k))).json()
                    for who, k in (("a", ALICE), ("b", BOB))
                }
                bobs_rollback = await client.post("/v1/openclaw/rollback", json={"version": 2}, headers=as_(BOB))
                anonymous = await client.post("/v1/openclaw/rollback", json={"version": 1})
                alices_rollback = await client.post("/v1/openclaw/rollback", json={"version": 1}, headers=as_(ALICE))
        finally:
            server.stop()
        assert a.current_version().version == 1 and backend.adapter(bob).current_version().version == 0
    assert listed["a"] == {"adapter": alice, "current": 2, "current_name": "v2", "servable": [0, 1, 2]}
    assert listed["b"] == {"adapter": bob, "current": 0, "current_name": "base", "servable": [0]}
    assert bobs_rollback.status_code == 404 and "servable versions: 0" in bobs_rollback.json()["error"]["message"]
    assert anonymous.status_code == 401
    assert alices_rollback.status_code == 200
    assert alices_rollback.json()["adapter"] == alice and alices_rollback.json()["previous_version"] == 2


def test_the_operator_acts_as_an_owner_with_that_owners_configured_key() -> None:
    from openclaw_cli.command_support import CliFailure, owner_headers

    settings = Settings(api_key=ALICE, api_keys=[BOB])
    assert owner_headers(settings, key_owner(BOB)) == {"Authorization": f"Bearer {BOB}"}
    with pytest.raises(CliFailure, match="no configured API key belongs to owner key:"):
        owner_headers(settings, key_owner(CAROL))


def test_forget_owner_erases_their_turns_lessons_and_adapter(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from openclaw_cli.cli import app

    alice, bob = key_owner(ALICE), key_owner(BOB)
    config = tmp_path / "openclaw.toml"
    config.write_text(
        f'api_key = "{ALICE}"\napi_keys = ["{BOB}"]\n[store]\npath = "{tmp_path / "store.sqlite3"}"\n'
        f'[local]\nstate_dir = "{tmp_path / "ckpt"}"\n'
    )
    with Store(tmp_path / "store.sqlite3") as store:
        hers = [_ready_turn(store, alice, alice, i) for i in range(3)]
        his = [_ready_turn(store, bob, bob, i) for i in range(2)]
        store.add_lesson(alice, "Answer in one short sentence.", origin="user", status="active", why="test")
        store.commit_step(1, 1, {}, trainer_consumer(alice), {t: {} for t in hers}, adapter=alice)
        store.record_checkpoint(1, "x", adapter=alice)
    adapter_dir = adapter_state_dir(Settings(local=LocalSettings(state_dir=tmp_path / "ckpt")), alice) / "step-00000001"
    adapter_dir.mkdir(parents=True)
    exported = CliRunner().invoke(app, ["--config", str(config), "export", "--owner", alice])
    assert exported.exit_code == 0 and len(exported.output.splitlines()) == len(hers)
    with Store(tmp_path / "store.sqlite3") as running_server:
        running_server.take_over_claims("judge")  # what a launch does first: it holds the store from then on
        refused = CliRunner().invoke(app, ["--config", str(config), "forget-owner", alice, "--yes"])
    assert refused.exit_code == 1 and "in use by" in refused.output and "stop that process" in refused.output
    result = CliRunner().invoke(app, ["--config", str(config), "forget-owner", alice, "--yes"])
    assert result.exit_code == 0, result.output
    assert (
        "deleted 3 turns, 1 sessions, 1 lessons, 1 steps, 1 checkpoint records and the adapter's files" in result.output
    )
    assert "not undone: copies outside this store" in result.output
    assert not adapter_dir.parent.exists()
    with Store(tmp_path / "store.sqlite3") as store:
        assert all(store.get_turn(t) is None for t in hers) and all(store.get_turn(t) for t in his)
        assert store.lessons(owner=alice) == [] and store.steps(adapter=alice) == []
        assert store.adapters_since(0)[1] == [bob]
    on_tinker = ["--config", str(config), "forget-owner", bob, "--set", "backend=tinker"]
    declined = CliRunner().invoke(app, on_tinker, input="n\n")  # asked first; "no" deletes nothing
    assert declined.exit_code == 1 and "what the tinker service keeps of this adapter" in declined.output
    with Store(tmp_path / "store.sqlite3") as store:
        assert all(store.get_turn(t) for t in his)
    shared = CliRunner().invoke(
        app, ["--config", str(config), "forget-owner", bob, "--yes", "--set", "lora.scope=shared"]
    )
    assert shared.exit_code == 0 and "the shared adapter keeps what it learned from this owner" in shared.output


async def test_owners_past_the_resident_bound_are_served_from_disk_unchanged(
    tiny_model_dir: Path, tmp_path: Path
) -> None:
    """Three owners' adapters with room for one in memory: each comes back from its file with the same replies."""
    owners = [f"key:{i:016x}" for i in range(3)]
    async with running(LocalBackend(_settings(tiny_model_dir, tmp_path, resident_adapters=1))) as backend:
        prompt = user_prompt(backend)
        served = {}
        for i, owner in enumerate(owners):
            view = backend.adapter(owner)
            await _step(view, prompt, 1.0 if i % 2 else -1.0)
            await view.publish()
            served[owner] = await _greedy(view, prompt)
        assert backend._versions is not None and backend._versions.resident_adapters() == 1
        spilled = [p for p in (tmp_path / "ckpt").rglob("served-versions.pt")]
        assert len(spilled) == 2
        for owner in owners:
            view = backend.adapter(owner)
            assert view.current_version().version == 1 and view.servable_versions() == [0, 1]
            assert await _greedy(view, prompt) == served[owner]


async def test_each_adapters_loop_publishes_through_a_gate_of_its_own(tiny_tokenizer: Any, tmp_path: Path) -> None:
    from openclaw_cli.learn.trainer_pool import TrainerPool
    from openclaw_cli.testing.fake_backend import FakeBackend

    made: list[str] = []

    class Gate:
        def __init__(self, view: Any, adapter: str) -> None:
            assert view.adapter_name == adapter
            made.append(adapter)

        async def publish(self, name: str) -> Any: ...

        def last_publish(self) -> None:
            return None

    alice = key_owner(ALICE)
    settings = Settings(api_key=ALICE, api_keys=[BOB], local=LocalSettings(state_dir=tmp_path / "ckpt"))
    with Store(tmp_path / "store.sqlite3") as store:
        pool = TrainerPool(store, FakeBackend(tiny_tokenizer), settings, gate_for=Gate)
        _ready_turn(store, alice, alice, 0)
        await pool.resume()
        await pool._discover()
    assert made == [SHARED_ADAPTER, alice]
    assert pool.loops[alice].publisher == pool.gates[alice].publish  # type: ignore[union-attr]


class _Waiting:
    def __init__(self, n: int) -> None:
        self.n = n

    async def waiting(self) -> int:
        return self.n


async def test_owners_part_filled_batches_never_hold_the_judge_back(tmp_path: Path) -> None:
    """Three owners each a turn short of a batch: the judge must go on judging (else no batch ever fills)."""
    from openclaw_cli.learn.trainer_pool import TrainerPool
    from openclaw_cli.testing.fake_backend import FakeBackend

    settings = Settings(train={"batch_size": 4}, judge={"max_ahead": 8})
    with Store(tmp_path / "store.sqlite3") as store:
        pool = TrainerPool(store, FakeBackend(None), settings)  # type: ignore[arg-type]
        for name, waiting in (("shared", 3), ("a", 3), ("b", 3), ("c", 9)):
            pool.loops[name] = _Waiting(waiting)  # type: ignore[assignment]
        assert await pool.waiting() == 8 + 3  # c's two full batches and the largest part-filled one
        for name in ("a", "b", "c"):
            del pool.loops[name]
        assert await pool.waiting() == 3  # one adapter: its own count


def test_the_dashboard_shows_each_owners_adapter_never_a_key() -> None:
    from rich.console import Console

    from openclaw_cli.dashboard import Snapshot, render

    rows = [
        {"adapter": "shared", "version": 0, "steps": 0},
        {"adapter": key_owner(ALICE), "version": 3, "steps": 3},
    ]
    console = Console(width=200, record=True)
    console.print(render(Snapshot(url="u", backend="local", backend_ok=True, policy_version=0, adapters=rows)))
    text = console.export_text()
    assert f"1 adapter(s): {key_owner(ALICE)} v3 (3 steps)" in text and ALICE not in text


async def test_idle_owners_are_asked_less_often_when_there_are_many(tmp_path: Path) -> None:
    from openclaw_cli.learn.trainer_pool import MAX_IDLE_S, TrainerPool
    from openclaw_cli.testing.fake_backend import FakeBackend

    asked: list[str] = []
    with Store(tmp_path / "store.sqlite3") as store:
        pool = TrainerPool(store, FakeBackend(None), Settings())  # type: ignore[arg-type]
        pool.loops.clear()
        for i in range(200):
            name = f"key:{i:016x}"
            loop = _StubLoop(name, 0, asked)

            async def run_once(name: str = name) -> None:
                asked.append(name)

            loop.run_once = run_once  # type: ignore[method-assign]
            pool.loops[name] = loop  # type: ignore[assignment]
            pool._last_step_at[name] = 0.0
        for _ in range(10):
            await pool.run_once()
    # Asked once each, then backed off (0.5 s, then more): ten quick rounds ask each idle owner at most once more.
    assert len(asked) <= 2 * 200 and MAX_IDLE_S > 0


async def test_an_owner_takes_their_own_adapter_and_only_theirs(tiny_model_dir: Path, tmp_path: Path) -> None:
    import io
    import json
    import tarfile

    from openclaw_cli.proxy import BackgroundServer, create_app
    from openclaw_cli.testing.fake_backend import MemorySink

    alice = key_owner(ALICE)
    settings = _settings(tiny_model_dir, tmp_path)
    async with running(LocalBackend(settings)) as backend:
        a = backend.adapter(alice)
        await _step(a, user_prompt(backend), 1.0)
        await a.publish()
        served = backend._versions.acquire(None, alice)  # type: ignore[union-attr]
        server = BackgroundServer(create_app(backend, MemorySink(), settings)).start()
        try:
            async with httpx.AsyncClient(base_url=server.base_url, timeout=60) as client:
                hers = await client.get("/v1/openclaw/adapter", headers={"Authorization": f"Bearer {ALICE}"})
                his = await client.get("/v1/openclaw/adapter", headers={"Authorization": f"Bearer {BOB}"})
                nobody = await client.get("/v1/openclaw/adapter")
        finally:
            server.stop()
    assert hers.status_code == 200 and hers.headers["x-openclaw-adapter"] == alice
    assert hers.headers["x-openclaw-policy-version"] == "1"
    with tarfile.open(fileobj=io.BytesIO(hers.content), mode="r:gz") as tar:
        assert sorted(tar.getnames()) == ["adapter_config.json", "adapter_model.safetensors"]
        config = json.loads(tar.extractfile("adapter_config.json").read())  # type: ignore[union-attr]
        from safetensors.torch import load

        tensors = load(tar.extractfile("adapter_model.safetensors").read())  # type: ignore[union-attr]
    assert config["r"] == 4 and config["peft_type"] == "LORA"
    key = next(iter(served.weights))
    assert torch.equal(tensors[f"base_model.model.{key}.lora_B.weight"], served.weights[key].b)
    assert his.status_code == 404 and "no trained adapter yet" in his.json()["error"]["message"]
    assert nobody.status_code == 401
