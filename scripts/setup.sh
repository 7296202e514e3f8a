#!/usr/bin/env bash
# Create .venv with the bot and its test tools installed, and fetch the offline assets. Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."
# torch==2.13.0 is the CPU build this environment keeps on disk; on a GPU box set TORCH_SPEC (e.g. "torch").
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
.venv/bin/python -m pip install -q "$TORCH_SPEC"
.venv/bin/python -m pip install -q -e ".[test]"
bash scripts/fetch_assets.sh
