#!/usr/bin/env bash
# Downloads the wheels of bench/serve_wheels.txt for the GPU machines (CPython 3.12, x86-64 Linux) into DEST
# (default .whl/serve, git-ignored), then checks that they form a complete set: a clean install of fastapi,
# uvicorn, httpx, openai and pydantic from them alone, with dependencies resolved. bench/gpu_serve.sh installs them
# there. Env: PYTHON (default python3), DEST, PY312 (a Python 3.12 for the check; skipped when there is none).
set -euo pipefail
PYTHON=${PYTHON:-python3}
DEST=${DEST:-.whl/serve}
mkdir -p "$DEST"
"$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --abi cp312 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    --platform any -d "$DEST" -r bench/serve_wheels.txt
count=$(find "$DEST" -maxdepth 1 -name '*.whl' | wc -l)
size=$(du -sm "$DEST" | cut -f1)
echo "$count wheels, $size MiB in $DEST"
PY312=${PY312:-python3.12}
if ! "$PY312" --version > /dev/null 2>&1; then
    echo "no python3.12 here: the completeness check is skipped"
    exit 0
fi
check=$(mktemp -d)
trap 'rm -rf "$check"' EXIT
PIP_CONFIG_FILE=/dev/null "$PY312" -m pip install -q --no-index --find-links "$DEST" --target "$check" \
    fastapi uvicorn httpx openai pydantic
PYTHONPATH=$check "$PY312" -c "import fastapi, uvicorn, httpx, openai, pydantic; print('complete for', \
'fastapi', fastapi.__version__, 'uvicorn', uvicorn.__version__, 'httpx', httpx.__version__, 'openai', \
openai.__version__, 'pydantic', pydantic.__version__)"
