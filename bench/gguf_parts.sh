#!/usr/bin/env bash
# Move a GGUF file (e.g. SmolLM2-135M-Instruct.Q4_1.gguf, 93.8 MiB) to a GPU machine that accepts at most 64 MiB of
# extra files per call: split it into parts that each fit, send one part per call, reassemble there and check sha256.
#
#   bench/gguf_parts.sh split FILE.gguf [OUT=.carry/gguf]   # here: OUT/1/ and OUT/2/, each < 64 MiB
#       OUT/1 holds part 1, FILE.gguf.sha256 and the `gguf` wheel (the GPU machines lack that package);
#       OUT/2 holds part 2 and the sha256. OUT is git-ignored, so only what a call names in `carry` travels.
#   bench/gguf_parts.sh join DEST PART_DIR...               # there, once per call, with the part(s) carried
#       copies the parts into DEST (outside the carried paths, so they outlive the next call's carry),
#       installs the gguf wheel if `import gguf` fails, and once every part is in DEST writes DEST/FILE.gguf,
#       checks it against the sha256 and prints its path. Exit 0 = complete and verified, 3 = parts still missing.
#
# GPU, two calls on the same warm machine (a fresh machine starts with nothing):
#   call 1: carry [".carry/gguf/1"]  command: bench/gguf_parts.sh join runs/models .carry/gguf/1
#   call 2: carry [".carry/gguf/2"]  command: bench/gguf_parts.sh join runs/models .carry/gguf/2 && <train ...>
# Where packages go to a --target directory (PYTHONPATH=/tmp/site), set PIP_TARGET=/tmp/site for the wheel as well.
set -euo pipefail

PARTS=2
LIMIT=$((64 * 1024 * 1024))

die() { echo "gguf_parts: $*" >&2; exit 2; }

split_file() {
    local src=$1 out=${2:-.carry/gguf}
    [[ -f $src ]] || die "no such file: $src"
    local name size
    name=$(basename "$src")
    size=$(stat -c %s "$src")
    (( size < PARTS * (LIMIT - 2 * 1024 * 1024) )) || die "$src is $size bytes: more than $PARTS parts of < 64 MiB"
    rm -rf "$out/1" "$out/2"
    mkdir -p "$out/1" "$out/2"
    local chunk=$(( (size + PARTS - 1) / PARTS ))
    split -b "$chunk" -d -a 1 "$src" "$out/tmp.$name.part"
    mv "$out/tmp.$name.part0" "$out/1/$name.part1"
    mv "$out/tmp.$name.part1" "$out/2/$name.part2"
    (cd "$(dirname "$src")" && sha256sum "$name") > "$out/1/$name.sha256"
    cp "$out/1/$name.sha256" "$out/2/"
    local python=${PYTHON:-python3}
    "$python" -m pip download --no-deps --only-binary=:all: -d "$out/1" gguf >/dev/null \
        || echo "gguf_parts: could not fetch the gguf wheel; the GPU machine must have the gguf package" >&2
    for dir in "$out/1" "$out/2"; do
        local used
        used=$(du -sb "$dir" | cut -f1)
        (( used < LIMIT )) || die "$dir holds $used bytes, over 64 MiB"
        echo "$dir: $(ls "$dir" | tr '\n' ' ')($used bytes)"
    done
}

join_parts() {
    local dest=$1; shift
    mkdir -p "$dest"
    for dir in "$@"; do
        [[ -d $dir ]] || die "no such directory: $dir (was it named in carry?)"
        cp -f "$dir"/* "$dest"/
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
    local name
    name=$(basename "$sums" .sha256)
    local have=0
    for i in $(seq 1 $PARTS); do [[ -f $dest/$name.part$i ]] && have=$((have + 1)); done
    if (( have < PARTS )); then
        echo "gguf_parts: $have of $PARTS parts of $name in $dest; carry the next part directory and run join again"
        exit 3
    fi
    cat $(for i in $(seq 1 $PARTS); do echo "$dest/$name.part$i"; done) > "$dest/$name.tmp"
    mv "$dest/$name.tmp" "$dest/$name"
    (cd "$dest" && sha256sum --check --quiet "$name.sha256") || die "$dest/$name does not match its sha256"
    echo "$dest/$name: sha256 $(cut -d' ' -f1 "$sums") ok"
}

case ${1:-} in
    split) shift; [[ $# -ge 1 ]] || die "usage: $0 split FILE.gguf [OUT]"; split_file "$@" ;;
    join) shift; [[ $# -ge 2 ]] || die "usage: $0 join DEST PART_DIR..."; join_parts "$@" ;;
    *) die "usage: $0 split FILE.gguf [OUT] | join DEST PART_DIR..." ;;
esac
