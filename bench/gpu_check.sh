#!/usr/bin/env bash
# On a CUDA machine, one command: the engine's tests that apply on a GPU, then the sized bench there.
#
#     bash bench/gpu_check.sh                    # needs a CUDA device; exits 3 with one line where there is none
#     GPU_CHECK_CPU=1 bash bench/gpu_check.sh    # the same steps on the CPU (to check the script itself)
#
# 1. setup: .venv with torch's CUDA build (TORCH_SPEC=torch, as scripts/setup.sh explains), unless .venv already
#    has a torch that sees the device
# 2. the real-model tests of the engine's GPU path (started_local_llm on QWENBOT_TEST_DEVICE_MAP=cuda): loading,
#    batches, cancellation, grammar, prefix cache, speculative tokens; not the CPU-only layers (int8/int4, packed
#    bf16, the decode pass), whose kernels run on CPUs only and which the engine leaves out on a GPU
# 3. the sized models (bench/sized_models.py --hf-only: the Qwen2.5-0.5B and 1.5B shapes, random weights) through
#    bench_local.py with MODEL_DEVICE_MAP=cuda, 1 and 8 chats, 1 repeat
#
# Environment: SHAPES [0.5b 1.5b], CHATS [1 8], REPEAT [1], TESTS_ONLY=1 (skip the bench), OUT [/tmp/gpu-check].
set -euo pipefail
cd "$(dirname "$0")/.."
SHAPES=${SHAPES:-0.5b 1.5b}
CHATS=${CHATS:-1 8}
REPEAT=${REPEAT:-1}
OUT=${OUT:-/tmp/gpu-check}
DEVICE=cuda
if [ "${GPU_CHECK_CPU:-0}" = 1 ]; then
    DEVICE=cpu
    echo "gpu_check: GPU_CHECK_CPU=1: running every step on the CPU" >&2
elif ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "gpu_check: no CUDA device here (nvidia-smi finds none): nothing to check on a GPU; GPU_CHECK_CPU=1 runs the same steps on the CPU" >&2
    exit 3
fi
mkdir -p "$OUT"

has_device() { .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
if [ "$DEVICE" = cuda ]; then
    nvidia-smi -L
    has_device || TORCH_SPEC=${TORCH_SPEC:-torch} bash scripts/setup.sh
    has_device || { echo "gpu_check: torch in .venv does not see the CUDA device" >&2; exit 1; }
else
    bash scripts/setup.sh
fi
.venv/bin/python -c 'import torch; print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")'

echo "== the engine's tests on $DEVICE"
QWENBOT_TEST_DEVICE_MAP=$DEVICE .venv/bin/python -m pytest -q -x \
    tests/test_local_backend.py tests/test_constrained_local.py tests/test_decode_loop.py \
    -k "not int8 and not int4 and not quantized and not bf16 and not packed" 2>&1 | tee "$OUT/tests.log"

[ "${TESTS_ONLY:-0}" = 1 ] && exit 0
echo "== the sized bench on $DEVICE"
for shape in $SHAPES; do
    folder=$(.venv/bin/python bench/sized_models.py --hf-only --shapes "$shape" | tail -1)
    # shellcheck disable=SC2086 # CHATS is a word list
    .venv/bin/python bench/bench_local.py --model "$folder" --device-map "$DEVICE" --modes local --chats $CHATS \
        --repeat "$REPEAT" --no-startup --save-json "$OUT/bench-$shape.jsonl" | tee "$OUT/bench-$shape.txt"
done
echo "gpu_check: done; logs and JSON rows in $OUT"
