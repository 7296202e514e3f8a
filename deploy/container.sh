#!/usr/bin/env bash
# Build the bot's image with podman and check it for real, on a machine with no image registry in reach.
#
#   deploy/container.sh            all of it: tools, base image, image, check
#   deploy/container.sh tools      apt-get install podman runc mmdebstrap (as root), when missing
#   deploy/container.sh base       a Debian bookworm image with python3, made with mmdebstrap and `podman import`
#   deploy/container.sh build      the image from the Dockerfile on that base (BASE_IMAGE build argument)
#   deploy/container.sh check      run it against the fake Bot API on this host, with the scripted model
#
# The check starts tests/fakes/telegram_server.py as a process on the host, runs the image with the healthcheck,
# a named volume for its data and LLM_BACKEND=scripted (deploy/check/replies.json), sends it a question, and checks
# the answer, the health status, the metrics, the user it runs as, what is installed, and that the data outlives
# the container. Everything it starts it removes again (KEEP=1 keeps the container and volume to look at).
#
#   BASE_IMAGE   the base to build on (default: the imported Debian image; python:3.11-slim in real deployments)
#   IMAGE        the image's name (default localhost/qwenbot:check)
#
# podman's settings come from deploy/containers.conf (CONTAINERS_CONF): runc, cgroupfs and no default ulimits, the
# only combination the VMs this was written on accept. pip inside the build gets this host's package index
# configuration (`pip config list`, PIP_* variables) and the local folders it names, mounted read-only for the
# build only: nothing of it stays in the image.
set -euo pipefail
cd "$(dirname "$0")/.."
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/containers.conf}
BASE_IMAGE=${BASE_IMAGE:-localhost/debian-python:bookworm}
IMAGE=${IMAGE:-localhost/qwenbot:check}
NAME=qwenbot-check
VOLUME=qwenbot-check-data
WORK=.cache/container  # scratch space (ignored by git): the base tarball, the pip config, the fake server's log
PODMAN=(podman --runtime runc)
PYTHON=${PYTHON:-.venv/bin/python}

say() { printf '\n== %s\n' "$*" >&2; }
fail() { printf 'FAILED: %s\n' "$*" >&2; exit 1; }

tools() {
  command -v podman >/dev/null && command -v runc >/dev/null && command -v mmdebstrap >/dev/null && return 0
  say "installing podman, runc and mmdebstrap"
  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q podman runc mmdebstrap
}

base() {
  if "${PODMAN[@]}" image exists "$BASE_IMAGE"; then
    say "base image $BASE_IMAGE exists (podman rmi it to make it again)"
    return 0
  fi
  say "making $BASE_IMAGE: Debian bookworm, python3, venv, CA certificates (mmdebstrap, then podman import)"
  mkdir -p "$WORK"
  # passwd for useradd; ca-certificates for pip over HTTPS. Nothing else: the bot's Python packages come from pip.
  mmdebstrap --variant=minbase --include=python3,python3-venv,ca-certificates,passwd \
    bookworm "$WORK/bookworm.tar" http://deb.debian.org/debian
  "${PODMAN[@]}" import --change 'CMD ["/bin/bash"]' --change 'ENV LANG=C.UTF-8' "$WORK/bookworm.tar" "$BASE_IMAGE"
  rm -f "$WORK/bookworm.tar"
}

# This host's pip configuration as one [global] section, and a --volume for every local folder or file it names.
pip_passthrough() {
  mkdir -p "$WORK"
  local conf=$WORK/pip.conf
  python3 - "$conf" <<'PY' > "$WORK/pip-mounts"
import os, re, subprocess, sys
listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
settings = {}
for line in listed.splitlines():  # global.find-links='/opt/wheels'   :env:.cert='…'
    match = re.match(r"^[^.]*\.([a-z-]+)='(.*)'$", line)
    if match:
        settings[match.group(1)] = match.group(2)
with open(sys.argv[1], "w") as conf:
    conf.write("[global]\n" + "".join(f"{key} = {value}\n" for key, value in sorted(settings.items())))
paths = set()
for value in settings.values():
    for word in value.split():
        path = word.removeprefix("file://").rstrip("/")
        if path.endswith("/simple"):  # a local index: its pages link to files beside it (…/files/…)
            path = os.path.dirname(path)
        if path.startswith("/") and os.path.exists(path):
            paths.add(os.path.realpath(path) if os.path.isfile(path) else path)
for path in sorted(paths):
    print(path)
PY
  PIP_MOUNTS=(--volume "$PWD/$conf:/etc/pip.conf:ro")
  while read -r path; do PIP_MOUNTS+=(--volume "$path:$path:ro"); done < "$WORK/pip-mounts"
}

build() {
  pip_passthrough
  say "building $IMAGE on $BASE_IMAGE (pip config: $(tr '\n' ' ' < "$WORK/pip.conf"))"
  # --format docker keeps the Dockerfile's HEALTHCHECK (the OCI format has no place for it). TORCH_INDEX_URL empty:
  # PyTorch's CPU index is out of reach here; the CPU wheel comes from the local wheel folder pip is configured with.
  "${PODMAN[@]}" build --format docker --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg TORCH_INDEX_URL= \
    "${PIP_MOUNTS[@]}" --tag "$IMAGE" .
  "${PODMAN[@]}" image inspect "$IMAGE" --format 'built {{.Id}}: {{.Size}} bytes, user {{.Config.User}}, health {{.Config.Healthcheck.Test}}' >&2
}

check() {
  bash deploy/check/run_check.sh
}

case "${1:-all}" in
  tools) tools ;;
  base) base ;;
  build) build ;;
  check) check ;;
  all) tools; base; build; check ;;
  *) echo "usage: $0 [tools|base|build|check|all]" >&2; exit 2 ;;
esac
