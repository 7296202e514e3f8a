"""What the local engine holds in memory, predicted from the model's config and the settings (before loading it), and
the prefix store's default size.

    part           bound
    weights        linear layers by MODEL_DTYPE (fp32 4 bytes a weight, bf16 2, int8 1, int4 0.625), the embedding
                   and norms in the model's dtype; bf16 on a CPU also packs a copy of a tied output layer. The
                   embedding is an upper bound: after loading it is read through the file's mapping, a page at a
                   time (load_leftovers.py)
    prefix store   PREFIX_CACHE_MB, or by default the KV of PREFIX_CACHE_TOKENS tokens of this model
    batch KV       the rows of a batch and the rows paused beside it: BATCH_SIZE rows of up to `context_tokens`
                   (prompt and reply), twice while a batch is assembled (the reused prefixes are copied in)
    runtime        Python, torch, transformers, the tokenizer and grammar engine: a constant, measured
                   (bench/README.md § Memory)

Loading holds more for a moment: the float weights of one layer twice while it is quantized, and a GGUF's first
conversion holds the de-quantized model once more while it is saved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# KV tokens the prefix store keeps by default. llama.cpp's llama-server, told -c 16384 for 8 slots in the
# side-by-side, holds running and cached prompts in the same 16,384; the store holds only finished calls' KV (the
# running rows hold theirs beside it), and what conversations share once (prefix_store.py): with half of it the
# bench's chats computed the same 14-17% of their prompt tokens as with all of it (bench/README.md).
PREFIX_CACHE_TOKENS = 8192
# Python with torch, transformers, tokenizers and llguidance imported, the tokenizer and grammar engine built: the
# resident memory of a started engine on the test model less its weights and caches (bench/README.md § Memory).
RUNTIME_BYTES = 420 << 20
# The context a row is assumed to reach in the estimate: a ReAct turn's prompt (system prompt, tools, history)
# and its reply.
CONTEXT_TOKENS = 2048
BYTES_PER_WEIGHT = {"float32": 4.0, "bfloat16": 2.0, "float16": 2.0, "int8": 1.0, "int4": 0.625}


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes the engine is expected to hold, by part."""

    weights: int
    prefix_store: int
    batch_kv: int
    runtime: int = RUNTIME_BYTES

    @property
    def total(self) -> int:
        """The expected peak of a running engine."""
        return self.weights + self.prefix_store + self.batch_kv + self.runtime

    def line(self) -> str:
        """The plan in one line, in MiB."""
        parts = (("weights", self.weights), ("prefix store", self.prefix_store), ("batch KV", self.batch_kv),
                 ("runtime", self.runtime))
        return f"~{self.total >> 20} MiB expected peak: " + ", ".join(f"{name} {size >> 20}" for name, size in parts)


def kv_bytes_per_token(config: Any, element_bytes: int) -> int:
    """Keys and values of one token in every layer."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * element_bytes


def weight_counts(config: Any) -> tuple[int, int, int]:
    """Weights of the decoder layers' linear layers, of the embedding, and of an untied output layer (0 if tied),
    for a Llama/Qwen2-shaped config."""
    hidden, inner = config.hidden_size, config.intermediate_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    per_layer = hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * inner
    embedding = config.vocab_size * hidden
    return per_layer * config.num_hidden_layers, embedding, 0 if config.tie_word_embeddings else embedding


def weight_bytes(config: Any, mode: str, float_bytes: int) -> int:
    """The weights as held in `mode` (a MODEL_DTYPE, auto already resolved), the embedding in `float_bytes` a
    weight; the output layer as `quantize_*` or `pack_linears` leaves it."""
    linear, embedding, untied = weight_counts(config)
    if mode in ("int8", "int4"):
        return int(linear * BYTES_PER_WEIGHT[mode]) + embedding * float_bytes + embedding  # output layer int8
    held = int(linear * BYTES_PER_WEIGHT[mode]) + embedding * float_bytes + untied * float_bytes
    if mode == "bfloat16" and not untied:
        held += embedding * 2  # the tied output layer packed as a copy of its own (linear_bf16.py)
    return held


def prefix_store_bytes(config: Any, element_bytes: int, tokens: int = PREFIX_CACHE_TOKENS) -> int:
    """The prefix store's default budget: the KV of `tokens` tokens of this model."""
    return tokens * kv_bytes_per_token(config, element_bytes)


def loaded_kv_element_bytes(model: Any) -> int:
    """Bytes of one key or value number in the batch caches of a loaded `model` (its dtype, or the caches' own)."""
    from agent.llm.engine.kv_cache import KV_DTYPE

    return (getattr(model, KV_DTYPE, None) or model.dtype).itemsize


def plan(config: Any, mode: str, *, float_bytes: int, batch_size: int, prefix_cache_mb: int | None,
         context_tokens: int = CONTEXT_TOKENS) -> MemoryPlan:
    """The expected memory of the engine running `config` in `mode` (auto resolved; the rest of the model and its
    KV in `float_bytes` a number), `batch_size` rows of `context_tokens`, with PREFIX_CACHE_MB (None: the
    default, sized from the model)."""
    store = prefix_store_bytes(config, float_bytes) if prefix_cache_mb is None else prefix_cache_mb << 20
    batch = 2 * batch_size * context_tokens * kv_bytes_per_token(config, float_bytes)
    return MemoryPlan(weight_bytes(config, mode, float_bytes), store, batch)


def default_prefix_store_bytes(model: Any) -> int:
    """The prefix store's budget for a loaded `model` when PREFIX_CACHE_MB is not set: the KV of
    `PREFIX_CACHE_TOKENS` tokens, in the dtype its batch caches hold."""
    return prefix_store_bytes(model.config, loaded_kv_element_bytes(model))
