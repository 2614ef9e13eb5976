"""The README's quickstart runs as written: every fenced block right after a `<!-- quickstart -->` line is executed,
in order, in one fresh directory (bash blocks with `bash -euo pipefail`, python blocks with the repository's
Python), offline, with the `tandemrl` entry point of this environment first on PATH."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MARKER = "<!-- quickstart -->"
BLOCK = re.compile(re.escape(MARKER) + r"\s*\n```(\w+)\n(.*?)\n```", re.DOTALL)
TIMEOUT_S = 600


def quickstart_blocks(text: str) -> list[tuple[str, str]]:
    """(language, code) of each marked block, in order."""
    return [(m.group(1), m.group(2)) for m in BLOCK.finditer(text)]


def test_quickstart_blocks_are_marked():
    text = README.read_text()
    blocks = quickstart_blocks(text)
    assert text.count(MARKER) == len(blocks), f"every {MARKER} line must be followed by a fenced code block"
    assert {lang for lang, _ in blocks} == {"bash", "python"}, "the quickstart shows the CLI and the Python API"
    for lang, code in blocks:
        assert lang in ("bash", "python"), f"a quickstart block in {lang!r}: only bash and python run"


@pytest.mark.slow  # three tandemrl processes and a Python run: about 2 minutes on a shared 2-core machine
def test_readme_quickstart_runs(tmp_path: Path):
    bin_dir = Path(sys.executable).parent  # the environment running the tests: its python and tandemrl
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
           "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    for n, (lang, code) in enumerate(quickstart_blocks(README.read_text()), 1):
        script = tmp_path / f"quickstart_{n}.{'sh' if lang == 'bash' else 'py'}"
        script.write_text(code + "\n")
        command = ["bash", "-euo", "pipefail", str(script)] if lang == "bash" else [sys.executable, str(script)]
        done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        assert done.returncode == 0, (
            f"README quickstart block {n} ({lang}) failed with exit code {done.returncode}:\n{code}\n"
            f"--- stdout ---\n{done.stdout[-4000:]}\n--- stderr ---\n{done.stderr[-4000:]}")
