#!/usr/bin/env bash
# Our local engine against llama.cpp's servers on the same GGUF files, side by side, in one command:
#
#     bash bench/run_vs_llamacpp.sh                 # every model below: 1 and 8 chats, 2 repeats
#     MODELS=.cache/models/qwen2.5-0.5b-shape.Q4_K_M.gguf REPEAT=1 bash bench/run_vs_llamacpp.sh
#     CHATS="1 2" REPEAT=1 BENCH_ARGS="--turns 1 --new-tokens 4 --probe-tokens 16" bash bench/run_vs_llamacpp.sh
#
# Run it on an idle machine. For each model in turn it starts the C++ llama-server (port 8771) and, where it is
# installed, llama-cpp-python's server (port 8770), waits until each answers, runs bench/bench_local.py for our
# engine and the servers (reached through our own openai backend), prints the table with the machine's load beside
# it, and stops the servers. The JSON rows are kept in $RESULTS (one file per model).
#
# The models: the test GGUF (SmolLM2-135M, Q4_1) and the Qwen2.5-0.5B- and 1.5B-shaped Q4_K_M files that
# bench/sized_models.py builds (random weights, the test tokenizer), each where it is there.
#
# The servers (see "Environment facts" in /work/shared/DESIGN.md):
#   llama.cpp's C++ llama-server and llama-quantize, from the llama.cpp vendored in the llama-cpp-python sdist,
#   built natively once into a cache folder (~20 min on 2 busy cores):
#       pip download --no-deps --no-binary :all: llama-cpp-python && tar xzf llama_cpp_python-*.tar.gz
#       cd llama_cpp_python-*/vendor/llama.cpp
#       cmake -B build -G Ninja -DGGML_NATIVE=ON -DLLAMA_BUILD_SERVER=ON -DCMAKE_BUILD_TYPE=Release \
#             -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
#       ninja -C build llama-server llama-quantize && cp build/bin/llama-server build/bin/llama-quantize /work/cache/llama.cpp/
#   llama-cpp-python's server (optional), into its own virtualenv (7 min idle on 2 cores; a native build dies
#   with "Illegal instruction" on these CPUs):
#       python3 -m venv /work/llama/venv
#       CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX512=OFF" /work/llama/venv/bin/pip install 'llama-cpp-python[server]'
#
# Environment (defaults in brackets):
#   MODELS         the GGUF files, in order [the test GGUF, then .cache/models/qwen2.5-{0.5b,1.5b}-shape.Q4_K_M.gguf
#                  where built]
#   MODES          our contenders (bench_local.py --modes) [local: default settings]
#   LLAMA_SERVER   the llama-server binary [/work/cache/llama.cpp/llama-server, else /work/llama/llama-server]
#   LLAMA_PY       python with llama_cpp.server installed [/work/llama/venv/bin/python; skipped if absent]
#   THREADS        CPU threads for both servers [nproc]. llama-cpp-python decodes on cpu_count/2 threads unless
#                  told (1 on a 2-core box); both servers get all cores, as our engine has (torch's default).
#   PY_PORT, CPP_PORT  [8770, 8771]
#   CHATS, REPEAT  [1 8, 2]
#   BENCH_ARGS     more bench_local.py options, e.g. "--turns 2 --new-tokens 32 --probe-tokens 256"
#   NICE           niceness of everything this starts [0]; use 10 on a shared machine
#   RESULTS        where the JSON rows go: a prefix, each model's file gets its name appended [/tmp/vs-llamacpp-DATE]
#   READY_TIMEOUT  seconds to wait for a server to answer [300]
#   ATTEMPTS       runs of a model's rows when llama-server exits in the middle of one [3]; each starts it again
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${LLAMA_SERVER:-}" ]; then
    LLAMA_SERVER=/work/cache/llama.cpp/llama-server
    [ -x "$LLAMA_SERVER" ] || LLAMA_SERVER=/work/llama/llama-server
fi
LLAMA_PY=${LLAMA_PY:-/work/llama/venv/bin/python}
if [ -z "${MODELS:-}" ]; then
    MODELS=.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
    for shape in 0.5b 1.5b; do
        sized=.cache/models/qwen2.5-$shape-shape.Q4_K_M.gguf
        [ -f "$sized" ] && MODELS="$MODELS $sized"
    done
fi
MODES=${MODES:-local}
THREADS=${THREADS:-$(nproc)}
PY_PORT=${PY_PORT:-8770}
CPP_PORT=${CPP_PORT:-8771}
CHATS=${CHATS:-1 8}
REPEAT=${REPEAT:-2}
BENCH_ARGS=${BENCH_ARGS:-}
NICE=${NICE:-0}
RESULTS=${RESULTS:-/tmp/vs-llamacpp-$(date +%Y%m%d-%H%M%S)}
READY_TIMEOUT=${READY_TIMEOUT:-300}
ATTEMPTS=${ATTEMPTS:-3}
LOGS=$(mktemp -d /tmp/vs-llamacpp-logs.XXXXXX)

for need in "$LLAMA_SERVER" .venv/bin/python $MODELS; do
    [ -e "$need" ] || { echo "missing: $need (see the comments at the top of $0)" >&2; exit 2; }
done
WITH_PY=1
if ! [ -x "$LLAMA_PY" ] || ! "$LLAMA_PY" -c "import llama_cpp.server" 2>/dev/null; then
    WITH_PY=0
    echo "llama-cpp-python's server is not installed at $LLAMA_PY: only llama-server runs beside ours" >&2
fi

PIDS=()
stop_servers() {
    # Both ignore SIGTERM while generating: ask, give them a grace period, then kill -9.
    local pid
    for pid in "${PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for _ in 1 2 3 4 5 6 7 8 9 10; do
        local alive=0
        for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.5
    done
    for pid in "${PIDS[@]}"; do kill -9 "$pid" 2>/dev/null || true; done
    PIDS=()
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

# start_llama_server GGUF: start llama-server on it and wait until it answers; sets CPP_PID and LAST_START_MS.
start_llama_server() {
    local start_ns
    start_ns=$(date +%s%N)
    nice -n "$NICE" "$LLAMA_SERVER" -m "$1" -c 16384 --parallel 8 -t "$THREADS" --alias smol \
        --host 127.0.0.1 --port "$CPP_PORT" >"$LOGS/llama-server.log" 2>&1 &
    CPP_PID=$!
    PIDS+=("$CPP_PID")
    wait_ready llama-server "$CPP_PID" "http://127.0.0.1:$CPP_PORT/health"
    LAST_START_MS=$(( ($(date +%s%N) - start_ns) / 1000000 ))
}

# run_model GGUF: start the servers on it, run the bench, stop them.
run_model() {
    local model=$1 name start_ns py_start=0 cpp_start openai_args=()
    name=$(basename "$model" .gguf)
    echo "== $name: starting the servers (logs in $LOGS)" >&2
    if [ "$WITH_PY" = 1 ]; then
        start_ns=$(date +%s%N)
        # --interrupt_requests False: by default a new request ends the one being answered (mid-stream,
        # unfinished) instead of waiting for it; a bot with two chats at once needs the requests queued.
        nice -n "$NICE" "$LLAMA_PY" -m llama_cpp.server --model "$model" --n_ctx 4096 --model_alias smol \
            --n_threads "$THREADS" --interrupt_requests False --host 127.0.0.1 --port "$PY_PORT" \
            >"$LOGS/llama-cpp-python.log" 2>&1 &
        local py_pid=$!
        PIDS+=("$py_pid")
        wait_ready llama-cpp-python "$py_pid" "http://127.0.0.1:$PY_PORT/v1/models"
        py_start=$(( ($(date +%s%N) - start_ns) / 1000000 ))
        openai_args+=(--openai "http://127.0.0.1:$PY_PORT/v1" --openai-label "llama-cpp-python server" --openai-pid "$py_pid")
    fi
    start_llama_server "$model"
    cpp_start=$LAST_START_MS

    echo "== $name"
    echo "date: $(date -Is)"
    echo "cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), nproc $(nproc), $(free -g | awk '/^Mem:/{print $2}') GiB"
    echo "bf16: $(grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo && echo 'the CPU has avx512_bf16 or AMX' || echo 'no bf16 instructions')"
    echo "load before: $(uptime)"
    echo "torch/transformers: $(.venv/bin/python -c 'import torch, transformers; print(torch.__version__, transformers.__version__)')"
    echo "llama-server: $("$LLAMA_SERVER" --version 2>&1 | grep -m1 -i version || echo '?')"
    if [ "$WITH_PY" = 1 ]; then
        echo "llama-cpp-python: $("$LLAMA_PY" -c 'import llama_cpp; print(llama_cpp.__version__)')"
    fi
    echo "server start (process to answering): llama-server $(awk "BEGIN{printf \"%.1f\", $cpp_start/1000}") s$([ "$WITH_PY" = 1 ] && awk "BEGIN{printf \", llama-cpp-python %.1f s\", $py_start/1000}")"
    echo "threads: llama-server -t $THREADS --parallel 8 -c 16384; niceness $NICE"
    echo
    # Should llama-server exit in the middle of a run, it is started again and the model's rows run anew, whole.
    # (Earlier runs that stopped with "Server disconnected" were not that: the bench's client sent a request on a
    # connection the server was closing after 5 s idle, without a retry; the server's log line "cleaning up before
    # exit" came from this script stopping it. The bench now retries as the bot does.)
    local attempt=1
    # shellcheck disable=SC2086 # CHATS, MODES and BENCH_ARGS are word lists
    until nice -n "$NICE" .venv/bin/python bench/bench_local.py --model "$model" --modes $MODES --chats $CHATS \
        --repeat "$REPEAT" "${openai_args[@]}" --openai "http://127.0.0.1:$CPP_PORT/v1" \
        --openai-label "llama-server (C++)" --openai-pid "$CPP_PID" --openai-model smol \
        --save-json "$RESULTS-$name.jsonl" $BENCH_ARGS; do
        # Gone means not answering: an exited server stays a zombie, alive to `kill -0`, until this shell waits.
        if curl -sf -o /dev/null --max-time 10 "http://127.0.0.1:$CPP_PORT/health" || [ "$attempt" -ge "$ATTEMPTS" ]; then
            echo "bench_local.py failed on $name (attempt $attempt of $ATTEMPTS)" >&2
            exit 1
        fi
        attempt=$((attempt + 1))
        echo "llama-server exited during the run; its log ends:" >&2
        tail -3 "$LOGS/llama-server.log" >&2
        echo "starting it again; $name's rows run anew (attempt $attempt of $ATTEMPTS)" >&2
        cp "$LOGS/llama-server.log" "$LOGS/llama-server.attempt$((attempt - 1)).log"
        start_llama_server "$model"
    done
    echo
    echo "load after: $(uptime)"
    echo "JSON rows: $RESULTS-$name.jsonl"
    echo
    stop_servers
}

for model in $MODELS; do
    run_model "$model"
done
