#!/usr/bin/env bash
# Here, after .peers/vllm/fetch_wheels.sh: cut vLLM's wheel tar into smaller parts than the kit's 56 MiB, so that a
# part still travels beside this working tree (tracked files, 11 MiB by now) under the device's 64 MiB a call.
#   bash bench/vllm_resplit.sh [MiB]     (default 50: six parts; install with install_on_device.sh 6)
# The parts join back into the same tar: tar.sha256 stays valid.
set -euo pipefail
MIB=${1:-50}
P=.vllm/parts
[ -f "$P/tar.sha256" ] || { echo "no $P/tar.sha256: run .peers/vllm/fetch_wheels.sh first" >&2; exit 2; }
TAR=$(mktemp)
cat "$P"/part[0-9][0-9] > "$TAR"
[ "$(sha256sum "$TAR" | cut -c1-64)" = "$(cut -c1-64 "$P/tar.sha256")" ] || { echo "the parts do not match tar.sha256" >&2; exit 1; }
rm -f "$P"/part[0-9][0-9]
split -b "${MIB}M" -d -a 2 "$TAR" "$P/part"
rm -f "$TAR"
ls "$P"/part[0-9][0-9] | wc -l | tee "$P/NPARTS"
