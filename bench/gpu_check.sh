#!/usr/bin/env bash
# On a CUDA machine, one command: the engine's tests that apply on a GPU, then the sized bench there.
#
#     bash bench/gpu_check.sh                    # needs a CUDA device; exits 3 with one line where there is none
#     GPU_CHECK_CPU=1 bash bench/gpu_check.sh    # the same steps on the CPU (to check the script itself)
#     GPU_CHECK_PYTHON=python3 GPU_CHECK_SITE=DIR bash bench/gpu_check.sh   # without network (bench/gpu_carry.sh)
#
# 1. setup: .venv with torch's CUDA build (TORCH_SPEC=torch, as scripts/setup.sh explains), unless .venv already
#    has a torch that sees the device. Without network (GPU_CHECK_PYTHON set): no setup.sh and no .venv; that
#    Python's own torch, under the packages in GPU_CHECK_SITE [/tmp/gpu-check-site] (bench/gpu_wheels.txt, which
#    gpu_carry.sh installs and carries; or GPU_CHECK_WHEELS=DIR: wheels to install there first), which a venv
#    GPU_CHECK_VENV [/tmp/gpu-check-venv] puts before that Python's own; pytest loads no plugin but pytest-asyncio;
#    the test GGUF must already be in .cache/models (gpu_carry.sh unpack puts it there)
# 2. the real-model tests of the engine's GPU path (started_local_llm on QWENBOT_TEST_DEVICE_MAP=cuda): loading,
#    batches, cancellation, grammar, prefix cache, speculative tokens; not the CPU-only layers (int8/int4, packed
#    bf16, the decode pass), whose kernels run on CPUs only and which the engine leaves out on a GPU
# 3. the sized models (bench/sized_models.py --hf-only: the Qwen2.5-0.5B and 1.5B shapes, random weights) through
#    bench_local.py with MODEL_DEVICE_MAP=cuda, 1 and 8 chats, 1 repeat
#
# Environment: SHAPES [0.5b 1.5b], CHATS [1 8], REPEAT [1], TESTS_ONLY=1 (skip the bench), OUT [/tmp/gpu-check]:
# env.log (the versions that ran), tests.log, bench-SHAPE.{txt,jsonl}, each written as the step runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1  # the logs under OUT fill as the steps run, so a run cut short still leaves them
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

PYTHON=${GPU_CHECK_PYTHON:-.venv/bin/python}
has_device() { "$PYTHON" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
if [ "$DEVICE" = cuda ]; then nvidia-smi -L; fi
if [ -n "${GPU_CHECK_PYTHON:-}" ]; then
    # No network: the carried packages, in GPU_CHECK_SITE as gpu_carry.sh unpacks them, or installed there now from
    # GPU_CHECK_WHEELS (as they are: no resolver, no index). A thin venv puts them before that Python's own packages
    # (a .pth), so that the processes the tests and the bench start (sys.executable) see them too: PYTHONPATH alone
    # would not do (some tests set their own), it is the fallback where that Python cannot make a venv.
    site=${GPU_CHECK_SITE:-/tmp/gpu-check-site} overlay=${GPU_CHECK_VENV:-/tmp/gpu-check-venv}
    if [ -n "${GPU_CHECK_WHEELS:-}" ]; then
        "$GPU_CHECK_PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$site" "$GPU_CHECK_WHEELS"/*.whl
    fi
    if [ -d "$site" ] && "$GPU_CHECK_PYTHON" -m venv --without-pip --clear "$overlay"; then
        purelib=$("$overlay/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        "$GPU_CHECK_PYTHON" - "$site" > "$purelib/gpu-check.pth" <<'PY'
import sys
for path in [sys.argv[1], *(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))]:
    print(f"import site; site.addsitedir({path!r})")
PY
        PYTHON=$overlay/bin/python
    elif [ -d "$site" ]; then
        echo "gpu_check: $GPU_CHECK_PYTHON made no venv: $site goes on PYTHONPATH (tests that set their own lack it)" >&2
        export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    fi
    # pytest as the project's .venv has it: the carried pytest-asyncio, none of that Python's other plugins
    export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTEST_PLUGINS=pytest_asyncio.plugin
    [ -s .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf ] || { echo "gpu_check: the test GGUF is not in .cache/models (bench/gpu_carry.sh unpack puts it there)" >&2; exit 1; }
elif [ "$DEVICE" = cuda ]; then
    has_device || TORCH_SPEC=${TORCH_SPEC:-torch} bash scripts/setup.sh
else
    bash scripts/setup.sh
fi
[ "$DEVICE" = cpu ] || has_device || { echo "gpu_check: torch in $PYTHON does not see the CUDA device" >&2; exit 1; }
"$PYTHON" - <<'PY' 2>&1 | tee "$OUT/env.log"
import importlib.metadata as metadata, sys, torch
print("python", sys.version.split()[0], sys.executable)
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
for name in ("transformers", "tokenizers", "accelerate", "huggingface_hub", "safetensors", "numpy", "gguf",
             "llguidance", "pytest", "pytest-asyncio", "python-telegram-bot", "httpx", "anyio", "openai", "pydantic"):
    try:
        print(name, metadata.version(name), metadata.distribution(name).locate_file(""))
    except metadata.PackageNotFoundError:
        print(name, "missing")
PY

echo "== the engine's tests on $DEVICE"
# A failing test does not stop the bench (a GPU call is scarce: both results come back), only the exit status.
tests_status=0
QWENBOT_TEST_DEVICE_MAP=$DEVICE "$PYTHON" -m pytest -q -x \
    tests/test_local_backend.py tests/test_constrained_local.py tests/test_decode_loop.py \
    -k "not int8 and not int4 and not quantized and not bf16 and not packed" 2>&1 | tee "$OUT/tests.log" \
    || tests_status=$?

[ "${TESTS_ONLY:-0}" = 1 ] && exit "$tests_status"
echo "== the sized bench on $DEVICE"
for shape in $SHAPES; do
    folder=$("$PYTHON" bench/sized_models.py --hf-only --shapes "$shape" | tail -1)
    # shellcheck disable=SC2086 # CHATS is a word list
    "$PYTHON" bench/bench_local.py --model "$folder" --device-map "$DEVICE" --modes local --chats $CHATS \
        --repeat "$REPEAT" --no-startup --save-json "$OUT/bench-$shape.jsonl" | tee "$OUT/bench-$shape.txt"
done
echo "gpu_check: done (tests exit status $tests_status); logs and JSON rows in $OUT"
exit "$tests_status"
