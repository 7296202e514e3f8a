"""Qwen2.5-0.5B- and 1.5B-shaped models for the benchmark, built offline, and their Q4_K_M GGUF files.

The hub is out of reach, so the shapes come from Qwen's own configs (below) and the weights are random: a decode
step reads every weight once and a prompt multiplies by every one, so a random model of a shape costs what the real
one of that shape costs, per token. What it writes means nothing; the bench bans the end tokens, so every call
runs its full length. The vocabulary is the test GGUF's (SmolLM2's 49,152 tokens, ChatML template) instead of
Qwen's 151,936, so the embedding is smaller: 0.5B has 402M parameters here, 1.5B 1.39B.

Each model goes through llama.cpp's own tools, as a user of llama.cpp would make such a file:

    1. tokenizer: the test GGUF's, rebuilt by transformers (`AutoTokenizer.from_pretrained(..., gguf_file=...)`)
    2. model: `Qwen2ForCausalLM` from the config, random weights (seeded), saved in bf16 safetensors
    3. `convert_hf_to_gguf.py` → a bf16 GGUF (two things patched in its process, see `_convert`)
    4. `llama-quantize … Q4_K_M` → the file every engine of the side-by-side runs

    .venv/bin/python bench/sized_models.py --llama-cpp SRC/vendor/llama.cpp --quantize /work/cache/llama.cpp/llama-quantize
    .venv/bin/python bench/sized_models.py --shapes 0.5b ...    # only one
    .venv/bin/python bench/sized_models.py --hf-only           # only the transformers folders (a GPU check)

Files: `.cache/models/qwen2.5-{0.5b,1.5b}-shape.Q4_K_M.gguf` (`--out`); a file already there is kept (delete it to
build again). The intermediate files go to a temporary folder and are removed (`--keep` keeps them). Peak memory is
about the bf16 model twice (3 GB for 1.5B); disk, the same for a moment.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
TEST_GGUF = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"

# From Qwen's config.json of Qwen2.5-0.5B-Instruct and Qwen2.5-1.5B-Instruct (both tie the output layer to the
# embedding, both have biases on query/key/value).
SHAPES = {
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2},
    "1.5b": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28, "num_attention_heads": 12,
             "num_key_value_heads": 2},
}
COMMON = {"hidden_act": "silu", "max_position_embeddings": 32768, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
          "tie_word_embeddings": True, "use_sliding_window": False, "attention_dropout": 0.0}
QUANT = "Q4_K_M"
# The test tokenizer is SmolLM2's; the converter's table of pre-tokenizers keys it by a hash of how it splits a
# test string, which this rebuilt copy does not reproduce, so it is named here.
PRE_TOKENIZER = "smollm"


def gguf_path(out: Path, shape: str) -> Path:
    """Where the Q4_K_M file of `shape` goes."""
    return out / f"qwen2.5-{shape}-shape.{QUANT}.gguf"


def build_hf_model(shape: str, folder: Path, seed: int = 0) -> int:
    """A Qwen2 model of `shape` with random weights and the test tokenizer, saved in `folder`; its parameter count."""
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(str(TEST_GGUF.parent), gguf_file=TEST_GGUF.name)
    tokenizer.save_pretrained(folder)
    config = Qwen2Config(vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, **COMMON, **SHAPES[shape])
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    return sum(parameter.numel() for parameter in model.parameters())


def convert(llama_cpp: Path, folder: Path, outfile: Path) -> None:
    """`folder` (a transformers model) to a bf16 GGUF with llama.cpp's converter, in a process of its own."""
    subprocess.run([sys.executable, __file__, "_convert", str(llama_cpp), str(folder), str(outfile)], check=True)


def _convert(llama_cpp: str, folder: str, outfile: str) -> None:
    """Run llama.cpp's `convert_hf_to_gguf.py` here, with two things told instead of looked up:

    - the vocabulary is a GPT-2-style BPE (`tokenizer.json`): Qwen2's converter first tries SentencePiece, which
      needs the `sentencepiece` package only to find that there is no `tokenizer.model`;
    - the pre-tokenizer is SmolLM's (`PRE_TOKENIZER`).
    """
    sys.path[:0] = [llama_cpp, str(Path(llama_cpp) / "gguf-py")]
    import convert_hf_to_gguf  # noqa: F401  (registers the model classes)
    from conversion.base import TextModel
    from conversion.qwen import Qwen2Model

    Qwen2Model.set_vocab = TextModel._set_vocab_gpt2
    TextModel.get_vocab_base_pre = lambda self, tokenizer: PRE_TOKENIZER
    sys.argv = ["convert_hf_to_gguf.py", folder, "--outfile", outfile, "--outtype", "bf16"]
    convert_hf_to_gguf.main()


def quantize(quantizer: Path, source: Path, target: Path) -> None:
    """`source` to `target` in Q4_K_M with llama.cpp's `llama-quantize`, on every core."""
    subprocess.run([str(quantizer), str(source), str(target), QUANT, str(os.cpu_count() or 1)], check=True,
                   stdout=subprocess.DEVNULL)


def hf_folder(out: Path, shape: str) -> Path:
    """Where `--hf-only` puts the transformers folder of `shape`."""
    return out / f"qwen2.5-{shape}-shape"


def build_hf_only(shape: str, args: argparse.Namespace) -> Path:
    """The transformers folder of `shape` (bf16, random weights), built unless it is there."""
    target = hf_folder(args.out, shape)
    if not (target / "config.json").is_file():
        parameters = build_hf_model(shape, target, args.seed)
        print(f"{shape}: {parameters / 1e6:.0f}M parameters, random weights in {target}", file=sys.stderr)
    return target


def build(shape: str, args: argparse.Namespace) -> Path:
    """The Q4_K_M GGUF of `shape`, built unless it is there."""
    target = gguf_path(args.out, shape)
    if target.is_file():
        print(f"{shape}: {target} is there (delete it to build again)", file=sys.stderr)
        return target
    work = Path(tempfile.mkdtemp(prefix=f"sized-{shape}-", dir=args.work))
    started = time.perf_counter()
    try:
        parameters = build_hf_model(shape, work / "hf", args.seed)
        print(f"{shape}: {parameters / 1e6:.0f}M parameters, random weights in {work / 'hf'}", file=sys.stderr)
        convert(args.llama_cpp, work / "hf", work / "model.bf16.gguf")
        args.out.mkdir(parents=True, exist_ok=True)
        quantize(args.quantize, work / "model.bf16.gguf", target.with_suffix(".partial"))
        target.with_suffix(".partial").rename(target)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{shape}: {target} ({target.stat().st_size / 2**20:.0f} MiB) in {time.perf_counter() - started:.0f} s",
          file=sys.stderr)
    return target


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--llama-cpp", type=Path, help="llama.cpp's source folder (with convert_hf_to_gguf.py "
                        "and gguf-py/)")
    parser.add_argument("--quantize", type=Path, help="the llama-quantize binary")
    parser.add_argument("--hf-only", action="store_true", help="only the transformers folders, no GGUF")
    parser.add_argument("--out", type=Path, default=ROOT / ".cache" / "models", help="where the GGUF files go")
    parser.add_argument("--work", type=Path, default=None, help="where the intermediate files go (a temp folder)")
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    parser.add_argument("--keep", action="store_true", help="keep the transformers model and the bf16 GGUF")
    args = parser.parse_args(argv)
    if not args.hf_only and (args.llama_cpp is None or args.quantize is None):
        parser.error("--llama-cpp and --quantize are needed for the GGUF files (or --hf-only)")
    needs = [TEST_GGUF] if args.hf_only else [TEST_GGUF, args.llama_cpp / "convert_hf_to_gguf.py", args.quantize]
    for need in needs:
        if not need.exists():
            parser.error(f"missing: {need}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Build the GGUF file of every shape asked for; print their paths."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["_convert"]:
        _convert(*argv[1:4])
        return 0
    args = parse(argv)
    for shape in args.shapes:
        print(build_hf_only(shape, args) if args.hf_only else build(shape, args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
