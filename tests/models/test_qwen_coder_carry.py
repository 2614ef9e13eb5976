"""bench/gguf_parts.sh in more than two parts (Qwen2.5-Coder's 468.6 MiB file goes in 9), rejoined one call at a time
in any order, and bench/qwen_coder_gguf.sh's verify refusing a file that is not the pinned one."""

from __future__ import annotations

import os
import random
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def run(script: str, *args, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(BENCH / script), *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def test_a_file_over_two_parts_splits_into_as_many_as_it_needs_and_joins_in_any_order(tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(random.Random(0).randbytes(5 * 1024 * 1024 // 2 + 7))  # 2.5 MiB in parts of <= 1 MiB: 3
    split = run("gguf_parts.sh", "split", src, tmp_path / "carry", PART_MIB="1", PYTHON="false")
    assert split.returncode == 0, split.stderr
    assert sorted(p.name for p in (tmp_path / "carry").iterdir()) == ["1", "2", "3"]
    assert (tmp_path / "carry/2/model.gguf.parts").read_text().strip() == "3"
    (tmp_path / "carry/3/extra").mkdir()  # a part directory may carry folders of its own: join skips them
    for k, code in ((3, 3), (1, 3), (2, 0)):
        joined = run("gguf_parts.sh", "join", tmp_path / "dest", tmp_path / f"carry/{k}")
        assert joined.returncode == code, joined.stdout + joined.stderr
    assert "missing: 2" in run("gguf_parts.sh", "join", tmp_path / "d2", tmp_path / "carry/1",
                               tmp_path / "carry/3").stdout
    assert (tmp_path / "dest/model.gguf").read_bytes() == src.read_bytes()


def test_verify_refuses_a_file_that_is_not_the_pinned_one(tmp_path):
    fake = tmp_path / "fake.gguf"
    fake.write_bytes(b"GGUF" + bytes(100))
    result = run("qwen_coder_gguf.sh", "verify", fake)
    assert result.returncode == 2 and "expected 491400064" in result.stderr
