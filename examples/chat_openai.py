"""A multi-turn chat with the openclaw proxy through the ``openai`` SDK.

Every request carries the same ``X-Session-Id``, so the proxy files the turns as one session: each assistant turn
gets the user's next message as its next state, which is what the judge scores and the trainer learns from.

    openclaw serve &                                  # or: openclaw launch (serve + judge + train)
    python examples/chat_openai.py                    # interactive: type messages, an empty line ends
    python examples/chat_openai.py -m "Hi" -m "Shorter please."   # scripted turns
    echo "Hello" | python examples/chat_openai.py     # one turn per line of stdin

``--base-url`` takes the proxy's root (``http://127.0.0.1:8400``) or its ``/v1`` URL. The key is ``--api-key``,
else ``$OPENCLAW_API_KEY``, else a placeholder (a loopback proxy without a key accepts anything). Exit status:
0 when every turn got a reply, 1 when the proxy answered with an error or could not be reached.
"""

from __future__ import annotations

import argparse
import os
import sys
import uuid
from collections.abc import Iterator

import httpx
import openai

DEFAULT_BASE_URL = "http://127.0.0.1:8400"
NO_KEY_PLACEHOLDER = "openclaw-no-key"


def openai_base_url(base_url: str) -> str:
    """The SDK wants the ``/v1`` URL; accept the root too."""
    url = base_url.rstrip("/")
    return url if url.endswith("/v1") else f"{url}/v1"


def user_messages(scripted: list[str]) -> Iterator[str]:
    if scripted:
        yield from scripted
        return
    interactive = sys.stdin.isatty()
    while True:
        if interactive:
            print("you> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line or (interactive and not line.strip()):
            return  # end of input, or an empty line at the prompt
        if line.strip():
            yield line.strip()


def chat(client: openai.OpenAI, args: argparse.Namespace) -> int:
    messages: list[dict[str, str]] = []
    if args.system:
        messages.append({"role": "system", "content": args.system})
    headers = {"X-Session-Id": args.session_id}
    turns = 0
    for text in user_messages(args.message):
        messages.append({"role": "user", "content": text})
        if args.stream:
            reply = _streamed_reply(client, args, messages, headers)
        else:
            completion = client.chat.completions.create(
                model=args.model, messages=messages, max_tokens=args.max_tokens, extra_headers=headers
            )
            reply = completion.choices[0].message.content or ""
            print(f"assistant> {reply}", flush=True)
        messages.append({"role": "assistant", "content": reply})
        turns += 1
    if args.end_session and turns:
        # Tells the proxy the conversation is over, so its last turn is judged now instead of after the idle timeout.
        url = f"{openai_base_url(args.base_url)}/openclaw/sessions/{args.session_id}/end"
        httpx.post(url, headers={"Authorization": f"Bearer {args.api_key}"}, timeout=10).raise_for_status()
    print(f"[{turns} turn(s) in session {args.session_id}]", file=sys.stderr)
    return 0


def _streamed_reply(
    client: openai.OpenAI, args: argparse.Namespace, messages: list[dict[str, str]], headers: dict[str, str]
) -> str:
    parts: list[str] = []
    print("assistant> ", end="", flush=True)
    stream = client.chat.completions.create(
        model=args.model, messages=messages, max_tokens=args.max_tokens, extra_headers=headers, stream=True
    )
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
            print(chunk.choices[0].delta.content, end="", flush=True)
    print(flush=True)
    return "".join(parts)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default=DEFAULT_BASE_URL, help="The proxy (root or /v1 URL).")
    parser.add_argument("--api-key", default=None, help="Proxy key (default: $OPENCLAW_API_KEY or a placeholder).")
    parser.add_argument("--model", default="openclaw", help="Any name the proxy serves (default: openclaw).")
    parser.add_argument("--session-id", default=None, help="Session id sent as X-Session-Id (default: random).")
    parser.add_argument("--system", default=None, help="Optional system prompt.")
    parser.add_argument("-m", "--message", action="append", default=[], help="A user turn (repeatable).")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--stream", action="store_true", help="Print replies token by token.")
    parser.add_argument("--end-session", action="store_true", help="End the session at the proxy when done.")
    args = parser.parse_args(argv)
    args.session_id = args.session_id or f"chat-{uuid.uuid4().hex[:12]}"
    args.api_key = args.api_key or os.environ.get("OPENCLAW_API_KEY") or NO_KEY_PLACEHOLDER
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    client = openai.OpenAI(base_url=openai_base_url(args.base_url), api_key=args.api_key, max_retries=1)
    try:
        return chat(client, args)
    except (openai.APIError, httpx.HTTPError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
