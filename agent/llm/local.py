"""The local backend (`LLM_BACKEND=local`): a transformers model on this machine, served by one model thread.

`MODEL` is a Hugging Face hub id (`Qwen/Qwen2.5-1.5B-Instruct`), a local folder holding one, or a `.gguf` file
(transformers de-quantizes it with the `gguf` package). Loading happens on the model thread (see `worker.py`); the
event loop only awaits it. Token counting uses a second tokenizer instance that stays on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import hashlib
import logging
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

from agent.errors import LLMError, ModelLoadError
from agent.grammar import Grammar
from agent.llm.attention import use_decode_attention
from agent.llm.batch_kv import KV_DTYPE
from agent.llm.base import LLM, MODEL_DTYPES, CancelToken, Completion, Message, TextSink
from agent.llm.constraints import GrammarEngine
from agent.llm.cpu_linear import pack_linears
from agent.llm.fp32_linear import use_short_input_linears
from agent.llm.drafts import DraftLimits
from agent.llm.fused_linear import fuse_projections
from agent.llm.hub import hub_load_options
from agent.llm.worker import Job, LoadedModel, ModelWorker

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


def choose_dtype(setting: str, on_gpu: bool) -> Any:
    """The torch dtype for MODEL_DTYPE; `auto` means bf16 where the hardware computes it natively, else fp32.

    Native bf16: a CUDA GPU, or a CPU with avx512_bf16 or AMX (measured 2.4-3x faster than fp32 on such a CPU).
    Without those instructions bf16 is emulated and slower than fp32. bf16 is not batch-invariant: rounding can
    flip a near-tied greedy choice when the batch shape changes; MODEL_DTYPE=float32 buys exact, batch-independent
    outputs (on a CPU) at that speed cost.
    """
    import torch

    check_dtype_setting(setting)
    if setting == "auto":
        return torch.bfloat16 if on_gpu or cpu_has_native_bf16() else torch.float32
    if setting == "int8":
        return torch.float32  # loaded in fp32, then its linear layers quantized (`quantize_int8`)
    return getattr(torch, setting)


def quantize_int8(model: Any) -> Any:
    """The model with its linear layers in int8 (weights per output channel; activations quantized per step).

    On a CPU decoding reads every weight once per token, so int8 weights (a quarter of fp32's bytes) make a step
    about twice as fast, and fbgemm's int8 kernels speed prompts up too (measured on a 2-core AVX2 CPU with
    SmolLM2-135M: a decode step 55 ms against 116 ms, 8 rows 83 ms against 197 ms). The price: outputs differ a
    little from fp32's, and a step's activations are scaled over the whole batch, so a row's output may depend on
    its batch neighbours. `torch.ao`'s dynamic quantization is deprecated in favour of torchao, but is in the
    torch this project pins, with the CPU kernels torchao lacks without compiling.
    """
    import warnings

    import torch
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its deprecation notices, once per layer
        return quantize_dynamic(model, {torch.nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8,
                                inplace=True)  # no second copy of the weights, even for a moment


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
        return hub_load_options(source.location, cache_dir)
    return {}


def load_model(source: ModelSource, device_map: str, dtype_setting: str,
               converted_dir: Path | None = None, cache_dir: Path | None = None,
               native_tools: bool = False) -> LoadedModel:
    """Load tokenizer and model (on the model thread); every failure becomes one clear `ModelLoadError` line.

    A GGUF file is converted on its first load (tokenizer built, weights de-quantized: a minute on a small CPU)
    and, with `converted_dir`, saved there in transformers' own format, so later starts load in seconds. A hub
    id is looked for, and downloaded, in `cache_dir`. `native_tools`: the agent will offer tools through the chat
    template (AGENT_MODE=native), so the template must render them; that is checked before the weights load.
    """
    import torch

    started = time.perf_counter()
    on_gpu = torch.cuda.is_available() and device_map not in ("", "cpu")
    if dtype_setting == "int8" and on_gpu:
        raise ModelLoadError("MODEL_DTYPE=int8 is for CPUs (its kernels run there only): on a GPU use auto (bf16), "
                             "or MODEL_DEVICE_MAP=cpu")
    dtype = choose_dtype(dtype_setting, on_gpu)
    converted = converted_folder(source, dtype, converted_dir)
    try:
        if converted is not None and (converted / COMPLETE_MARK).is_file():
            tokenizer, model = _from_pretrained(ModelSource(source.setting, str(converted)), dtype, device_map,
                                                native_tools=native_tools)
        else:
            tokenizer, model = _from_pretrained(source, dtype, device_map, cache_dir, native_tools)
            if converted is not None:
                save_converted(model, tokenizer, converted)
    except ModelLoadError:
        raise
    except Exception as error:
        raise ModelLoadError(f"MODEL {source.setting}: cannot load it: {_first_line(error)}") from error
    model.eval()
    if not on_gpu and model.config._attn_implementation == "sdpa":
        use_decode_attention(model)  # decode steps without sdpa's copies of the cache (attention.py)
    if not on_gpu and model.dtype == torch.bfloat16:
        fuse_projections(model)  # one product for query/key/value, one for gate/up (fused_linear.py)
        pack_linears(model)  # bf16 weights laid out once, not at every call (cpu_linear.py)
    if not on_gpu and model.dtype == torch.float32 and dtype_setting != "int8":
        use_short_input_linears(model)  # a decode step's products on every core (fp32_linear.py)
    if dtype_setting == "int8":
        fuse_projections(model)  # stacked before quantizing: one int8 product, one activation scale (fused_linear.py)
        model = quantize_int8(model)
        if cpu_has_native_bf16():  # half the KV's reads and memory: 10-20% more tokens/s at 8 chats (bench)
            setattr(model, KV_DTYPE, torch.bfloat16)
            log.info("int8 weights; the KV cache in bf16 (this CPU computes it natively)")
    grammars = GrammarEngine(tokenizer)
    # Logged once the model can answer (bench/bench_local.py times a second start of `qwenbot ask` to this line).
    log.info("loaded %s (%s on %s) in %.1f s%s", source.setting, "int8" if dtype_setting == "int8" else model.dtype,
             model.device, time.perf_counter() - started,
             f" from {converted}" if converted and converted.exists() else "")
    return LoadedModel(model, tokenizer, grammars)


def _from_pretrained(source: ModelSource, dtype: Any, device_map: str, cache_dir: Path | None = None,
                     native_tools: bool = False) -> tuple[Any, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    options = load_options(source, cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(source.location, **options)
    check_chat_template(source, tokenizer)
    if native_tools:
        check_renders_tools(source, tokenizer)
    model = AutoModelForCausalLM.from_pretrained(source.location, dtype=dtype, device_map=device_map or None,
                                                 **options)
    return tokenizer, model


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


class LocalLLM(LLM):
    """A transformers model on this machine; `complete` calls from all chats are batched on the model thread."""

    name = "local"

    def __init__(self, model: str, *, device_map: str = "auto", dtype: str = "auto", batch_size: int = 8,
                 batch_wait_ms: int = 20, min_new_tokens: int = 0, converted_dir: Path | None = None,
                 prefix_cache_mb: int = 0, base_dir: Path | None = None, cache_dir: Path | None = None,
                 native_tools: bool = False, drafts: DraftLimits = DraftLimits()):
        self.model_setting = model
        self.drafts = drafts
        self.converted_dir = converted_dir
        self.prefix_cache_mb = prefix_cache_mb
        self.base_dir = base_dir  # where a relative MODEL path is looked for (the data directory)
        self.cache_dir = cache_dir  # where hub models are downloaded to and looked for
        self.native_tools = native_tools  # AGENT_MODE=native: the chat template must render tools
        self.device_map = device_map
        self.dtype = dtype
        self.batch_size = batch_size
        self.batch_wait_ms = batch_wait_ms
        self.min_new_tokens = min_new_tokens  # benchmarks only: fixed-length generations
        self._worker: ModelWorker | None = None
        self._counter: Any = None  # the event loop's own tokenizer, for count_tokens

    async def start(self) -> None:
        """Load the model on its thread and wait for it; raises `ModelLoadError` with one clear line."""
        source = resolve_model(self.model_setting, self.base_dir)
        check_dtype_setting(self.dtype)
        worker = ModelWorker(lambda: load_model(source, self.device_map, self.dtype, self.converted_dir,
                                                self.cache_dir, self.native_tools),
                             batch_size=self.batch_size, batch_wait=self.batch_wait_ms / 1000,
                             min_new_tokens=self.min_new_tokens, prefix_cache_bytes=self.prefix_cache_mb << 20,
                             drafts=self.drafts)
        loaded = await worker.start()
        # A copy is a separate Rust object, so the loop and the model thread never share a tokenizer. Copying
        # here is safe: no job can reach the model thread before `self._worker` is set below.
        self._counter = copy.deepcopy(loaded.tokenizer)
        self._worker = worker

    async def close(self) -> None:
        """Cancel what is in flight and stop the model thread."""
        if self._worker is not None:
            await self._worker.close()

    async def complete(
        self,
        messages: Sequence[Message],
        *,
        stop: Sequence[str] = (),
        max_new_tokens: int = 512,
        tools: Sequence[dict[str, Any]] | None = None,
        cancel: CancelToken | None = None,
        on_text: TextSink | None = None,
        grammar: Grammar | None = None,
    ) -> Completion:
        """Queue the request for the next batch and await its row (decoded under `grammar`, if given; its text
        streamed to `on_text` as the model thread generates it); cancelling the awaiting task cancels the row."""
        if self._worker is None:
            raise LLMError("the local model is not started")
        loop = asyncio.get_running_loop()
        job = Job(list(messages), tuple(stop), max_new_tokens, list(tools) if tools else None,
                  loop, loop.create_future(), grammar=grammar, caller_cancel=cancel, on_text=on_text)
        self._worker.submit(job)
        try:
            return await job.future
        except asyncio.CancelledError:
            job.own_cancel.cancel()  # the row stops at its next step; the other rows go on
            raise

    def count_tokens(self, text: str) -> int:
        """Tokens of `text` for this model, counted with the event loop's own tokenizer."""
        if self._counter is None:
            raise LLMError("the local model is not started")
        return len(self._counter.encode(text, add_special_tokens=False))
