#!/usr/bin/env bash
# Move a GGUF file to a GPU machine that accepts at most 64 MiB of files per call (the working tree included):
# split it into parts of at most PART_MIB (default 56) MiB, send one part per call, reassemble there, check sha256.
#
#   bench/gguf_parts.sh split FILE.gguf [OUT=.carry/gguf]   # here: OUT/1/ ... OUT/N/, N = max(2, ceil(size/PART_MIB))
#       every OUT/K holds part K, FILE.gguf.sha256 and FILE.gguf.parts (N); OUT/1 also the `gguf` wheel (the GPU
#       machines lack that package). OUT is git-ignored, so only what a call names in `carry` travels.
#       SmolLM2-135M (93.8 MiB) gives 2 parts, Qwen2.5-Coder-0.5B (468.6 MiB) 9.
#   bench/gguf_parts.sh join DEST PART_DIR...               # there, once per call, with the part(s) carried
#       copies the parts' files into DEST (outside the carried paths, so they outlive the next call's carry),
#       installs the gguf wheel if `import gguf` fails, and once every part is in DEST writes DEST/FILE.gguf,
#       checks it against the sha256 and prints its path. Exit 0 = complete and verified, 3 = parts still missing.
#
# GPU, N calls on the same warm machine (a fresh machine starts with nothing):
#   call K < N: carry [".carry/gguf/K"]  command: bench/gguf_parts.sh join runs/models .carry/gguf/K   (exit 3)
#   call N:     carry [".carry/gguf/N"]  command: bench/gguf_parts.sh join runs/models .carry/gguf/N && <train ...>
# Where packages go to a --target directory (PYTHONPATH=/tmp/site), set PIP_TARGET=/tmp/site for the wheel as well.
set -euo pipefail

PART_MIB=${PART_MIB:-56}
MIB=$((1024 * 1024))

die() { echo "gguf_parts: $*" >&2; exit 2; }

split_file() {
    local src=$1 out=${2:-.carry/gguf}
    [[ -f $src ]] || die "no such file: $src"
    local name size parts chunk
    name=$(basename "$src")
    size=$(stat -c %s "$src")
    parts=$(( (size + PART_MIB * MIB - 1) / (PART_MIB * MIB) ))
    (( parts >= 2 )) || parts=2
    chunk=$(( (size + parts - 1) / parts ))
    rm -rf "$out"
    mkdir -p "$out"
    split -b "$chunk" -d -a 3 "$src" "$out/tmp.$name.part"
    local sums
    sums=$(cd "$(dirname "$src")" && sha256sum "$name")
    for k in $(seq 1 "$parts"); do
        mkdir -p "$out/$k"
        mv "$out/tmp.$name.part$(printf %03d $((k - 1)))" "$out/$k/$name.part$k"
        echo "$sums" > "$out/$k/$name.sha256"
        echo "$parts" > "$out/$k/$name.parts"
    done
    local python=${PYTHON:-python3}
    "$python" -m pip download --no-deps --only-binary=:all: -d "$out/1" gguf >/dev/null \
        || echo "gguf_parts: could not fetch the gguf wheel; the GPU machine must have the gguf package" >&2
    for k in $(seq 1 "$parts"); do
        local used
        used=$(du -sb "$out/$k" | cut -f1)
        (( used < (PART_MIB + 2) * MIB )) || die "$out/$k holds $used bytes, over $((PART_MIB + 2)) MiB"
        echo "$out/$k: $(ls "$out/$k" | tr '\n' ' ')($used bytes)"
    done
}

join_parts() {
    local dest=$1; shift
    mkdir -p "$dest"
    for dir in "$@"; do
        [[ -d $dir ]] || die "no such directory: $dir (was it named in carry?)"
        find "$dir" -maxdepth 1 -type f -exec cp -f {} "$dest"/ \;  # files only: a part dir may carry more
    done
    local python=${PYTHON:-python3}
    if ! "$python" -c "import gguf" 2>/dev/null; then
        local wheel
        wheel=$(ls "$dest"/gguf-*.whl 2>/dev/null | head -n 1 || true)
        [[ -n $wheel ]] || die "the gguf package is missing and no gguf wheel was carried (it comes with part 1)"
        "$python" -m pip install --no-deps --no-index --quiet "$wheel"  # honours PIP_TARGET=/tmp/site
    fi
    local sums
    sums=$(ls "$dest"/*.sha256 2>/dev/null | head -n 1 || true)
    [[ -n $sums ]] || die "no .sha256 file in $dest: carry a part directory made by '$0 split'"
    local name parts have=0
    name=$(basename "$sums" .sha256)
    parts=2  # parts made before the .parts file existed: always two
    [[ -f $dest/$name.parts ]] && parts=$(cat "$dest/$name.parts")
    for i in $(seq 1 "$parts"); do [[ -f $dest/$name.part$i ]] && have=$((have + 1)); done
    if (( have < parts )); then
        local missing
        missing=$(for i in $(seq 1 "$parts"); do [[ -f $dest/$name.part$i ]] || echo -n "$i "; done)
        echo "gguf_parts: $have of $parts parts of $name in $dest (missing: $missing); carry the next part" \
             "directory and run join again"
        exit 3
    fi
    cat $(for i in $(seq 1 "$parts"); do echo "$dest/$name.part$i"; done) > "$dest/$name.tmp"
    mv "$dest/$name.tmp" "$dest/$name"
    (cd "$dest" && sha256sum --check --quiet "$name.sha256") || die "$dest/$name does not match its sha256"
    echo "$dest/$name: sha256 $(cut -d' ' -f1 "$sums") ok"
}

case ${1:-} in
    split) shift; [[ $# -ge 1 ]] || die "usage: $0 split FILE.gguf [OUT]"; split_file "$@" ;;
    join) shift; [[ $# -ge 2 ]] || die "usage: $0 join DEST PART_DIR..."; join_parts "$@" ;;
    *) die "usage: $0 split FILE.gguf [OUT] | join DEST PART_DIR..." ;;
esac
