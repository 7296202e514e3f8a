#!/usr/bin/env bash
# Our local engine against llama.cpp's two servers on the same GGUF, side by side, in one command:
#
#     bash bench/run_vs_llamacpp.sh                 # 1 and 8 chats, 2 repeats, our three modes and both servers
#     CHATS="1 2" REPEAT=1 BENCH_ARGS="--turns 1 --new-tokens 4 --probe-tokens 16" bash bench/run_vs_llamacpp.sh
#
# Run it on an idle machine: it starts llama-cpp-python's server (port 8770) and the C++ llama-server (port 8771)
# on the test GGUF, waits until each answers, runs bench/bench_local.py for our engine and both servers (reached
# through our own openai backend), prints the table with the machine's load beside it, and stops the servers.
# The JSON rows are kept in $RESULTS.
#
# The servers (see "Environment facts" in /work/shared/DESIGN.md):
#   llama-cpp-python's server, into its own virtualenv (7 min idle on 2 cores; a native build dies with
#   "Illegal instruction" on these CPUs):
#       python3 -m venv /work/llama/venv
#       CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF" /work/llama/venv/bin/pip install 'llama-cpp-python[server]'
#   llama.cpp's C++ llama-server, from the llama.cpp vendored in the llama-cpp-python sdist (~10 min idle):
#       pip download --no-deps --no-binary :all: llama-cpp-python && tar xzf llama_cpp_python-*.tar.gz
#       cd llama_cpp_python-*/vendor/llama.cpp
#       cmake -B build -G Ninja -DGGML_NATIVE=OFF -DGGML_AVX512=OFF -DLLAMA_BUILD_SERVER=ON \
#             -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF && ninja -C build llama-server
#       cp build/bin/llama-server /work/llama/
#   (/work/llama/build.sh does both.)
#
# Environment (defaults in brackets):
#   LLAMA_PY       python with llama_cpp.server installed [/work/llama/venv/bin/python]
#   LLAMA_SERVER   the llama-server binary [/work/llama/llama-server]
#   MODEL          the GGUF every engine runs [.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf]
#   THREADS        CPU threads for both servers [nproc]. llama-cpp-python decodes on cpu_count/2 threads unless
#                  told (1 on a 2-core box); both servers get all cores, as our engine has (torch's default).
#   PY_PORT, CPP_PORT  [8770, 8771]
#   CHATS, REPEAT  [1 8, 2]
#   BENCH_ARGS     more bench_local.py options, e.g. "--turns 2 --new-tokens 32 --probe-tokens 256"
#   NICE           niceness of everything this starts [0]; use 10 on a shared machine
#   RESULTS        where the JSON rows go [/tmp/vs-llamacpp-DATE.jsonl]
#   READY_TIMEOUT  seconds to wait for a server to answer [300]
set -euo pipefail
cd "$(dirname "$0")/.."

LLAMA_PY=${LLAMA_PY:-/work/llama/venv/bin/python}
LLAMA_SERVER=${LLAMA_SERVER:-/work/llama/llama-server}
MODEL=${MODEL:-.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
THREADS=${THREADS:-$(nproc)}
PY_PORT=${PY_PORT:-8770}
CPP_PORT=${CPP_PORT:-8771}
CHATS=${CHATS:-1 8}
REPEAT=${REPEAT:-2}
BENCH_ARGS=${BENCH_ARGS:-}
NICE=${NICE:-0}
RESULTS=${RESULTS:-/tmp/vs-llamacpp-$(date +%Y%m%d-%H%M%S).jsonl}
READY_TIMEOUT=${READY_TIMEOUT:-300}
LOGS=$(mktemp -d /tmp/vs-llamacpp-logs.XXXXXX)

for need in "$LLAMA_PY" "$LLAMA_SERVER" "$MODEL" .venv/bin/python; do
    [ -e "$need" ] || { echo "missing: $need (see the comments at the top of $0)" >&2; exit 2; }
done
"$LLAMA_PY" -c "import llama_cpp.server" 2>/dev/null \
    || { echo "$LLAMA_PY has no llama_cpp.server (see the comments at the top of $0)" >&2; exit 2; }

PIDS=()
stop_servers() {
    # Both ignore SIGTERM while generating: ask, give them a grace period, then kill -9.
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        local alive=0
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && return 0
        sleep 0.5
    done
    for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
}
trap stop_servers EXIT

port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
for port in "$PY_PORT" "$CPP_PORT"; do
    port_free "$port" || { echo "port $port is in use: stop what listens there, or set PY_PORT/CPP_PORT" >&2; exit 2; }
done

# wait_ready NAME PID URL: until GET URL answers 200.
wait_ready() {
    local name=$1 pid=$2 url=$3 started=$SECONDS
    until curl -sf -o /dev/null --max-time 5 "$url"; do
        kill -0 "$pid" 2>/dev/null || { echo "$name exited while starting; its log:" >&2; tail -20 "$LOGS/$name.log" >&2; exit 1; }
        [ $((SECONDS - started)) -lt "$READY_TIMEOUT" ] || { echo "$name not ready after ${READY_TIMEOUT} s" >&2; exit 1; }
        sleep 0.2
    done
}

echo "starting llama-cpp-python's server on :$PY_PORT and llama-server on :$CPP_PORT (logs in $LOGS)" >&2
start_ns=$(date +%s%N)
# --interrupt_requests False: by default a new request ends the one being answered (mid-stream, unfinished)
# instead of waiting for it; a bot with two chats at once needs the requests queued.
nice -n "$NICE" "$LLAMA_PY" -m llama_cpp.server --model "$MODEL" --n_ctx 4096 --model_alias smol \
    --n_threads "$THREADS" --interrupt_requests False --host 127.0.0.1 --port "$PY_PORT" >"$LOGS/llama-cpp-python.log" 2>&1 &
PY_PID=$!
PIDS+=("$PY_PID")
wait_ready llama-cpp-python "$PY_PID" "http://127.0.0.1:$PY_PORT/v1/models"
py_start=$(( ($(date +%s%N) - start_ns) / 1000000 ))
start_ns=$(date +%s%N)
nice -n "$NICE" "$LLAMA_SERVER" -m "$MODEL" -c 16384 --parallel 8 -t "$THREADS" --alias smol \
    --host 127.0.0.1 --port "$CPP_PORT" >"$LOGS/llama-server.log" 2>&1 &
CPP_PID=$!
PIDS+=("$CPP_PID")
wait_ready llama-server "$CPP_PID" "http://127.0.0.1:$CPP_PORT/health"
cpp_start=$(( ($(date +%s%N) - start_ns) / 1000000 ))

echo "== machine"
echo "date: $(date -Is)"
echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), nproc $(nproc), $(free -g | awk '/^Mem:/{print $2}') GiB"
echo "bf16: $(grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && echo 'the CPU has avx512_bf16 or AMX: MODEL_DTYPE=auto is bfloat16 here' || echo 'no bf16 instructions: MODEL_DTYPE=auto is float32 here')"
echo "load before: $(uptime)"
echo "torch/transformers: $(.venv/bin/python -c 'import torch, transformers; print(torch.__version__, transformers.__version__)')"
echo "llama-cpp-python: $("$LLAMA_PY" -c 'import llama_cpp; print(llama_cpp.__version__)'), llama-server: $("$LLAMA_SERVER" --version 2>&1 | grep -m1 -i version || echo '?')"
echo "server start (process to answering): llama-cpp-python $(awk "BEGIN{printf \"%.1f\", $py_start/1000}") s, llama-server $(awk "BEGIN{printf \"%.1f\", $cpp_start/1000}") s"
echo "threads: llama-cpp-python --n_threads $THREADS, llama-server -t $THREADS --parallel 8 -c 16384; niceness $NICE"
echo
# shellcheck disable=SC2086 # CHATS and BENCH_ARGS are word lists
nice -n "$NICE" .venv/bin/python bench/bench_local.py --model "$MODEL" --chats $CHATS --repeat "$REPEAT" \
    --openai "http://127.0.0.1:$PY_PORT/v1" --openai-label "llama-cpp-python server" --openai-pid "$PY_PID" \
    --openai "http://127.0.0.1:$CPP_PORT/v1" --openai-label "llama-server (C++)" --openai-pid "$CPP_PID" \
    --openai-model smol --save-json "$RESULTS" $BENCH_ARGS
echo
echo "load after: $(uptime)"
echo "JSON rows: $RESULTS"
