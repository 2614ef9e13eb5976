#!/usr/bin/env bash
# On the GPU machine (device call, repo root as cwd): keeps the carried .tvparts/partNN in /root/tvparts; once all
# parts are there and the tar's sha256 matches, installs the wheels into /tmp/tvsite (no index, no dependency
# resolution) and smoke-imports vLLM and TRL. Exit 0 installed (now or before), 3 parts still missing, 5 sha256
# mismatch, 6 pip failed, 7 import failed. The machine keeps /root/tvparts only while it stays warm: call back to back.
set -uo pipefail
STORE=/root/tvparts
SITE=/tmp/tvsite
mkdir -p "$STORE"
[ -d .tvparts ] && cp -f .tvparts/* "$STORE"/
SHA=$(cut -c1-64 "$STORE/tar.sha256" 2>/dev/null) || { echo "no tar.sha256 carried yet"; exit 3; }
N=$(cat "$STORE/NPARTS")
if [ "$(cat "$SITE/.kit_sha256" 2>/dev/null)" = "$SHA" ]; then echo "already installed in $SITE"; exit 0; fi
have=$(ls "$STORE" | grep -c '^part[0-9][0-9]$')
echo "parts here: $(cd "$STORE" && ls part[0-9][0-9] | tr '\n' ' ')($have of $N)"
[ "$have" -ge "$N" ] || exit 3
cat "$STORE"/part[0-9][0-9] > /root/tv.tar
[ "$(sha256sum /root/tv.tar | cut -c1-64)" = "$SHA" ] || { echo "SHA256 MISMATCH"; exit 5; }
rm -rf /root/tvwheels "$SITE" && mkdir -p /root/tvwheels && tar -xf /root/tv.tar -C /root/tvwheels && rm /root/tv.tar
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" /root/tvwheels/wheels/*.whl \
  || { echo "pip install failed"; exit 6; }
# Declared requirements of the carried packages that the image + carried set do not meet (a lead, not a verdict).
PYTHONPATH=$SITE python3 - "$SITE" <<'PY'
import os, sys
from importlib import metadata
from packaging.requirements import Requirement
site = sys.argv[1]
for d in sorted(x for x in os.listdir(site) if x.endswith(".dist-info")):
    dist = metadata.Distribution.at(os.path.join(site, d))
    for r in map(Requirement, dist.requires or []):
        if r.marker is not None and not r.marker.evaluate({"extra": ""}):
            continue
        try:
            have = metadata.version(r.name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or not r.specifier.contains(have, prereleases=True):
            print(f"unmet: {dist.metadata['Name']} wants {r} -> {have or 'absent'}")
PY
PYTHONPATH=$SITE:$PWD VLLM_NO_USAGE_STATS=1 python3 -c "
import vllm, vllm.entrypoints.llm, vllm.v1.engine.core, vllm.v1.worker.gpu_model_runner, vllm.model_executor.models.qwen2
from vllm.vllm_flash_attn.flash_attn_interface import is_fa_version_supported
import openai, trl, trl.trainer.grpo_trainer, trl.generation.vllm_generation, bench.grpo_step
print('import ok: vllm', vllm.__version__, 'trl', trl.__version__, 'FA3', is_fa_version_supported(3))
" || { echo "smoke import failed"; exit 7; }
echo "$SHA" > "$SITE/.kit_sha256"
echo "INSTALLED in $SITE"
