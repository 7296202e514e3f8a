"""Llama- and Qwen2-shaped models built by the engine itself from a folder of safetensors, without transformers'
model classes: what a start on the CPU loads where it can (loading.py), for a start that is ready sooner.

Importing transformers' modeling stack costs a start more than its weights do on a small CPU: `modeling_utils` and
the model classes pull `torch.distributed.tensor` (through `core_model_loading`) and `torch._dynamo` (through
`masking_utils`) in, and the auto classes scan every model folder transformers ships; on the 2-core bench machine
that is 1.6 s of the test model's 4.0 s start (bench/README.md § The start). The engine already runs these layers'
arithmetic itself in its decode pass (forward_pass.py); here the same modules are built and given a forward through
that pass, so nothing of transformers' modeling is imported. Only its configuration base class and cache (cheap,
and what the engine's batch caches are made of) stay.

The same scores bit for bit: the modules hold the same weights under the same names, and the pass mirrors the
model classes' forward, which the load-time checks (internals.py) and tests/test_own_model.py hold against
transformers' own classes. Anything else (another architecture, rope scaling, sliding windows, biases in the MLP,
a GPU, a hub id) loads through transformers as before (`buildable` says why not, in the debug log).
"""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any, Iterator, NamedTuple

import torch
from torch import nn

from agent.llm.engine import internals

log = logging.getLogger(__name__)

# config.json's architecture → whether its query, key and value products carry biases (Qwen2's do, Llama's follow
# `attention_bias`); both keep the output product's.
ARCHITECTURES = {"LlamaForCausalLM": None, "Qwen2ForCausalLM": True}
WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


def buildable(folder: Path) -> str | None:
    """Why the model in `folder` cannot be built here (it loads through transformers then), or None."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as error:
        return f"config.json: {error}"
    architecture = (config.get("architectures") or [""])[0]
    files = _weight_files(folder)
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {"rope_type": "default"}
    reasons = {
        f"architecture {architecture or '(none)'}": architecture not in ARCHITECTURES,
        "rope scaling": rope.get("rope_type", rope.get("type")) != "default",
        "sliding windows": bool(config.get("use_sliding_window"))
        or "sliding_attention" in (config.get("layer_types") or []),
        f"activation {config.get('hidden_act')}": config.get("hidden_act", "silu") != "silu",
        "MLP biases": bool(config.get("mlp_bias")),
        "not every safetensors file": not files or not all((folder / name).is_file() for name in files),
    }
    return next((reason for reason, holds in reasons.items() if holds), None)


def build(folder: Path, dtype: torch.dtype) -> CausalLM:
    """The model in `folder` (`buildable` held), its weights in `dtype`, on the CPU, in eval mode.

    The weights stay on the file's mapping where they are already in `dtype` (as transformers' loading leaves them:
    load_leftovers.py hands back the pages nothing reads again)."""
    config = model_config(folder)
    with torch.device("meta"), _unfilled(nn.Linear, nn.Embedding):  # no memory for weights the file's replace
        model = CausalLM(config)
    model.model.rotary_emb = RotaryEmbedding(config)  # computed, not loaded: on the CPU
    weights = _read_weights(folder, dtype)
    if config.tie_word_embeddings:  # the file holds the embedding once
        weights["lm_head.weight"] = weights["model.embed_tokens.weight"]
    model.load_state_dict(weights, strict=True, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.model.embed_tokens.weight
    model.generation_config = generation_config(folder, config)
    return model.eval()


@contextlib.contextmanager
def _unfilled(*classes: type[nn.Module]) -> Iterator[None]:
    """Layers of `classes` made without filling their weights with random numbers: on the meta device, filling
    goes through torch's Python decompositions, which import its compiler (a second of the start), only for
    loading to replace them. (Only the model thread makes modules meanwhile.)"""
    kept = {cls: cls.reset_parameters for cls in classes}  # type: ignore[attr-defined]
    for cls in classes:
        cls.reset_parameters = lambda self: None  # type: ignore[attr-defined]
    try:
        yield
    finally:
        for cls, method in kept.items():
            cls.reset_parameters = method  # type: ignore[attr-defined]


def model_config(folder: Path) -> Any:
    """config.json as transformers' configuration base class (what its caches and the engine read), with the
    defaults the model classes would fill in; attention through sdpa until the engine picks its own."""
    from transformers.configuration_utils import PreTrainedConfig

    values = json.loads((folder / "config.json").read_text())
    values.setdefault("head_dim", values["hidden_size"] // values["num_attention_heads"])
    values.setdefault("num_key_value_heads", values["num_attention_heads"])
    values.setdefault("layer_types", ["full_attention"] * values["num_hidden_layers"])
    values.setdefault("rope_parameters", {"rope_type": "default", "rope_theta": values.get("rope_theta", 10000.0)})
    values.setdefault("rms_norm_eps", 1e-6)
    values.setdefault("tie_word_embeddings", False)
    config = PreTrainedConfig(**values)
    internals.configure_attention(config, "sdpa")
    return config


class GenerationDefaults(NamedTuple):
    """generation_config.json's end tokens: all the engine reads of a model's generation config (batch.py)."""

    eos_token_id: int | list[int] | None


def generation_config(folder: Path, config: Any) -> GenerationDefaults:
    try:
        values = json.loads((folder / "generation_config.json").read_text())
    except (OSError, ValueError):
        values = {}
    return GenerationDefaults(values.get("eos_token_id", getattr(config, "eos_token_id", None)))


def _weight_files(folder: Path) -> list[str]:
    """The safetensors files holding the model's weights: one, or those its index names (none if neither)."""
    index = folder / WEIGHTS_INDEX
    if index.is_file():
        try:
            return sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError):
            return []
    return [WEIGHTS] if (folder / WEIGHTS).is_file() else []


def _read_weights(folder: Path, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    weights = {}
    for name in _weight_files(folder):
        with safe_open(folder / name, framework="pt") as file:
            for key in file.keys():
                weights[key] = file.get_tensor(key).to(dtype)
    return weights


class RmsNorm(nn.Module):
    """transformers' Llama/Qwen2 RMS norm: in float32, the scale applied after casting back."""

    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        input_dtype = hidden.dtype
        hidden = hidden.to(torch.float32)
        variance = hidden.pow(2).mean(-1, keepdim=True)
        hidden = hidden * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden.to(input_dtype)


class RotaryEmbedding(nn.Module):
    """The default rotary embedding's cos and sin for given positions, computed as transformers computes them."""

    def __init__(self, config: Any):
        super().__init__()
        base, dim = config.rope_parameters["rope_theta"], config.head_dim
        self.inv_freq = nn.Buffer(1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), persistent=False)

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = position_ids[..., None].float() * self.inv_freq.to(device=x.device, dtype=torch.float)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(dtype=x.dtype), emb.sin().to(dtype=x.dtype)  # (transformers scales both by 1.0 here)


class Attention(nn.Module):
    """The attention block's products and sizes; its arithmetic is the pass's (forward_pass.py)."""

    def __init__(self, config: Any, layer_idx: int, qkv_bias: bool):
        super().__init__()
        self.config, self.layer_idx, self.is_causal = config, layer_idx, True
        self.head_dim = config.head_dim
        self.num_key_value_groups = config.num_attention_heads // config.num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        heads, kv_heads, hidden = config.num_attention_heads, config.num_key_value_heads, config.hidden_size
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=bool(getattr(config, "attention_bias", False)))


class Mlp(nn.Module):
    def __init__(self, config: Any):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.act_fn = nn.SiLU()


class DecoderLayer(nn.Module):
    def __init__(self, config: Any, layer_idx: int, qkv_bias: bool):
        super().__init__()
        self.self_attn = Attention(config, layer_idx, qkv_bias)
        self.mlp = Mlp(config)
        self.input_layernorm = RmsNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RmsNorm(config.hidden_size, config.rms_norm_eps)


class Decoder(nn.Module):
    def __init__(self, config: Any, qkv_bias: bool):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, index, qkv_bias) for index in range(config.num_hidden_layers))
        self.norm = RmsNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary_emb: nn.Module | None = None  # set by `build`, on the CPU


class Output(NamedTuple):
    """What the engine reads of a forward's result: the scores."""

    logits: torch.Tensor


class CausalLM(nn.Module):
    """A causal language model of `Decoder` layers, with transformers' names for everything the engine touches."""

    def __init__(self, config: Any):
        super().__init__()
        self.config = config
        architecture = config.architectures[0]
        qkv_bias = ARCHITECTURES[architecture] or bool(getattr(config, "attention_bias", False))
        self.model = Decoder(config, qkv_bias)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.generation_config: GenerationDefaults | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, cache: Any = None, use_cache: bool = True,
                logits_to_keep: int = 0, **attention: Any) -> Output:
        """transformers' causal-LM forward as the engine calls it: scores of the last `logits_to_keep` columns
        (all with 0), the pass's keys and values appended to `cache`; `attention`: the decode attention's keywords."""
        from agent.llm.engine import forward_pass

        if cache is None:
            from transformers import DynamicCache

            cache = DynamicCache(config=self.config)
        rows, width = input_ids.shape
        past = cache.get_seq_length()
        if attention_mask is None:
            attention_mask = torch.ones(rows, past + width, dtype=torch.long, device=input_ids.device)
        if position_ids is None:
            position_ids = torch.arange(past, past + width, device=input_ids.device).unsqueeze(0)
        scores = forward_pass.model_pass(self, input_ids, causal_mask(attention_mask, width), position_ids, cache,
                                         logits_to_keep, **attention)
        return Output(scores)


def causal_mask(mask: torch.Tensor, width: int) -> torch.Tensor | None:
    """The attention's mask for a pass of `width` tokens over `mask`'s columns, as transformers' sdpa mask gives it:
    None (the attention's own causal order) where no column is hidden and the pass is one token or the whole row
    (a prompt from its start); else [rows, 1, width, columns], True where a query may attend."""
    from agent.llm.engine.forward_pass import visible_columns

    if (width == 1 or width == mask.shape[1]) and bool(mask.all()):
        return None
    return visible_columns(mask, width)


def is_own(model: Any) -> bool:
    return isinstance(model, CausalLM)
