#!/usr/bin/env bash
# bench/gpu_check.sh on a GPU machine without network that takes a checkout plus a few ignored folders per call,
# each call under 64 MiB (this workplace's device machine): the test GGUF (98 MB) and the wheels do not fit one
# call, so they travel in two, one after the other while the machine stays warm.
#
#     bash bench/gpu_carry.sh pack [CHECKOUT]   # here, with network: fills CHECKOUT/.gpu1 and CHECKOUT/.gpu2
#     bash bench/gpu_carry.sh stash .gpu1       # there, call 1: keeps what .gpu1 holds in STASH
#     bash bench/gpu_carry.sh unpack .gpu2      # there, call 2: joins the model (sha256 checked), then run
#     GPU_CHECK_PYTHON=python3 GPU_CHECK_WHEELS=/tmp/gpu-carry/wheels bash bench/gpu_check.sh
#
# .gpu1: wheels/ (bench/gpu_wheels.txt, for PY_VERSION [3.12] on manylinux x86-64), qwen.tiktoken.gz (the data
# folder's vocabulary, when CHECKOUT has one) and the first part of the test GGUF compressed with xz (86 of 94 MiB);
# .gpu2: the rest of it and the GGUF's sha256. The parts are cut so both folders weigh the same; pack refuses a
# folder over FOLDER_MIB [55] (the checkout itself travels too). Both folders go into the checkout's
# .git/info/exclude, so they travel only where a call names them. STASH [/tmp/gpu-carry] is outside the checkout:
# the machine keeps it between calls, while it stays warm.
set -euo pipefail
[ "${1:-}" = pack ] && CHECKOUT=$(cd "${2:-$(dirname "$0")/..}" && pwd)
cd "$(dirname "$0")/.."
GGUF=.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf
VOCAB=data/qwen.tiktoken
STASH=${STASH:-/tmp/gpu-carry}
PY_VERSION=${PY_VERSION:-3.12}
FOLDER_MIB=${FOLDER_MIB:-55}

pack() {  # pack CHECKOUT
    local checkout=$1 one two work
    one=$checkout/.gpu1 two=$checkout/.gpu2
    [ -s "$checkout/$GGUF" ] || { echo "gpu_carry: $checkout/$GGUF is missing (scripts/fetch_assets.sh)" >&2; exit 1; }
    rm -rf "$one" "$two"
    mkdir -p "$one/wheels" "$two"
    # Binary wheels only, for the machine's Python and platform (pip matches manylinux_2_N exactly: N listed).
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PY_VERSION" --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_31_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux1_x86_64 \
        -r bench/gpu_wheels.txt -d "$one/wheels"
    [ -s "$checkout/$VOCAB" ] && gzip -9 -c "$checkout/$VOCAB" > "$one/qwen.tiktoken.gz"
    (cd "$checkout" && sha256sum "$GGUF") > "$two/model.sha256"
    work=$(mktemp -d)
    xz -6 -T0 -c "$checkout/$GGUF" > "$work/model.xz"
    # Cut where the two folders weigh the same: part 1 fills .gpu1 up to half of everything.
    local xz_bytes one_bytes cut
    xz_bytes=$(stat -c %s "$work/model.xz")
    one_bytes=$(du -sb "$one" | cut -f1)
    cut=$(( (xz_bytes + one_bytes) / 2 - one_bytes ))
    [ "$cut" -gt 0 ] || cut=0
    head -c "$cut" "$work/model.xz" > "$one/model.xz.part1"
    tail -c +"$((cut + 1))" "$work/model.xz" > "$two/model.xz.part2"
    rm -rf "$work"
    local exclude folder mib
    exclude="$(git -C "$checkout" rev-parse --path-format=absolute --git-common-dir)/info/exclude"
    for folder in /.gpu1/ /.gpu2/; do
        grep -qxF "$folder" "$exclude" 2>/dev/null || echo "$folder" >> "$exclude"
    done
    for folder in "$one" "$two"; do
        mib=$(( $(du -sb "$folder" | cut -f1) / 1048576 ))
        echo "gpu_carry: $folder: $mib MiB ($(find "$folder" -type f | wc -l) files)"
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
    cp -r "$1"/. "$STASH"/
    echo "gpu_carry: stashed in $STASH: $(ls "$STASH" | tr '\n' ' ')($(du -sh "$STASH" | cut -f1))"
}

unpack() {  # unpack FOLDER: call 2, on the machine: the GGUF into .cache/models, the vocabulary into data/
    [ -s "$STASH/model.xz.part1" ] || { echo "gpu_carry: $STASH/model.xz.part1 is missing: call 1 (stash .gpu1) did not run on this machine, or it was given back in between" >&2; exit 1; }
    mkdir -p "$(dirname "$GGUF")"
    cat "$STASH/model.xz.part1" "$1/model.xz.part2" | unxz > "$GGUF.partial"
    local expected actual
    expected=$(cut -d' ' -f1 "$1/model.sha256") actual=$(sha256sum < "$GGUF.partial" | cut -d' ' -f1)
    [ "$actual" = "$expected" ] || { echo "gpu_carry: the joined GGUF's sha256 is $actual, not $expected" >&2; exit 1; }
    mv "$GGUF.partial" "$GGUF"
    if [ -s "$STASH/qwen.tiktoken.gz" ] && [ ! -s "$VOCAB" ]; then
        (umask 077 && mkdir -p "$(dirname "$VOCAB")")
        gzip -dc "$STASH/qwen.tiktoken.gz" > "$VOCAB"
    fi
    echo "gpu_carry: $GGUF joined, sha256 $actual as packed; wheels in $STASH/wheels ($(ls "$STASH/wheels" | wc -l))"
}

case "${1:-}" in
    pack) pack "$CHECKOUT" ;;
    stash) stash "${2:?stash FOLDER}" ;;
    unpack) unpack "${2:?unpack FOLDER}" ;;
    *) echo "usage: bash bench/gpu_carry.sh pack [CHECKOUT] | stash FOLDER | unpack FOLDER" >&2; exit 2 ;;
esac
