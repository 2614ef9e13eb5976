"""bench/gguf_parts.sh: split a file into two carried parts under 64 MiB, rejoin them one call at a time, and refuse
a corrupted result."""

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gguf_parts.sh"


def run(*args, **env):
    return subprocess.run(["bash", str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def test_split_then_join_part_by_part_restores_the_file(tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(random.Random(0).randbytes(3_000_001))
    split = run("split", src, tmp_path / "carry", PYTHON="false")  # no wheel download in the test
    assert split.returncode == 0, split.stderr
    assert "could not fetch the gguf wheel" in split.stderr
    assert (tmp_path / "carry/1/model.gguf.part1").stat().st_size == 1_500_001
    first = run("join", tmp_path / "dest", tmp_path / "carry/1")
    assert first.returncode == 3 and "1 of 2 parts" in first.stdout
    second = run("join", tmp_path / "dest", tmp_path / "carry/2")
    assert second.returncode == 0, second.stderr
    assert (tmp_path / "dest/model.gguf").read_bytes() == src.read_bytes()
    assert hashlib.sha256(src.read_bytes()).hexdigest() in second.stdout


def test_a_corrupted_part_is_refused(tmp_path):
    src = tmp_path / "model.gguf"
    src.write_bytes(random.Random(1).randbytes(10_000))
    assert run("split", src, tmp_path / "carry", PYTHON="false").returncode == 0
    part = tmp_path / "carry/2/model.gguf.part2"
    data = part.read_bytes()
    part.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
    joined = run("join", tmp_path / "dest", tmp_path / "carry/1", tmp_path / "carry/2")
    assert joined.returncode == 2 and "does not match its sha256" in joined.stderr
