#!/usr/bin/env bash
# Here (CPU machine, package index reachable), from the repo root: downloads TRL 1.16.0, vLLM 0.26.0 and the
# packages they import that the GPU image lacks (CPython 3.12, x86-64 Linux), trims vLLM's wheel of two binaries
# this run never loads, packs one reproducible tar and splits it into parts of <= PART_MIB MiB (43 unless set: a
# device call carries at most 64 MiB, so a part travels beside .whl/ and the tree with a benchmark of ours). Output in .trlvllm/ (git-ignored: see README.md): wheels/, WHEELS.txt, parts/partNN, tar.sha256,
# NPARTS.
set -euo pipefail
KIT=.trlvllm
W=$KIT/wheels
P=$KIT/parts
rm -rf "$W" && mkdir -p "$W" "$KIT/download"
git check-ignore -q "$KIT" || echo "warning: $KIT/ is not git-ignored; add '/$KIT/' to .git/info/exclude before a device call"

# vLLM 0.26.0 is the newest vLLM that pins the image's torch (2.11.0; 0.27.0 pins 2.13.0) and TRL 1.16.0 accepts
# vllm>=0.22.0,<=0.31.0. The rest: what `import vllm` + LLM + the engine core + the GPU worker + Qwen2 + FlashAttention
# and `trl.GRPOTrainer` import that the image (KINDS.md's list) lacks, found by importing them with only the image's
# packages beside; versions within vLLM's and TRL's constraints (xgrammar 0.2.7: the newest that accepts the
# apache-tvm-ffi 0.1.10 vLLM pins). pydantic's set is the repo's .whl one, so tandemrl imports from the same site.
SPECS=(
  vllm==0.26.0 trl==1.16.0
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19                    # TRL (the image has accelerate, pandas, pyarrow)
  pydantic==2.14.3 pydantic_core==2.50.4 annotated_types==0.8.0 typing_inspection==0.4.5
  fastapi==0.136.3 starlette==1.10.0                                    # vllm.entrypoints (vLLM: fastapi<0.137)
  openai==3.54.0 jiter==0.19.0 distro==1.9.0 sniffio==1.3.1 openai_harmony==0.0.8
  httpx2==2.16.2 httpcore2==2.16.2                                      # openai 3.54 imports httpx2
  msgspec==0.22.0 pyzmq==27.3.0 cachetools==8.0.2 cbor2==6.3.0 blake3==1.0.11 setproctitle==1.3.8 ijson==3.6.0
  gguf==0.19.0 partial_json_parser==0.2.1.1.post7 pybase64==1.5.1
  llguidance==1.7.6 xgrammar==0.2.7 apache_tvm_ffi==0.1.10              # structured-output backends, imported eagerly
)
PLAT=()
for t in manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_26 manylinux_2_27 manylinux_2_28 manylinux_2_31 \
         manylinux1 manylinux_2_5; do PLAT+=(--platform "${t}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLAT[@]}" \
  --platform any -d "$KIT/download" "${SPECS[@]}" 2>&1 | grep -v "is ignored: it is neither" || true

# One wheel per pin into wheels/; vLLM's without FlashAttention 2 (123 MiB packed: on Hopper vLLM 0.26 runs FA3,
# fa_utils.get_flash_attn_version) and the Rust API-server binary vllm-rs (LLM.generate never starts it).
python3 - "$KIT/download" "$W" "${SPECS[@]}" <<'PY'
import re, shutil, sys, zipfile
src, dst, specs = sys.argv[1], sys.argv[2], sys.argv[3:]
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
want = {norm(n): v for n, v in (s.split("==") for s in specs)}
from pathlib import Path
found = {}
for f in sorted(Path(src).glob("*.whl")):
    name, ver = f.name.split("-")[:2]
    if want.get(norm(name)) == ver:
        found[norm(name)] = f
missing = sorted(set(want) - set(found))
if missing:
    sys.exit("MISSING wheels: " + " ".join(missing))
DROP = {"vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so", "vllm/vllm-rs"}
for key, f in found.items():
    if key != "vllm":
        shutil.copy(f, dst)
        continue
    with zipfile.ZipFile(f) as zin, zipfile.ZipFile(Path(dst) / f.name, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            if info.filename in DROP:
                continue
            data = zin.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                data = b"".join(l for l in data.splitlines(True) if l.split(b",")[0].decode() not in DROP)
            zout.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=6)
print(f"{len(found)} wheels, one per pin; vllm trimmed of {sorted(DROP)}")
PY

( cd "$W" && for f in *.whl; do echo "$(stat -c %s "$f") $(sha256sum "$f")"; done ) \
  | awk '{ printf "%8.2f MiB  %s  %s\n", $1 / 1048576, $2, $3 }' > "$KIT/WHEELS.txt"
cat "$KIT/WHEELS.txt"

TAR=$KIT/trl-vllm-wheels.tar
tar --sort=name --mtime='2026-07-25 00:00:00Z' --owner=0 --group=0 --numeric-owner --format=gnu -cf "$TAR" -C "$KIT" wheels
rm -rf "$P" && mkdir -p "$P"
split -b "${PART_MIB:-43}M" -d -a 2 "$TAR" "$P/part"
echo "$(sha256sum "$TAR" | cut -c1-64)  trl-vllm-wheels.tar" > "$P/tar.sha256"
ls "$P"/part[0-9][0-9] | wc -l > "$P/NPARTS"
awk -v b="$(stat -c %s "$TAR")" -v h="$(cut -c1-64 "$P/tar.sha256")" -v n="$(cat "$P/NPARTS")" \
  'BEGIN { printf "tar: %.1f MiB, sha256 %s, %d parts in .trlvllm/parts\n", b / 1048576, h, n }'
rm -f "$TAR"
