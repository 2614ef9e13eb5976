#!/usr/bin/env bash
# Issue 15's numbers in one device call (about 3-5 minutes; each step has its own time limit, under 8 minutes
# in all):
#   1. installs the carried wheels (.whl/serve: FastAPI, uvicorn, httpx, openai, pydantic and what they need; the GPU
#      image lacks some of them) into /tmp/site and checks that every module the server, the bench and the tests
#      import loads;
#   2. tests/serve/test_ipc_sync_gpu.py: ipc sync between two processes on one GPU, one copy of the weights (must
#      PASS: a skip fails this step); tests/serve/test_warmup.py: the server's start-up warm-up captures every decode
#      graph bucket (its CUDA test must pass);
#   3. python -m bench.serve: Qwen2.5-0.5B architecture, random bf16 weights: push latency and the weights' GPU
#      memory per sync mode (inprocess, checkpoint, ipc, lora), 64 concurrent streaming clients against the server,
#      once on new connections and once on the warm-up's kept-alive ones (tokens/s, latency and TTFT p50/p99, the
#      client's share until each request was written; the server's own account from /metrics: waits for the
#      engine thread, arrival to first token sent, the engine's busy share and steps) vs the in-process engine.
#      Its table is printed;
#      serve.json (written after every stage, so a time-out keeps what was measured) and the servers' logs land in
#      $OUT.
# The call:  run  command "bash bench/gpu_serve.sh"  carry [".whl/serve"]  timeout_s 600  (kind nvidia-h100-x1)
# CPU check (here): SMOKE=1 WHEELS=<cp3XX wheels> PYTHON=<a python with torch, without the serve packages> \
#                   bash bench/gpu_serve.sh        (tiny model; the GPU test is then expected to skip)
# Env: PYTHON (python3), WHEELS (.whl/serve), SITE (/tmp/site), OUT, SMOKE (1: --cpu-smoke), BENCH_ARGS (more
# arguments for bench.serve, e.g. "--clients 32").
# The wheels: `bash bench/serve_wheels.sh` downloads those bench/serve_wheels.txt names into .whl/serve (README).
set -uo pipefail
PYTHON=${PYTHON:-python3}
WHEELS=${WHEELS:-.whl/serve}
SITE=${SITE:-/tmp/site}
OUT=${OUT:-bench/out/gpu_serve}
SMOKE=${SMOKE:-0}
mkdir -p "$OUT"
status=0

compgen -G "$WHEELS/*.whl" > /dev/null || { echo "no wheels in $WHEELS: carry [\".whl/serve\"] (README)"; exit 2; }
"$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$WHEELS"/*.whl > "$OUT/pip.log" 2>&1 || { cat "$OUT/pip.log"; echo "wheel install failed"; exit 1; }
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
timeout 60 "$PYTHON" - > "$OUT/env.txt" 2>&1 <<'EOF'
import importlib, platform, torch
modules = ["fastapi", "starlette", "uvicorn", "h11", "click", "httpx", "httpcore", "anyio", "sniffio", "idna",
           "certifi", "openai", "jiter", "httpx2", "httpcore2", "truststore", "pydantic", "pydantic_core",
           "annotated_types", "typing_inspection", "annotated_doc", "opentelemetry.trace", "typing_extensions",
           "transformers", "peft", "safetensors", "rich", "numpy", "pytest",
           "tandemrl.cli", "tandemrl.serve.app", "tandemrl.serve.server", "tandemrl.backends.server_backend",
           "tandemrl.sync.factory", "bench.serve"]
for name in modules:
    module = importlib.import_module(name)
    print(f"{name} {getattr(module, '__version__', '')} {getattr(module, '__file__', '')}")
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.cuda.is_available(),
      torch.cuda.get_device_name(0) if torch.cuda.is_available() else "")
EOF
if [[ $? -ne 0 ]]; then cat "$OUT/env.txt"; echo "an import failed (above): nothing measured"; exit 1; fi
tail -n 1 "$OUT/env.txt"

# 2. the GPU test: on a GPU it must pass, not skip (a missing package would skip it)
timeout -k 10 120 "$PYTHON" -m pytest -q -rs -p no:cacheprovider tests/serve/test_ipc_sync_gpu.py > "$OUT/ipc_test.log" 2>&1
tail -n 15 "$OUT/ipc_test.log"
if [[ $SMOKE == 1 ]]; then
    grep -qE "1 skipped" "$OUT/ipc_test.log" || { echo "ipc test: expected a skip without CUDA"; status=1; }
else
    grep -qE "^1 passed" "$OUT/ipc_test.log" && echo "ipc test PASSED" || { echo "ipc test did NOT pass"; status=1; }
fi

# 2b. the server's start-up warm-up (tandemrl/serve/warmup.py): on a GPU every decode bucket is captured and later
# batches of any size capture none; its CUDA test must pass, not skip
timeout -k 10 90 "$PYTHON" -m pytest -q -rs -p no:cacheprovider tests/serve/test_warmup.py > "$OUT/warmup_test.log" 2>&1
tail -n 5 "$OUT/warmup_test.log"
expected="^3 passed"
[[ $SMOKE == 1 ]] && expected="2 passed, 1 skipped"
grep -qE "$expected" "$OUT/warmup_test.log" && echo "warm-up test OK" || { echo "warm-up test: expected $expected"; status=1; }

# 3. the bench (its own stages go on when one fails; exit status 1 then)
smoke=()
[[ $SMOKE == 1 ]] && smoke=(--cpu-smoke)
# shellcheck disable=SC2086  # BENCH_ARGS is a list of arguments
timeout -k 10 270 "$PYTHON" -m bench.serve ${smoke[@]+"${smoke[@]}"} ${BENCH_ARGS:-} --out "$OUT/serve.json" > "$OUT/serve.log" 2>&1
bench_status=$?
grep -E "^stage " "$OUT/serve.log"
if grep -q "GiB, versions" "$OUT/serve.log"; then
    sed -n '/GiB, versions/,$p' "$OUT/serve.log"  # the table and the load numbers
else
    tail -n 30 "$OUT/serve.log"
fi
grep -h "warmed up" "$OUT"/server-*.log  # the servers' start-up warm-up (CUDA only)
grep -h "^serving " "$OUT"/server-*.log  # ends with uvicorn's loop + HTTP parser (uvloop + httptools when carried)
echo "bench.serve exit status $bench_status (0: every stage ran; 124: timed out, serve.json has the stages done)"
[[ $bench_status -eq 0 ]] || status=1
ls -l "$OUT"
exit $status
