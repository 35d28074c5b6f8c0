"""TEST DOUBLE of the Fireworks REST API: the control plane and the completions endpoint, on 127.0.0.1.

It speaks the wire format the official ``fireworks-ai`` SDK sends and parses (camelCase JSON, ids in the query
string, ``{"<plural>": [...], "nextPageToken"}`` lists, ``:action`` suffixes, multipart dataset upload, SSE
streaming), so the backend is tested through the real SDK. With ``base_url`` overridden the SDK sends inference and
control-plane calls to the same host, so one server serves both.

Real computation, tiny model: completions run on the local backend's :class:`~openclaw_cli.backends.local.sampler.
TransformersSampler` over :class:`~openclaw_cli.backends.local.serving.PolicyVersions` (so token ids and
log-probabilities are the model's own), and an SFT job really trains a LoRA with
:class:`~openclaw_cli.backends.local.trainer.LoraTrainer` (cross-entropy on each row's final assistant reply, ``epochs``
optimizer steps over the whole dataset, warm-started
from the ``warmStartFrom`` LoRA's saved state). A loaded LoRA is published into the served versions once its
deployed model reaches DEPLOYED, so a newly trained LoRA really changes what serving returns.

State changes over polls, as the real service's do: every GET of a resource advances it one poll; after ``polls``
GETs a deployment goes CREATING -> READY, a dataset UPLOADING -> READY after its upload, a job
JOB_STATE_CREATING -> JOB_STATE_RUNNING (training starts) -> JOB_STATE_COMPLETED (when training finished), its output
model UPLOADING -> READY, a deployed model DEPLOYING -> DEPLOYED.

Errors modelled: 401 without the key; 409 for a duplicate id; 400 for ``enableAddons`` together with
``enableHotReloadLatestAddon``, a dataset under 3 rows or with a row lacking ``messages``, both or neither of
``baseModel`` / ``warmStartFrom``, a LoRA rank outside 4..64, a LoRA loaded onto a deployment without addons or onto
a hot-reload deployment without ``replaceMergedAddon``; 404 for unknown resources and models; 503
``DEPLOYMENT_SCALING_UP`` for the first ``scale_up_503s`` completions after a scale to zero (then a replica is up).
Knobs: ``fail_next_job`` (the next job ends in JOB_STATE_FAILED), ``scale_up_503s``, ``polls``.

Simplified, not modelled: billing, quotas, regions, shapes and accelerators (accepted and echoed), signed-URL
uploads, pagination beyond one page, chat completions (the backend only uses completions), ``top_logprobs``.
The wire details of ``echo`` (log-probabilities of the prompt tokens, the first one reported as 0.0) are this
double's reading of the API. Never use it outside tests.
"""

from __future__ import annotations

import email.parser
import email.policy
import itertools
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from openclaw_cli.backend import BackendError
from openclaw_cli.testing.served_double import ServedDouble
from openclaw_cli.types import SampleResult, SamplingParams, TokenChunk

ACCOUNT = "test-account"
API_KEY = "fw-double-secret-key"
BASE_MODEL = "accounts/fireworks/models/tiny-qwen3"
SCALING_UP_MESSAGE = "The deployment is scaling up from zero replicas; retry the request shortly"


class ApiError(Exception):
    """An error answer in the control-plane shape ``{"code", "message", "details"}`` (grpc-gateway style)."""

    GRPC: ClassVar[dict[int, int]] = {400: 3, 401: 16, 404: 5, 409: 6, 412: 9, 503: 14}

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def response(self) -> JSONResponse:
        body = {"code": self.GRPC.get(self.status, 2), "message": self.message, "details": []}
        return JSONResponse(body, status_code=self.status)


def inference_error(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": {"object": "error", "type": code.lower(), "code": code, "message": message}}, status)


@dataclass
class _Resource:
    """One stored resource: its public JSON, polls seen so far, and private state."""

    body: dict[str, Any]
    polls: int = 0
    private: dict[str, Any] = field(default_factory=dict)


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


class FireworksDouble(ServedDouble):
    """The double's state and FastAPI app; ``with FireworksDouble(model_dir) as fw: fw.base_url ...``."""

    def __init__(
        self,
        model_dir: Path,
        *,
        work_dir: Path,
        account_id: str = ACCOUNT,
        api_key: str = API_KEY,
        base_model: str = BASE_MODEL,
        polls: int = 2,
        scale_up_503s: int = 2,
    ) -> None:
        self.model_dir = Path(model_dir)
        self.work_dir = Path(work_dir)
        self.account_id = account_id
        self.api_key = api_key
        self.base_model = base_model
        self.polls = polls
        self.scale_up_503s = scale_up_503s
        self.fail_next_job = False
        self.lock = threading.RLock()
        self.deployments: dict[str, _Resource] = {}
        self.models: dict[str, _Resource] = {}
        self.datasets: dict[str, _Resource] = {}
        self.jobs: dict[str, _Resource] = {}
        self.deployed_models: dict[str, _Resource] = {}
        self.calls: list[tuple[str, str]] = []  # (method, path + query) of every request, for assertions
        self.completion_bodies: list[dict[str, Any]] = []
        self.scale_up_answers = 0  # 503 DEPLOYMENT_SCALING_UP answers given
        self._ids = itertools.count(1)
        self._load_engine()
        self.app = self._build_app()

    # -- lifecycle ------------------------------------------------------------------------------------------------

    def _load_engine(self) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        from openclaw_cli.backends.local.sampler import TransformersSampler
        from openclaw_cli.backends.local.serving import PolicyVersions
        from openclaw_cli.settings import DEFAULT_LORA_TARGETS
        from openclaw_cli.tokenizer import HFChatTokenizer

        self.tokenizer = HFChatTokenizer.from_pretrained(self.model_dir)
        # Two copies: the trainer's PEFT model must be built on weights the serving wrappers never touched.
        self._train_model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        serve_model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        for param in (*serve_model.parameters(), *self._train_model.parameters()):
            param.requires_grad_(False)
        self.targets = list(DEFAULT_LORA_TARGETS)
        self.versions = PolicyVersions(serve_model, self.targets, keep=64)
        self.sampler = TransformersSampler(
            serve_model, self.tokenizer, self.versions, max_concurrent=4, context_length=self.tokenizer.context_length
        )
        self._train_lock = threading.Lock()  # one training job at a time (the model copy is shared)

    def release(self) -> None:
        self.sampler.close()

    @property
    def base_url(self) -> str:
        return self.url

    # -- names ----------------------------------------------------------------------------------------------------

    def name(self, collection: str, resource_id: str) -> str:
        return f"accounts/{self.account_id}/{collection}/{resource_id}"

    @staticmethod
    def short(name: str) -> str:
        return name.rsplit("/", 1)[-1]

    # -- app ------------------------------------------------------------------------------------------------------

    def _build_app(self) -> FastAPI:
        app = FastAPI()
        prefix = "/v1/accounts/{account}"

        @app.middleware("http")
        async def auth_and_log(request: Request, call_next: Any) -> Response:
            query = f"?{request.url.query}" if request.url.query else ""
            with self.lock:
                self.calls.append((request.method, request.url.path + query))
            if request.headers.get("authorization") != f"Bearer {self.api_key}":
                return inference_error(401, "UNAUTHENTICATED", "invalid API key")
            try:
                return await call_next(request)
            except ApiError as exc:
                return exc.response()

        def route(path: str, methods: list[str]) -> Any:
            def register(handler: Any) -> Any:
                async def endpoint(request: Request) -> Response:
                    account = request.path_params.get("account")
                    if account is not None and account != self.account_id:
                        return ApiError(404, f"account {account} not found").response()
                    try:
                        result = await handler(request, **request.path_params)
                    except ApiError as exc:
                        return exc.response()
                    return result if isinstance(result, Response) else JSONResponse(result)

                app.add_api_route(path, endpoint, methods=methods)
                return handler

            return register

        route(prefix + "/{collection}", ["GET", "POST"])(self._collection)
        route(prefix + "/{collection}/{target}", ["GET", "POST", "PATCH", "DELETE"])(self._item)
        app.add_api_route("/v1/completions", self._completions, methods=["POST"])
        return app

    async def _collection(self, request: Request, account: str, collection: str) -> Any:
        store = self._store(collection)
        if request.method == "GET":
            with self.lock:
                items = [self._advance(collection, key) for key in list(store)]
            return {collection: items, "nextPageToken": ""}
        body = await _json(request)
        with self.lock:
            if collection == "deployments":
                return self._create_deployment(request.query_params.get("deploymentId"), body)
            if collection == "datasets":
                return self._create_dataset(body)
            if collection == "supervisedFineTuningJobs":
                return self._create_job(request.query_params.get("supervisedFineTuningJobId"), body)
            if collection == "deployedModels":
                replace = request.query_params.get("replaceMergedAddon", "").lower() == "true"
                return self._load_lora(body, replace)
        raise ApiError(404, f"POST {collection} is not part of this double")

    async def _item(self, request: Request, account: str, collection: str, target: str) -> Any:
        resource_id, _, action = target.partition(":")
        store = self._store(collection)
        if collection == "datasets" and action == "upload":
            content = await request.body()
            rows = _jsonl_rows(_multipart_file(request.headers.get("content-type", ""), content))
            with self.lock:
                return self._upload_dataset(resource_id, rows)
        body = await _json(request) if request.method in ("POST", "PATCH") else {}
        with self.lock:
            if resource_id not in store:
                raise ApiError(404, f"{collection[:-1]} {self.name(collection, resource_id)} not found")
            if action == "scale" and collection == "deployments":
                return self._scale(resource_id, body)
            if action:
                raise ApiError(404, f"{collection}:{action} is not part of this double")
            if request.method == "GET":
                return self._advance(collection, resource_id)
            if request.method == "DELETE":
                return self._delete(collection, resource_id)
        raise ApiError(404, f"{request.method} {collection}/{{id}} is not part of this double")

    def _store(self, collection: str) -> dict[str, _Resource]:
        stores = {
            "deployments": self.deployments,
            "models": self.models,
            "datasets": self.datasets,
            "supervisedFineTuningJobs": self.jobs,
            "deployedModels": self.deployed_models,
        }
        if collection not in stores:
            raise ApiError(404, f"unknown collection {collection}")
        return stores[collection]

    # -- deployments ----------------------------------------------------------------------------------------------

    def _create_deployment(self, deployment_id: str | None, body: dict[str, Any]) -> dict[str, Any]:
        if not body.get("baseModel"):
            raise ApiError(400, "baseModel is required")
        if body.get("enableAddons") and body.get("enableHotReloadLatestAddon"):
            raise ApiError(400, "enableAddons and enableHotReloadLatestAddon cannot both be set")
        deployment_id = deployment_id or f"dep-{next(self._ids)}"
        if deployment_id in self.deployments:
            raise ApiError(409, f"deployment {self.name('deployments', deployment_id)} already exists")
        resource = {
            **body,
            "name": self.name("deployments", deployment_id),
            "state": "CREATING",
            "createTime": _now(),
            "replicaCount": max(1, int(body.get("minReplicaCount", 0) or 0)),
            "enableAddons": bool(body.get("enableAddons")),
            "enableHotReloadLatestAddon": bool(body.get("enableHotReloadLatestAddon")),
        }
        self.deployments[deployment_id] = _Resource(resource, private={"scale_up_left": 0, "merged_version": None})
        return dict(resource)

    def add_deployment(self, deployment_id: str, *, addons: bool = True, hot_reload: bool = False) -> None:
        """Seed an existing, READY deployment (as if created outside openclaw)."""
        with self.lock:
            spec = {"baseModel": self.base_model, "enableAddons": addons, "enableHotReloadLatestAddon": hot_reload}
            self._create_deployment(deployment_id, spec)
            self.deployments[deployment_id].body["state"] = "READY"

    def _scale(self, deployment_id: str, body: dict[str, Any]) -> dict[str, Any]:
        replicas = int(body.get("replicaCount", 0) or 0)
        resource = self.deployments[deployment_id]
        resource.body["replicaCount"] = replicas
        resource.private["scale_up_left"] = self.scale_up_503s if replicas == 0 else 0
        return {}

    # -- datasets -------------------------------------------------------------------------------------------------

    def _create_dataset(self, body: dict[str, Any]) -> dict[str, Any]:
        dataset_id = body.get("datasetId")
        if not dataset_id:
            raise ApiError(400, "datasetId is required")
        if dataset_id in self.datasets:
            raise ApiError(409, f"dataset {self.name('datasets', dataset_id)} already exists")
        spec = body.get("dataset") or {}
        resource = {**spec, "name": self.name("datasets", dataset_id), "state": "UPLOADING", "createTime": _now()}
        self.datasets[dataset_id] = _Resource(resource, private={"rows": None})
        return dict(resource)

    def _upload_dataset(self, dataset_id: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
        resource = self.datasets.get(dataset_id)
        if resource is None:
            raise ApiError(404, f"dataset {self.name('datasets', dataset_id)} not found")
        if len(rows) < 3:
            raise ApiError(400, f"a dataset needs at least 3 examples, got {len(rows)}")
        for number, row in enumerate(rows, 1):
            messages = row.get("messages")
            if not isinstance(messages, list) or not messages or messages[-1].get("role") != "assistant":
                raise ApiError(400, f"line {number}: each example needs messages ending with an assistant message")
        resource.private["rows"] = rows
        resource.polls = 0
        resource.body["exampleCount"] = str(len(rows))
        return {}

    # -- jobs -----------------------------------------------------------------------------------------------------

    def _create_job(self, job_id: str | None, body: dict[str, Any]) -> dict[str, Any]:
        job_id = job_id or f"job-{uuid.uuid4().hex[:8]}"
        if job_id in self.jobs:
            raise ApiError(409, f"supervised fine-tuning job {job_id} already exists")
        if bool(body.get("baseModel")) == bool(body.get("warmStartFrom")):
            raise ApiError(400, "exactly one of baseModel and warmStartFrom must be set")
        dataset = self.datasets.get(self.short(body.get("dataset", "")))
        if dataset is None or dataset.body["state"] != "READY":
            raise ApiError(400, f"dataset {body.get('dataset')} does not exist or is not READY")
        rank = int(body.get("loraRank") or 8)
        if body.get("baseModel") and not 4 <= rank <= 64:
            raise ApiError(400, f"loraRank must be between 4 and 64, got {rank}")
        if body.get("warmStartFrom"):
            source = self.models.get(self.short(body["warmStartFrom"]))
            if source is None or source.body["state"] != "READY":
                raise ApiError(400, f"warmStartFrom model {body['warmStartFrom']} does not exist or is not READY")
            rank = int(source.body["peftDetails"]["r"])
        output = self.short(body.get("outputModel") or job_id)
        if output in self.models:
            raise ApiError(409, f"output model {self.name('models', output)} already exists")
        resource = {
            **body,
            "name": self.name("supervisedFineTuningJobs", job_id),
            "state": "JOB_STATE_CREATING",
            "createTime": _now(),
            "outputModel": self.name("models", output),
            "loraRank": rank,
        }
        fail = self.fail_next_job
        self.fail_next_job = False
        self.jobs[job_id] = _Resource(
            resource, private={"rank": rank, "fail": fail, "thread": None, "error": None, "weights": None}
        )
        return dict(resource)

    def _run_job(self, job_id: str) -> None:
        """Train the job's LoRA (in its own thread); the output model appears when the job completes."""
        resource = self.jobs[job_id]
        body, private = resource.body, resource.private
        try:
            if private["fail"]:
                raise RuntimeError("training diverged (failure injected by the test)")
            rows = self.datasets[self.short(body["dataset"])].private["rows"]
            source = self.models[self.short(body["warmStartFrom"])] if body.get("warmStartFrom") else None
            directory = self.work_dir / "models" / self.short(body["outputModel"])
            with self._train_lock:
                private["weights"] = self._train(rows, private["rank"], source, directory, body)
            private["dir"] = directory
        except Exception as exc:
            private["error"] = f"{type(exc).__name__}: {exc}"

    def _train(
        self, rows: list[dict[str, Any]], rank: int, source: _Resource | None, directory: Path, body: dict[str, Any]
    ) -> Any:
        """Cross-entropy on each row's final reply, ``epochs`` Adam steps; saves the trainer (for warm starts) and
        returns the LoRA weights to serve."""
        from openclaw_cli.backends.local.trainer import LoraTrainer
        from openclaw_cli.settings import LoraSettings
        from openclaw_cli.types import AdamParams, datum_from_completion

        trainer = LoraTrainer(self._train_model, LoraSettings(rank=rank, alpha=rank, targets=self.targets), seed=0)
        if source is not None:
            trainer.load(source.private["dir"])
        datums = [datum_from_completion(prompt, reply) for prompt, reply in self.training_pairs(rows)]
        adam = AdamParams(learning_rate=float(body.get("learningRate") or 1e-4))
        for _ in range(int(body.get("epochs") or 1)):
            trainer.forward_backward(datums, "cross_entropy")
            trainer.optim_step(adam)
        trainer.save(directory)
        return trainer.lora_weights()

    def training_pairs(self, rows: list[dict[str, Any]]) -> list[tuple[list[int], list[int]]]:
        """(prompt ids, reply ids) a job trains on for each row: the chat rendered with the model's template, the
        reply being the final assistant turn up to and including its end-of-turn token."""
        pairs = []
        for row in rows:
            messages, tools = row["messages"], row.get("tools")
            prompt = self.tokenizer.render(messages[:-1], tools, add_generation_prompt=True)
            full = self.tokenizer.render(messages, tools, add_generation_prompt=False)
            if full[: len(prompt)] != prompt:
                raise ValueError("the chat template does not extend the prompt with the reply")
            reply = full[len(prompt) :]
            # The template closes every turn with "<|im_end|>\n"; the trailing newline is not part of the reply.
            end = max(i for i, t in enumerate(reply) if t in self.tokenizer.eos_token_ids) + 1
            pairs.append((prompt, reply[:end]))
        return pairs

    # -- models and deployed models -------------------------------------------------------------------------------

    def _complete_job(self, job_id: str) -> None:
        resource = self.jobs[job_id]
        private = resource.private
        if private["error"] is not None:
            resource.body["state"] = "JOB_STATE_FAILED"
            resource.body["status"] = {"code": "INTERNAL", "message": private["error"]}
            return
        resource.body["state"] = "JOB_STATE_COMPLETED"
        resource.body["completedTime"] = _now()
        model_id = self.short(resource.body["outputModel"])
        model = {
            "name": self.name("models", model_id),
            "kind": "HF_PEFT_ADDON",
            "state": "UPLOADING",
            "createTime": _now(),
            "peftDetails": {"baseModel": self.base_model, "r": private["rank"], "targetModules": self.targets},
        }
        self.models[model_id] = _Resource(model, private={"dir": private["dir"], "weights": private["weights"]})

    def _load_lora(self, body: dict[str, Any], replace: bool) -> dict[str, Any]:
        deployment = self.deployments.get(self.short(body.get("deployment", "")))
        if deployment is None:
            raise ApiError(400, f"deployment {body.get('deployment')} does not exist")
        model = self.models.get(self.short(body.get("model", "")))
        if model is None or model.body["state"] != "READY":
            raise ApiError(400, f"model {body.get('model')} does not exist or is not READY")
        hot_reload = deployment.body["enableHotReloadLatestAddon"]
        if not (deployment.body["enableAddons"] or hot_reload):
            raise ApiError(400, f"deployment {deployment.body['name']} does not support LoRA addons")
        if hot_reload and not replace:
            raise ApiError(400, "replaceMergedAddon must be specified for hot reload deployments")
        for existing in self.deployed_models.values():
            same = (
                existing.body["model"] == model.body["name"] and existing.body["deployment"] == deployment.body["name"]
            )
            if same:
                raise ApiError(409, f"{model.body['name']} is already deployed to {deployment.body['name']}")
        deployed_id = f"{self.short(model.body['name'])}-{next(self._ids)}"
        resource = {
            "name": self.name("deployedModels", deployed_id),
            "model": model.body["name"],
            "deployment": deployment.body["name"],
            "state": "DEPLOYING",
            "createTime": _now(),
        }
        self.deployed_models[deployed_id] = _Resource(resource, private={"replace": replace, "version": None})
        return dict(resource)

    def _deploy(self, deployed_id: str) -> None:
        """DEPLOYING -> DEPLOYED: publish the LoRA's weights into the served versions."""
        resource = self.deployed_models[deployed_id]
        model = self.models[self.short(resource.body["model"])]
        info = self.versions.publish(model.private["weights"], self.short(resource.body["model"]))
        resource.private["version"] = info.version
        resource.body["state"] = "DEPLOYED"
        if resource.private["replace"]:  # the merged addon is swapped: every other addon there goes away
            for other_id, other in list(self.deployed_models.items()):
                if other_id != deployed_id and other.body["deployment"] == resource.body["deployment"]:
                    del self.deployed_models[other_id]
            self.deployments[self.short(resource.body["deployment"])].private["merged_version"] = info.version

    # -- polling --------------------------------------------------------------------------------------------------

    def _advance(self, collection: str, resource_id: str) -> dict[str, Any]:
        """One poll of a resource: count it and move its state on once enough polls were seen."""
        resource = self._store(collection)[resource_id]
        resource.polls += 1
        body, ready = resource.body, resource.polls >= self.polls
        created = collection == "deployments" and body["state"] == "CREATING"
        uploaded = collection == "datasets" and body["state"] == "UPLOADING" and resource.private["rows"]
        if (created or uploaded) and ready:
            body["state"] = "READY"
        elif collection == "supervisedFineTuningJobs":
            self._advance_job(resource_id, resource)
        elif collection == "models" and body["state"] == "UPLOADING" and ready:
            body["state"] = "READY"
        elif collection == "deployedModels" and body["state"] == "DEPLOYING" and ready:
            self._deploy(resource_id)
        return dict(resource.body)

    def _advance_job(self, job_id: str, resource: _Resource) -> None:
        state = resource.body["state"]
        if state == "JOB_STATE_CREATING" and resource.polls >= self.polls:
            resource.body["state"] = "JOB_STATE_RUNNING"
            resource.polls = 0
            thread = threading.Thread(target=self._run_job, args=(job_id,), name=f"fw-double-{job_id}", daemon=True)
            resource.private["thread"] = thread
            thread.start()
        elif state == "JOB_STATE_RUNNING" and resource.polls >= self.polls:
            thread = resource.private["thread"]
            if thread is not None and not thread.is_alive():
                self._complete_job(job_id)

    def _delete(self, collection: str, resource_id: str) -> dict[str, Any]:
        del self._store(collection)[resource_id]
        return {}

    # -- completions ----------------------------------------------------------------------------------------------

    def _route_model(self, model: str) -> tuple[int, _Resource]:
        """The served version a ``<model>#<deployment>`` name reaches (raises ApiError for 4xx)."""
        target, sep, deployment_name = model.partition("#")
        if not sep:
            raise ApiError(404, f"model {model} is not deployed serverless in this double; name a deployment")
        deployment = self.deployments.get(self.short(deployment_name))
        if deployment is None or deployment.body["state"] != "READY":
            raise ApiError(404, f"deployment {deployment_name} not found or not ready")
        if target == deployment.body["baseModel"]:
            merged = deployment.private["merged_version"]
            return (0 if merged is None else merged), deployment
        for entry in self.deployed_models.values():
            if entry.body["model"] == target and entry.body["deployment"] == deployment.body["name"]:
                if entry.body["state"] != "DEPLOYED":
                    break
                return entry.private["version"], deployment
        raise ApiError(404, f"model {target} is not deployed on {deployment_name}")

    async def _completions(self, request: Request) -> Response:
        body = await _json(request)
        with self.lock:
            self.completion_bodies.append(body)
            try:
                version, deployment = self._route_model(str(body.get("model", "")))
            except ApiError as exc:
                return inference_error(exc.status, "NOT_FOUND", exc.message)
            if deployment.body["replicaCount"] == 0:
                if deployment.private["scale_up_left"] > 0:
                    deployment.private["scale_up_left"] -= 1
                    self.scale_up_answers += 1
                    return inference_error(503, "DEPLOYMENT_SCALING_UP", SCALING_UP_MESSAGE)
                deployment.body["replicaCount"] = 1  # the replica is up
        try:
            prompt, params = self._sampling_request(body)
        except ApiError as exc:
            return inference_error(exc.status, "INVALID_ARGUMENT", exc.message)
        model = str(body["model"])
        if body.get("echo"):
            return await self._echo(model, prompt, params, version)
        if body.get("stream"):
            events = self.sampler.stream(prompt, params, version)
            return StreamingResponse(self._sse(model, prompt, events), media_type="text/event-stream")
        try:
            result = await self.sampler.sample(prompt, params, version)
        except BackendError as exc:
            return inference_error(exc.status_code or 500, "INVALID_ARGUMENT", str(exc))
        return JSONResponse(self._response(model, prompt, result, raw_output=bool(body.get("raw_output"))))

    def _sampling_request(self, body: dict[str, Any]) -> tuple[list[int], SamplingParams]:
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt = self.tokenizer.encode(prompt)
        if not isinstance(prompt, list) or not prompt or not all(isinstance(t, int) for t in prompt):
            raise ApiError(400, "prompt must be a string or a non-empty list of token ids")
        stop = body.get("stop") or ()
        stop = (stop,) if isinstance(stop, str) else tuple(stop)
        max_tokens = int(body.get("max_tokens") or 16)
        context = self.tokenizer.context_length
        if len(prompt) + max_tokens > context:
            if body.get("context_length_exceeded_behavior") == "error":
                raise ApiError(400, f"prompt ({len(prompt)}) + max_tokens ({max_tokens}) exceeds {context} tokens")
            max_tokens = max(1, context - len(prompt))
        try:
            params = SamplingParams(
                max_tokens=max_tokens,
                temperature=float(body["temperature"]) if body.get("temperature") is not None else 1.0,
                top_p=float(body.get("top_p") or 1.0),
                top_k=int(body.get("top_k") or -1),
                stop=stop,
                seed=body.get("seed"),
            )
        except ValueError as exc:
            raise ApiError(400, str(exc)) from None
        return prompt, params

    def _entries(self, tokens: list[int], logprobs: list[float], sampling: list[float]) -> list[dict[str, Any]]:
        entries, offset = [], 0
        for i, (token, logprob) in enumerate(zip(tokens, logprobs, strict=True)):
            text = self.tokenizer.decode([token])
            entry = {
                "token": text,
                "bytes": list(text.encode()),
                "logprob": logprob,
                "text_offset": offset,
                "token_id": token,
            }
            if i < len(sampling):
                entry["sampling_logprob"] = sampling[i]
            entries.append(entry)
            offset += len(text)
        return entries

    def _response(self, model: str, prompt: list[int], result: SampleResult, *, raw_output: bool) -> dict[str, Any]:
        entries = self._entries(result.tokens, result.logprobs, result.sampling_logprobs)
        choice: dict[str, Any] = {
            "index": 0,
            "text": result.text,
            "finish_reason": result.finish_reason,
            "logprobs": {"content": entries},
            "token_ids": result.tokens,
            "prompt_token_ids": prompt,
        }
        if raw_output:
            choice["raw_output"] = {
                "prompt_fragments": [],
                "prompt_token_ids": prompt,
                "completion": result.text,
                "completion_token_ids": result.tokens,
                "completion_logprobs": {"content": entries},
            }
        return {
            "id": f"cmpl-{uuid.uuid4().hex[:12]}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": model,
            "choices": [choice],
            "usage": {
                "prompt_tokens": len(prompt),
                "completion_tokens": len(result.tokens),
                "total_tokens": len(prompt) + len(result.tokens),
            },
        }

    async def _sse(self, model: str, prompt: list[int], events: AsyncIterator[Any]) -> AsyncIterator[bytes]:
        created, ident, first, offset = int(time.time()), f"cmpl-{uuid.uuid4().hex[:12]}", True, 0
        try:
            async for event in events:
                choice: dict[str, Any]
                if isinstance(event, TokenChunk):
                    entry = self._entries([event.token_id], [event.logprob], [])[0]
                    entry["text_offset"] = offset
                    offset += len(event.text)
                    choice = {
                        "index": 0,
                        "text": event.text,
                        "finish_reason": None,
                        "token_ids": [event.token_id],
                        "logprobs": {"content": [entry]},
                    }
                    if first:
                        choice["prompt_token_ids"] = prompt
                        first = False
                    chunk = {"id": ident, "object": "text_completion", "created": created, "model": model}
                    yield _sse_line({**chunk, "choices": [choice]})
                elif isinstance(event, SampleResult):
                    usage = {
                        "prompt_tokens": len(prompt),
                        "completion_tokens": len(event.tokens),
                        "total_tokens": len(prompt) + len(event.tokens),
                    }
                    choice = {"index": 0, "text": "", "finish_reason": event.finish_reason}
                    chunk = {"id": ident, "object": "text_completion", "created": created, "model": model}
                    yield _sse_line({**chunk, "choices": [choice], "usage": usage})
        except BackendError as exc:
            yield _sse_line({"error": {"code": "INTERNAL", "message": str(exc)}})
        finally:
            closer = getattr(events, "aclose", None)
            if closer is not None:
                await closer()
        yield b"data: [DONE]\n\n"

    async def _echo(self, model: str, prompt: list[int], params: SamplingParams, version: int) -> Response:
        scored = await self.sampler.compute_logprobs(prompt, version=version)
        result = await self.sampler.sample(
            prompt, SamplingParams(max_tokens=params.max_tokens, temperature=0.0), version
        )
        logprobs = [0.0 if v is None else float(v) for v in scored] + list(result.logprobs)
        tokens = prompt + result.tokens
        response = self._response(model, prompt, result, raw_output=False)
        response["choices"][0]["logprobs"] = {"content": self._entries(tokens, logprobs, [])}
        response["choices"][0]["token_ids"] = tokens
        return JSONResponse(response)

    # -- helpers for tests ----------------------------------------------------------------------------------------

    def served_version_of(self, model_name: str) -> int:
        """The double's internal served-weights version a request name reaches (0 = base weights)."""
        with self.lock:
            return self._route_model(model_name)[0]

    def count_calls(self, method: str, fragment: str) -> int:
        with self.lock:
            return sum(1 for m, path in self.calls if m == method and fragment in path)


async def _json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError:
        raise ApiError(400, "request body is not JSON") from None
    if not isinstance(value, dict):
        raise ApiError(400, "request body must be a JSON object")
    return value


def _multipart_file(content_type: str, body: bytes) -> bytes:
    """The first file part of a multipart/form-data body (stdlib parser: the double needs no python-multipart)."""
    if not content_type.startswith("multipart/form-data"):
        raise ApiError(400, f"expected multipart/form-data, got {content_type or 'no content type'}")
    message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        f"Content-Type: {content_type}\r\n\r\n".encode() + body
    )
    for part in message.iter_parts():
        if part.get_filename():
            payload = part.get_payload(decode=True)
            return payload if isinstance(payload, bytes) else b""
    raise ApiError(400, "the upload has no file part")


def _jsonl_rows(data: bytes) -> list[dict[str, Any]]:
    rows = []
    for number, line in enumerate(data.decode().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise ApiError(400, f"line {number} is not JSON") from None
        if not isinstance(row, dict):
            raise ApiError(400, f"line {number} is not a JSON object")
        rows.append(row)
    return rows


def _sse_line(value: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(value)}\n\n".encode()


def double_settings(double: FireworksDouble, tokenizer_dir: Path, tmp_path: Path, **fireworks: Any) -> Any:
    """Settings for a batch-mode Fireworks backend talking to ``double`` (fast polls, tiny LoRA rank); keyword
    arguments override ``fireworks.*`` fields."""
    from openclaw_cli.settings import FireworksSettings, LocalSettings, LoraSettings, Settings

    options: dict[str, Any] = {
        "mode": "batch",
        "api_key": double.api_key,
        "account_id": double.account_id,
        "base_url": double.base_url,
        "base_model": double.base_model,
        "tokenizer": str(tokenizer_dir),
        "poll_interval_s": 0.01,
        "batch_samples": 3,
        "scale_up_timeout_s": 5.0,
        "state_dir": tmp_path / "fireworks",
        **fireworks,
    }
    return Settings(
        backend="fireworks",
        lora=LoraSettings(rank=8, alpha=8),
        local=LocalSettings(state_dir=tmp_path / "ckpt"),
        fireworks=FireworksSettings(**options),
    )


__all__ = ["ACCOUNT", "API_KEY", "BASE_MODEL", "FireworksDouble", "double_settings"]
