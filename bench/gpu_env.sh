# Sourced by the bench/gpu_*.sh device calls: the carried wheels (.whl/: pydantic and what it needs, gguf; the GPU
# image has none) into /tmp/site, and the environment every run there wants.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
