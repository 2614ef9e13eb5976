# Sourced by the bench/gpu_multi*.sh device calls (after `cd` to the repository): the carried wheels, NVLink
# multicast off (the lent machines' rule, also in every process started from here), OUT_DIR, the GPUs, and
# `piece SECONDS NAME ARGS...`: one bench.multi_gpu run cut at SECONDS, its JSON in $OUT_DIR/multi_gpu_NAME.json
# (each launch at most $LAUNCH_TIMEOUT seconds, 100 unless set); `tp_decode SECONDS NAME ARGS...`: one 2-rank
# torchrun launch of bench.tp_decode at Qwen2.5-7B cut at SECONDS, its JSON in $OUT_DIR/NAME.json (status returned).
source bench/gpu_env.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
OUT_DIR=${OUT:-bench/out}
mkdir -p "$OUT_DIR"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c "import torch; print('torch', torch.__version__, 'nccl', torch.cuda.nccl.version())"

quiet() { grep -v "OMP_NUM_THREADS\|^\*\*\*\*\|Loading weights\|Writing model shards"; }

piece() {
    local seconds=$1 name=$2
    shift 2
    echo "=== $name (at most $seconds s) $(date +%T)"
    timeout --kill-after=15 "$seconds" python3 -m bench.multi_gpu --out "$OUT_DIR/multi_gpu_$name.json" \
        --launch-timeout "${LAUNCH_TIMEOUT:-100}" "$@" 2>&1 | quiet || echo "=== $name: exit status ${PIPESTATUS[0]}"
}

tp_decode() {
    local seconds=$1 name=$2
    shift 2
    echo "=== $name (at most $seconds s) $(date +%T)"
    timeout --kill-after=15 "$seconds" python3 -m torch.distributed.run --standalone --nproc-per-node=2 \
        -m bench.tp_decode --arch qwen2.5-7b --out "$OUT_DIR/$name.json" "$@" 2>&1 | quiet
    local status=${PIPESTATUS[0]}
    [ "$status" = 0 ] || echo "=== $name: exit status $status"
    return "$status"
}
