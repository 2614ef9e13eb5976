# Sourced by the bench/gpu_*.sh device calls: the carried wheels (.whl/: pydantic and what it needs, gguf; the GPU
# image has none) into /tmp/site, and the environment every run there wants.
# (once: bench/gpu_parallel.sh installs before its jobs start and sets GPU_SITE_READY, so they do not race on it)
if [ -z "${GPU_SITE_READY:-}" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1

# logged_step <seconds> <name> <command...>: the command cut at <seconds>, its log in $OUT/raw/<name>.log, a line
# (exit status, seconds, TIMED OUT) appended to $SUMMARY
logged_step() {
    local seconds=$1 name=$2; shift 2
    local t0=$SECONDS
    timeout "$seconds" "$@" > "$OUT/raw/$name.log" 2>&1
    local rc=$?
    echo "- $name: rc $rc, $((SECONDS - t0)) s$([ $rc = 124 ] && echo ' (TIMED OUT)')" | tee -a "$SUMMARY"
}

# in_side <side> <command...>: the command run from this tree (new) or from the A/B base tree .ab/base (base),
# importing that tree's code
in_side() {
    local dir=$PWD; [ "$1" = base ] && dir=$PWD/.ab/base
    shift
    (cd "$dir" && PYTHONPATH=/tmp/site:$dir "$@")
}
