"""bench/realistic_step.py runs on a CPU with the tiny architecture (the GPU numbers come from the same script)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_realistic_step_reports_drawn_lengths_packed_and_padded(tmp_path):
    out = tmp_path / "realistic.json"
    subprocess.run([sys.executable, "-m", "bench.realistic_step", "--tiny", "--padded-too", "--out", str(out)],
                   cwd=ROOT, check=True, capture_output=True, timeout=300, text=True)
    result = json.loads(out.read_text())
    run = result["median"]
    assert result["model"] == "tiny" and run["update_s"] > 0 and run["padded_update_s"] > 0
    # each row stopped at its drawn length: the completions are not all as long as the cap
    assert run["completion_tokens"] == run["drawn_tokens"] < 2 * 4 * result["shape"]["cap"]
    assert run["trained_tokens"] == run["completion_tokens"] + 2 * 4 * 8  # + prompts, no padding
    assert run["padded_tokens"] > run["trained_tokens"] and 0 < result["padding_waste"] < 1
