"""Issue 37's tables from one hold's files (bench/gpu_vllm_rows.sh): ours (bench.engine_throughput JSON) beside vLLM
0.20.2 (.peers/vllm/bench_vllm.py JSON lines), one row per shape and batch, with the ratio and our decode step
against the bandwidth floor; then prefill, per prompt length and batch: our 1-token run of fresh prompts
(`prefill_s` of every row of ours) beside vLLM's generate of one token (its rows with gen_len 1). Reads folders or
raw.tar.gz files; a shape only one side ran shows '-' on the other.

    python -m bench.vllm_rows_table bench/results/DIR/ours/raw.tar.gz bench/results/DIR/vllm-short/raw.tar.gz ...
"""

from __future__ import annotations

import argparse
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path


PREFILL_RUN_TOKENS = 2  # ours' prefill rows generate this many (bench.engine_throughput's least): not decode rows


@dataclass
class Row:
    arch: str
    prompt_len: int
    new_tokens: int
    batch: int
    ours_tok_s: float | None = None
    vllm_tok_s: float | None = None
    step_over_floor: float | None = None


@dataclass
class Prefill:
    arch: str
    prompt_len: int
    batch: int
    ours_s: float | None = None
    vllm_s: float | None = None


def _texts(path: Path) -> list[tuple[str, str]]:
    """(name, text) of every .json / .jsonl file under a folder or inside a .tar.gz."""
    if path.is_dir():
        return [(f.name, f.read_text()) for f in sorted(path.rglob("*.json*"))]
    with tarfile.open(path) as tar:
        return [(Path(m.name).name, tar.extractfile(m).read().decode()) for m in tar.getmembers()
                if m.isfile() and m.name.endswith((".json", ".jsonl"))]


def collect(paths: list[Path]) -> tuple[list[Row], list[Prefill]]:
    """The decode rows (prefill runs, vLLM's of one token and ours of PREFILL_RUN_TOKENS, not among them) and the
    prefill rows."""
    rows: dict[tuple, Row] = {}
    prefills: dict[tuple, Prefill] = {}

    def row(arch: str, prompt_len: int, new_tokens: int, batch: int) -> Row:
        key = (arch, prompt_len, new_tokens, batch)
        return rows.setdefault(key, Row(*key))

    def prefill(arch: str, prompt_len: int, batch: int) -> Prefill:
        return prefills.setdefault((arch, prompt_len, batch), Prefill(arch, prompt_len, batch))

    for path in paths:
        for name, text in _texts(path):
            if name.endswith(".jsonl"):  # vLLM: one line per batch, after an info line
                for line in text.splitlines():
                    r = json.loads(line)
                    if r.get("engine") != "vllm" or "batch" not in r:
                        continue
                    if r["gen_len"] == 1:
                        prefill(r["arch"], r["prompt_len"], r["batch"]).vllm_s = r["wall_s"]
                    else:
                        row(r["arch"], r["prompt_len"], r["gen_len"], r["batch"]).vllm_tok_s = r["tok_s"]
            else:
                r = json.loads(text)
                for e in r.get("engine", []):
                    prefill(r["arch"], r["prompt_len"], e["batch"]).ours_s = e["prefill_s"]
                    if r["new_tokens"] > PREFILL_RUN_TOKENS:
                        target = row(r["arch"], r["prompt_len"], r["new_tokens"], e["batch"])
                        target.ours_tok_s, target.step_over_floor = e["engine_tok_s"], e["step_over_floor"]
    return (sorted(rows.values(), key=lambda r: (r.prompt_len + r.new_tokens, r.arch, r.batch)),
            sorted(prefills.values(), key=lambda p: (p.prompt_len, p.arch, p.batch)))


def table(rows: list[Row]) -> str:
    def num(value: float | None, fmt: str) -> str:
        return "-" if value is None else format(value, fmt)

    lines = ["| arch | shape | batch | ours tok/s | vLLM tok/s | ours / vLLM | our decode step / floor |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        ratio = r.ours_tok_s / r.vllm_tok_s if r.ours_tok_s and r.vllm_tok_s else None
        lines.append(f"| {r.arch} | {r.prompt_len} + {r.new_tokens} | {r.batch} | {num(r.ours_tok_s, ',.0f')} | "
                     f"{num(r.vllm_tok_s, ',.0f')} | {num(ratio, '.2f')} | {num(r.step_over_floor, '.2f')} |")
    return "\n".join(lines)


def prefill_table(prefills: list[Prefill]) -> str:
    """Prompt lengths both sides ran, in ms, with vLLM's time over ours (above 1: ours is faster)."""
    lines = ["| arch | prompt | batch | ours prefill ms | vLLM prefill ms | vLLM / ours |",
             "| --- | --- | --- | --- | --- | --- |"]
    for p in prefills:
        if p.ours_s and p.vllm_s:
            lines.append(f"| {p.arch} | {p.prompt_len} | {p.batch} | {p.ours_s * 1e3:,.1f} | {p.vllm_s * 1e3:,.1f} | "
                         f"{p.vllm_s / p.ours_s:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("paths", type=Path, nargs="+", help="folders or raw.tar.gz files of one hold")
    args = parser.parse_args(argv)
    for path in args.paths:
        if not path.exists():
            parser.error(f"{path}: no such file or folder")
    rows, prefills = collect(args.paths)
    print(table(rows))
    print()
    print(prefill_table(prefills))


if __name__ == "__main__":
    main()
