"""Build a tiny causal LM and a byte-level BPE tokenizer entirely offline, in a second or two.

The model is a 2-layer Qwen3 with random (seeded) weights; the tokenizer is trained in memory with ``tokenizers``
and carries a Qwen-style chat template with tool support (``<tool_call>`` JSON blocks), so every code path that a
real model exercises — chat rendering, tool-call parsing, LoRA on q/k/v/o/gate/up/down — runs here in
milliseconds. Nothing is downloaded.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>", "</think>"]

# Our own Qwen-style template: system (+ tool list), user/assistant/tool turns, assistant tool calls as JSON.
CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n"
    "{% if messages and messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\nYou may call one or more functions. Signatures:\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n"
    'Reply with <tool_call>{"name": <name>, "arguments": <args>}</tool_call> to call one.<|im_end|>\n'
    "{% elif messages and messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if message.role == 'system' and loop.first %}"
    "{% elif message.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response>"
    "<|im_end|>\n"
    "{% elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.reasoning_content %}<think>\n{{ message.reasoning_content }}\n</think>\n\n{% endif %}"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% if message.tool_calls %}{% for call in message.tool_calls %}"
    "{% if (loop.first and message.content) or not loop.first %}\n{% endif %}"
    '<tool_call>\n{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments }}}\n</tool_call>'
    "{% endfor %}{% endif %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_CORPUS = [
    "Hello! How can I help you today?",
    "The capital of France is Paris. The capital of Japan is Tokyo.",
    "Please answer briefly and politely. Thank you very much!",
    "def add(a, b):\n    return a + b\n",
    '{"name": "calculator", "arguments": {"expression": "2 + 3 * 4"}}',
    "No, I meant something else. Try again, and be more concise.",
    "The quick brown fox jumps over the lazy dog 0123456789.",
    "user assistant system tool function arguments result error",
    "I am a helpful assistant. Sure, here is the answer: 42.",
]


def build_tiny_tokenizer(vocab_size: int = 512):
    """A byte-level BPE PreTrainedTokenizerFast with the chat template and special tokens set."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(_CORPUS * 20, trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_tiny_model(vocab_size: int, seed: int = 0, *, layers: int = 2, hidden: int = 64, context: int = 4096):
    """A randomly initialised (seeded) Qwen3 causal LM, float32: 4 heads of ``hidden // 4`` (vLLM's CPU attention
    needs a head_dim of 32 or more: ``hidden=128``), ``context`` positions."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=hidden // 4,
        max_position_embeddings=context,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(config)
    model.eval()
    return model


def save_tiny_model(directory: Path, seed: int = 0, *, hidden: int = 64, context: int = 4096) -> Path:
    """Write tokenizer + model to ``directory`` (an HF-style local path any backend can load) and return it."""
    directory.mkdir(parents=True, exist_ok=True)
    tok = build_tiny_tokenizer()
    model = build_tiny_model(len(tok), seed=seed, hidden=hidden, context=context)
    eos = tok.convert_tokens_to_ids("<|im_end|>")
    model.config.eos_token_id = eos
    model.config.pad_token_id = tok.pad_token_id
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = tok.pad_token_id
    tok.save_pretrained(directory)
    model.save_pretrained(directory)
    return directory
