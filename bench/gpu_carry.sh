#!/usr/bin/env bash
# bench/gpu_check.sh on a GPU machine without network that takes a checkout plus a few ignored folders per call,
# each call under 64 MiB (this workplace's device machine): the test GGUF (94 MiB) and the packages do not fit one
# call, so they travel in two, one after the other while the machine stays warm.
#
#     bash bench/gpu_carry.sh pack [CHECKOUT]   # here, with network: fills CHECKOUT/.gpu1 and CHECKOUT/.gpu2
#     bash bench/gpu_carry.sh stash .gpu1       # there, call 1: keeps part 1 in STASH
#     bash bench/gpu_carry.sh unpack .gpu2      # there, call 2: unpacks both parts (sha256 checked), then run
#     GPU_CHECK_PYTHON=python3 GPU_CHECK_SITE=/tmp/gpu-carry/site bash bench/gpu_check.sh
#
# pack installs bench/gpu_wheels.txt's wheels (for PY_VERSION [3.12] on manylinux x86-64) into a folder here, and
# makes one xz-compressed tar of that folder (site/), the data folder's vocabulary (qwen.tiktoken, when CHECKOUT
# has one) and the test GGUF; it cuts it in two halves: .gpu1/carry.tar.xz.part1, and .gpu2/carry.tar.xz.part2
# with the GGUF's sha256. It refuses a folder over FOLDER_MIB [55] (the checkout itself travels too), and puts both
# folders into the checkout's .git/info/exclude, so they travel only where a call names them. STASH
# [/tmp/gpu-carry] is outside the checkout: the machine keeps it between calls while it stays warm.
set -euo pipefail
[ "${1:-}" = pack ] && CHECKOUT=$(cd "${2:-$(dirname "$0")/..}" && pwd)
cd "$(dirname "$0")/.."
GGUF=.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
VOCAB=data/qwen.tiktoken
STASH=${STASH:-/tmp/gpu-carry}
PY_VERSION=${PY_VERSION:-3.12}
FOLDER_MIB=${FOLDER_MIB:-55}
PLATFORMS=(--only-binary=:all: --python-version "$PY_VERSION" --implementation cp --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_31_x86_64
           --platform manylinux_2_34_x86_64 --platform manylinux1_x86_64)

pack() {  # pack CHECKOUT
    local checkout=$1 work folder mib exclude
    [ -s "$checkout/$GGUF" ] || { echo "gpu_carry: $checkout/$GGUF is missing (scripts/fetch_assets.sh)" >&2; exit 1; }
    work=$(mktemp -d)
    mkdir -p "$work/wheels" "$work/carry/$(dirname "$GGUF")"
    # Binary wheels for the machine's Python and platform (pip matches manylinux_2_N exactly: N listed), installed
    # as they are (--no-deps: the list is the whole set) into the folder that travels.
    python3 -m pip download -q --no-deps "${PLATFORMS[@]}" -r bench/gpu_wheels.txt -d "$work/wheels"
    python3 -m pip install -q --no-deps --no-compile "${PLATFORMS[@]}" --target "$work/carry/site" "$work/wheels"/*.whl
    rm -rf "$work/carry/site/bin"  # scripts with this machine's Python in their first line
    ln -s "$checkout/$GGUF" "$work/carry/$GGUF"
    if [ -s "$checkout/$VOCAB" ]; then mkdir -p "$work/carry/data" && ln -s "$checkout/$VOCAB" "$work/carry/$VOCAB"; fi
    tar -C "$work/carry" -chf - . | xz -6 -T0 > "$work/carry.tar.xz"
    rm -rf "$checkout/.gpu1" "$checkout/.gpu2"
    mkdir -p "$checkout/.gpu1" "$checkout/.gpu2"
    (cd "$checkout" && sha256sum "$GGUF") > "$checkout/.gpu2/model.sha256"
    local half=$(( ($(stat -c %s "$work/carry.tar.xz") + 1) / 2 ))
    head -c "$half" "$work/carry.tar.xz" > "$checkout/.gpu1/carry.tar.xz.part1"
    tail -c +"$((half + 1))" "$work/carry.tar.xz" > "$checkout/.gpu2/carry.tar.xz.part2"
    echo "gpu_carry: site/ $(du -sh "$work/carry/site" | cut -f1) from $(ls "$work/wheels" | wc -l) wheels ($(du -sh "$work/wheels" | cut -f1))"
    rm -rf "$work"
    exclude="$(git -C "$checkout" rev-parse --path-format=absolute --git-common-dir)/info/exclude"
    for folder in /.gpu1/ /.gpu2/; do
        grep -qxF "$folder" "$exclude" 2>/dev/null || echo "$folder" >> "$exclude"
    done
    for folder in "$checkout/.gpu1" "$checkout/.gpu2"; do
        mib=$(( $(du -sb "$folder" | cut -f1) / 1048576 ))
        echo "gpu_carry: $folder: $mib MiB ($(du -sb "$folder" | cut -f1) bytes)"
        [ "$mib" -lt "$FOLDER_MIB" ] || { echo "gpu_carry: $folder is over $FOLDER_MIB MiB" >&2; exit 1; }
    done
}

unxz() {  # stdin to stdout, decompressed: xz where it is installed, else Python's own lzma
    if command -v xz >/dev/null 2>&1; then xz -dc; else
        python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.stdin.buffer), sys.stdout.buffer)'
    fi
}

stash() {  # stash FOLDER: call 1, on the machine
    mkdir -p "$STASH"
    cp "$1/carry.tar.xz.part1" "$STASH/"
    echo "gpu_carry: stashed in $STASH: $(ls -l "$STASH" | tail -n +2)"
}

unpack() {  # unpack FOLDER: call 2, on the machine: site/ in STASH, the GGUF into .cache/models, the vocabulary
    [ -s "$STASH/carry.tar.xz.part1" ] || { echo "gpu_carry: $STASH/carry.tar.xz.part1 is missing: call 1 (stash .gpu1) did not run on this machine, or it was given back in between" >&2; exit 1; }
    rm -rf "$STASH/site" "$STASH/.cache" "$STASH/data"
    cat "$STASH/carry.tar.xz.part1" "$1/carry.tar.xz.part2" | unxz | tar -C "$STASH" -xf -
    local expected actual
    expected=$(cut -d' ' -f1 "$1/model.sha256") actual=$(sha256sum < "$STASH/$GGUF" | cut -d' ' -f1)
    [ "$actual" = "$expected" ] || { echo "gpu_carry: the unpacked GGUF's sha256 is $actual, not $expected" >&2; exit 1; }
    mkdir -p "$(dirname "$GGUF")"
    mv "$STASH/$GGUF" "$GGUF"
    if [ -s "$STASH/$VOCAB" ] && [ ! -s "$VOCAB" ]; then
        (umask 077 && mkdir -p "$(dirname "$VOCAB")")
        mv "$STASH/$VOCAB" "$VOCAB"
    fi
    echo "gpu_carry: $GGUF unpacked, sha256 $actual as packed; packages in $STASH/site ($(ls "$STASH/site" | wc -l) entries)"
}

case "${1:-}" in
    pack) pack "$CHECKOUT" ;;
    stash) stash "${2:?stash FOLDER}" ;;
    unpack) unpack "${2:?unpack FOLDER}" ;;
    *) echo "usage: bash bench/gpu_carry.sh pack [CHECKOUT] | stash FOLDER | unpack FOLDER" >&2; exit 2 ;;
esac
