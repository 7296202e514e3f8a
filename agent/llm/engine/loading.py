"""Loading the model, on the model thread: where MODEL points, which dtype, the converted copy of a GGUF file, and
the engine's own layers (weights.py); `load_model` is what `ModelThread` runs first.

`MODEL` is a Hugging Face hub id (`Qwen/Qwen2.5-1.5B-Instruct`), a local folder holding one, or a `.gguf` file
(transformers de-quantizes it with the `gguf` package); a hub id goes through hub.py.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from agent.errors import ModelLoadError
from agent.llm.base import MODEL_DTYPES
from agent.llm.engine import own_model
from agent.llm.engine.check_record import CheckRecord
from agent.llm.engine.load_leftovers import LoadLeftovers, heap_for_activations
from agent.llm.engine.grammar_masks import GrammarEngine
from agent.llm.engine.model_thread import LoadedModel
from agent.llm.engine.saved_int8 import KEPT, saved_levels
from agent.llm.engine.weights import speed_up

log = logging.getLogger(__name__)

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


@dataclass(frozen=True)
class ModelSource:
    """Where `MODEL` points: what to hand `from_pretrained`, and the GGUF file inside it if any."""

    setting: str  # MODEL exactly as configured, for error messages
    location: str  # a hub id or a folder
    gguf_file: str | None = None
    hub: bool = False  # `location` is a hub id


def resolve_model(setting: str, base_dir: Path | None = None) -> ModelSource:
    """Tell a `.gguf` file, a local folder and a hub id apart; a missing local path is a `ModelLoadError`.

    A relative path is looked for inside `base_dir` (the data directory), not in the current folder.
    """
    path = (base_dir or Path()) / Path(setting).expanduser()
    where = f" ({path})" if path.is_absolute() and str(path) != setting else ""
    if setting.endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(f"MODEL {setting}: no such file{where}")
        return ModelSource(setting, str(path.parent), path.name)
    if path.is_dir():
        return ModelSource(setting, str(path))
    if _HUB_ID.match(setting) and not setting.startswith("."):
        return ModelSource(setting, setting, hub=True)
    raise ModelLoadError(f"MODEL {setting}: no such file or folder{where} "
                         "(nor a hub id like Qwen/Qwen2.5-1.5B-Instruct)")


QUANTIZED = ("int8", "int4")  # MODEL_DTYPEs whose linear layers are quantized after loading (CPUs only)


def choose_dtype(setting: str, on_gpu: bool) -> Any:
    """The torch dtype to load the model in for MODEL_DTYPE; `auto`, int8 and int4 load in bf16 where the hardware
    computes it natively, else fp32 (then `quantization` says whether the linear layers become int8 or int4).

    Native bf16: a CUDA GPU, or a CPU with avx512_bf16 or AMX (several times faster than fp32 there: bench/README.md).
    Without those instructions bf16 is emulated and slower than fp32. bf16 is not batch-invariant: rounding can
    flip a near-tied greedy choice when the batch shape changes; MODEL_DTYPE=float32 buys exact, batch-independent
    outputs (on a CPU) at that speed cost.
    """
    import torch

    check_dtype_setting(setting)
    if setting == "auto" or setting in QUANTIZED:
        return torch.bfloat16 if on_gpu or cpu_has_native_bf16() else torch.float32
    return getattr(torch, setting)


# `auto` quantizes to int8 on a CPU from this many weights in the decoder's linear layers (Qwen2.5-0.5B has 0.36
# billion, 1.5B 1.3, SmolLM2-135M 0.11). A whole pass's products, oneDNN int8 against packed bf16 (bench/README.md §
# Linear layers): at the 0.5B shape 0.63-0.82x bf16's time at every width from 1 row to 512, at 1.5B less; at
# 135M 1.17x at 1 row and 1.28x at 8, where quantizing each input costs more than the weights' reads save.
INT8_FROM_WEIGHTS = 250_000_000


def quantization(setting: str, on_gpu: bool, linear_weights: int = 0) -> str | None:
    """"int8" or "int4" where MODEL_DTYPE `setting` quantizes the linear layers, else None.

    `auto` on a CPU is int8 for a model with `linear_weights` of INT8_FROM_WEIGHTS or more, where the int8 product
    keeps 8-bit activations (VNNI or AMX: internals.py). The evidence (bench/README.md § MODEL_DTYPE=auto): on the
    test model int8 scored 21/38 on the eval against float32's 19 and bf16's 20; each row's activations are scaled
    on their own (linear_int8.py), so a row's tokens do not depend on its batch neighbours. Where only 7 bits fit
    (AVX2) int8 kept too few of float32's tokens (12% on the test model) and auto stays bf16 or fp32.
    """
    if setting in QUANTIZED:
        return setting
    if setting != "auto" or on_gpu or linear_weights < INT8_FROM_WEIGHTS:
        return None
    from agent.llm.engine import internals

    return "int8" if internals.int8_activation_bits() == 8 and internals.int8_fails() is None else None


def decoder_linear_weights(config: Any) -> int:
    """The weights of a model's decoder linear layers, from its config (0 where the config lacks the usual sizes)."""
    from agent.llm.engine.memory import weight_counts

    try:
        return weight_counts(config)[0]
    except (AttributeError, TypeError):
        return 0


def resolved_mode(setting: str, on_gpu: bool, config: Any = None) -> tuple[str, int]:
    """What MODEL_DTYPE `setting` runs as here for a model of `config` (a dtype's name, or int8/int4), and the
    bytes of one number of the rest of the model and of its KV cache."""
    dtype = choose_dtype(setting, on_gpu)
    weights = decoder_linear_weights(config) if config is not None else 0
    return quantization(setting, on_gpu, weights) or str(dtype).removeprefix("torch."), dtype.itemsize


def cpu_has_native_bf16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU has bf16 arithmetic instructions (Linux's flags; elsewhere assume not)."""
    try:
        flags = cpuinfo.read_text(errors="replace")
    except OSError:
        return False
    return any(flag in flags.split() for flag in ("avx512_bf16", "amx_bf16"))


def check_dtype_setting(setting: str) -> None:
    """Refuse an unknown MODEL_DTYPE before anything slow happens."""
    if setting not in MODEL_DTYPES:
        raise ModelLoadError(f"MODEL_DTYPE must be one of {', '.join(MODEL_DTYPES)}, got {setting!r}")


def load_options(source: ModelSource, cache_dir: Path | None) -> dict[str, Any]:
    """The `from_pretrained` options for `source`: its GGUF file, or for a hub id the cache (see hub.py)."""
    if source.gguf_file:
        return {"gguf_file": source.gguf_file}
    if source.hub:
        from agent.llm.engine.hub import hub_load_options  # here: httpx and the hub client cost a start 0.15 s

        return hub_load_options(source.location, cache_dir)
    return {}


def load_model(source: ModelSource, device_map: str, dtype_setting: str,
               converted_dir: Path | None = None, cache_dir: Path | None = None,
               native_tools: bool = False, int8_kept: int = KEPT) -> LoadedModel:
    """Load tokenizer and model (on the model thread); every failure becomes one clear `ModelLoadError` line.

    A GGUF file is converted on its first load (tokenizer built, weights de-quantized: a minute on a small CPU)
    and, with `converted_dir`, saved there in transformers' own format, so later starts load in seconds. A hub
    id is looked for, and downloaded, in `cache_dir`. `native_tools`: the agent will offer tools through the chat
    template (AGENT_MODE=native), so the template must render them; that is checked before the weights load.
    int8 weights are saved in `converted_dir` too, for the `int8_kept` models last used (saved_int8.py).
    """
    import torch

    started = time.perf_counter()
    heap_for_activations()
    on_gpu = torch.cuda.is_available() and device_map not in ("", "cpu")
    if dtype_setting in QUANTIZED and on_gpu:
        raise ModelLoadError(f"MODEL_DTYPE={dtype_setting} is for CPUs (its kernels run there only): on a GPU use "
                             "auto (bf16), or MODEL_DEVICE_MAP=cpu")
    dtype = choose_dtype(dtype_setting, on_gpu)
    converted = converted_folder(source, dtype, converted_dir)
    try:
        if converted is not None and (converted / COMPLETE_MARK).is_file():
            tokenizer, model = _from_pretrained(ModelSource(source.setting, str(converted)), dtype, device_map,
                                                native_tools=native_tools, on_gpu=on_gpu)
        else:
            tokenizer, model = _from_pretrained(source, dtype, device_map, cache_dir, native_tools, on_gpu)
            if converted is not None:
                save_converted(model, tokenizer, converted)
    except ModelLoadError:
        raise
    except Exception as error:
        raise ModelLoadError(f"MODEL {source.setting}: cannot load it: {_first_line(error)}") from error
    model.eval()
    quantize = quantization(dtype_setting, on_gpu, decoder_linear_weights(model.config))
    leftovers = LoadLeftovers()  # the file's pages and heap blocks nothing reads again (load_leftovers.py)
    saved = saved_levels(converted_dir, int8_kept, model) if quantize == "int8" else None
    model = speed_up(model, on_gpu=on_gpu, quantize=quantize, between_layers=leftovers,
                     checks=CheckRecord(converted_dir) if converted_dir is not None else None, saved=saved)
    leftovers()
    now, peak = leftovers.resident()
    if peak:
        log.info("resident after loading: %d MiB (loading's peak %d MiB)", now >> 20, peak >> 20)
    grammars = GrammarEngine(tokenizer)
    # Logged once the model can answer (bench/bench_local.py times a second start of `qwenbot ask` to this line).
    mode = quantize or str(model.dtype).removeprefix("torch.")
    log.info("loaded %s (%s on %s) in %.1f s%s, %s", source.setting, mode, model.device,
             time.perf_counter() - started, f" from {converted}" if converted and converted.exists() else "",
             "built by the engine" if own_model.is_own(model) else "through transformers' model classes")
    return LoadedModel(model, tokenizer, grammars, mode)


def _from_pretrained(source: ModelSource, dtype: Any, device_map: str, cache_dir: Path | None = None,
                     native_tools: bool = False, on_gpu: bool = False) -> tuple[Any, Any]:
    """The tokenizer and model at `source`: a Llama or Qwen2 folder on the CPU built by the engine itself
    (own_model.py: a second of transformers' imports saved), anything else by transformers' auto classes."""
    own = _own_model_folder(source, on_gpu, cache_dir)
    tokenizer = _tokenizer(source, own is not None, cache_dir)
    check_chat_template(source, tokenizer)
    if native_tools:
        check_renders_tools(source, tokenizer)
    if own is not None:
        return tokenizer, own_model.build(own, dtype)
    from transformers import AutoModelForCausalLM

    # use_kernels=False: transformers 5 otherwise swaps layers for the `kernels` package's Hub kernels on a GPU,
    # fetched at load (an offline GPU box then cannot load at all: seen on the first GPU check), and the engine's
    # own forward pass replaces those layers' forward anyway.
    model = AutoModelForCausalLM.from_pretrained(source.location, dtype=dtype, device_map=device_map or None,
                                                 use_kernels=False, **load_options(source, cache_dir))
    return tokenizer, model


def _own_model_folder(source: ModelSource, on_gpu: bool, cache_dir: Path | None) -> Path | None:
    """The folder the engine builds the model from itself (a hub id's cached snapshot), or None (a GGUF file, a
    GPU, a hub id not in the cache yet, a model own_model.py does not build: the reason is logged)."""
    if source.gguf_file or on_gpu:
        return None
    if source.hub:
        from agent.llm.engine.hub import cached_folder  # here: httpx and the hub client cost a start 0.15 s

        folder = cached_folder(source.location, cache_dir)
        if folder is None:
            return None
    else:
        folder = Path(source.location)
    reason = own_model.buildable(folder)
    if reason is not None:
        log.debug("%s loads through transformers' model classes: %s", source.setting, reason)
        return None
    return folder


# The tokenizer class that loads a folder's tokenizer.json as it is, without the auto classes' look-up (which
# imports every model's configuration: a second of a start).
_PLAIN_TOKENIZER = "TokenizersBackend"


def _tokenizer(source: ModelSource, own: bool, cache_dir: Path | None) -> Any:
    """The tokenizer at `source`. A GGUF's converted copy (the engine's own folder) loads its tokenizer.json as it
    is: that is the tokenizer the GGUF's first start built, where the class the copy names (`Qwen2Tokenizer` for a
    qwen2 GGUF) would build its own pipeline from the vocabulary and split some text otherwise (`"\r\n"`)."""
    folder = Path(source.location)
    converted = not source.hub and (folder / COMPLETE_MARK).is_file()
    if converted or (own and _tokenizer_class(folder) == _PLAIN_TOKENIZER):
        from transformers.tokenization_utils_tokenizers import TokenizersBackend

        return TokenizersBackend.from_pretrained(source.location)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(source.location, **load_options(source, cache_dir))


def _tokenizer_class(folder: Path) -> str | None:
    try:
        return json.loads((folder / "tokenizer_config.json").read_text()).get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        return None


COMPLETE_MARK = "converted.ok"  # written last: a folder without it is an interrupted save, converted again
_HASHED_BYTES = 16 * 1024 * 1024


def converted_folder(source: ModelSource, dtype: Any, converted_dir: Path | None) -> Path | None:
    """Where a GGUF's converted copy lives: named by the file's size and the hash of its first 16 MiB (its header
    and metadata, so a replaced file is converted again) and the dtype; None for models that need no converting."""
    if converted_dir is None or source.gguf_file is None:
        return None
    path = Path(source.location) / source.gguf_file
    digest = hashlib.sha256()
    with path.open("rb") as file:
        digest.update(file.read(_HASHED_BYTES))
    digest.update(str(path.stat().st_size).encode())
    return Path(converted_dir) / f"{path.stem}-{digest.hexdigest()[:16]}-{str(dtype).removeprefix('torch.')}"


@contextlib.contextmanager
def _as_plain_weights(model: Any) -> Iterator[None]:
    """A de-quantized GGUF model still carries its GGUF quantizer, which refuses `save_pretrained`; its weights
    are plain tensors by then, so it is saved (and later loaded) as the ordinary model it has become."""
    quantizer, config = getattr(model, "hf_quantizer", None), getattr(model.config, "quantization_config", None)
    model.hf_quantizer = None
    if config is not None:
        del model.config.quantization_config
    try:
        yield
    finally:
        model.hf_quantizer = quantizer
        if config is not None:
            model.config.quantization_config = config


def save_converted(model: Any, tokenizer: Any, folder: Path) -> None:
    """Save the converted model; a failure (a full disk, a read-only folder) is logged, never fatal."""
    partial = folder.with_name(folder.name + ".partial")
    try:
        shutil.rmtree(partial, ignore_errors=True)
        with _as_plain_weights(model):
            model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / COMPLETE_MARK).write_text("ok\n")
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
        log.info("saved the converted model to %s: the next start loads it directly", folder)
    except OSError as error:
        shutil.rmtree(partial, ignore_errors=True)
        log.warning("could not save the converted model to %s (%s): every start converts it again", folder, error)


def check_chat_template(source: ModelSource, tokenizer: Any) -> None:
    """A base model without a chat template cannot hold a conversation: refuse it at start-up."""
    if not getattr(tokenizer, "chat_template", None):
        raise ModelLoadError(f"MODEL {source.setting}: its tokenizer has no chat template; use an instruct/chat model")


# A tool to offer a chat template, to see whether it renders tools at all.
_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool", "description": "A probe.",
                                                "parameters": {"type": "object", "properties": {}}}}


def check_renders_tools(source: ModelSource, tokenizer: Any) -> None:
    """Native tool calling offers tools through the chat template: refuse a template that leaves them out.

    Such a template (SmolLM2's, for one) would silently show the model no tools at all.
    """
    chat = [{"role": "user", "content": "Hello"}]
    plain = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    offered = tokenizer.apply_chat_template(chat, tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True)
    if "probe_tool" not in offered or offered == plain:
        raise ModelLoadError(f"MODEL {source.setting}: its chat template ignores tools, so AGENT_MODE=native would "
                             "show the model none; use AGENT_MODE=react")


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0]
