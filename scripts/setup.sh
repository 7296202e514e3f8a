#!/usr/bin/env bash
# Create .venv with the bot and its test tools installed, and fetch the offline assets. Safe to run again: pip
# runs only when something it depends on changed (pyproject.toml, constraints.txt, this script, TORCH_SPEC,
# TORCH_INDEX_URL, the Python version), which a stamp in .venv records. Fresh start: `rm -rf .venv`.
# Every package but torch is installed at the version constraints.txt pins: what the test suite ran with.
#   TORCH_SPEC       which torch to install (default torch==2.13.0: the CPU build where pip already holds it;
#                    on Linux, PyPI's torch is the CUDA build, so on a GPU box `TORCH_SPEC=torch` is enough)
#   TORCH_INDEX_URL  where torch comes from (e.g. PyTorch's CPU-only wheel index, to keep the CUDA libraries out)
#   SETUP_EXTRAS     the package's extras to install (default test: pytest and the test tools; empty for none, as
#                    the container image does)
set -euo pipefail
cd "$(dirname "$0")/.."
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
TORCH_INDEX_URL=${TORCH_INDEX_URL:-}
SETUP_EXTRAS=${SETUP_EXTRAS-test}
STAMP=.venv/.setup-stamp
[ -x .venv/bin/python ] || python3 -m venv .venv

wanted=$(.venv/bin/python - "$TORCH_SPEC" "$TORCH_INDEX_URL" "$SETUP_EXTRAS" <<'PY'
import hashlib, sys
digest = hashlib.sha256("\n".join([sys.version, *sys.argv[1:]]).encode())
for name in ("pyproject.toml", "constraints.txt", "scripts/setup.sh"):
    digest.update(open(name, "rb").read())
print(digest.hexdigest())
PY
)
if [ -x .venv/bin/qwenbot ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$wanted" ]; then
  echo "setup: .venv is up to date (pyproject.toml, constraints.txt, TORCH_SPEC and Python unchanged); skipping pip" >&2
else
  rm -f "$STAMP"
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
  .venv/bin/python -m pip install -q ${TORCH_INDEX_URL:+--index-url "$TORCH_INDEX_URL"} "$TORCH_SPEC"
  .venv/bin/python -m pip install -q -c constraints.txt -e ".${SETUP_EXTRAS:+[$SETUP_EXTRAS]}"
  echo "$wanted" > "$STAMP"
fi
bash scripts/fetch_assets.sh
