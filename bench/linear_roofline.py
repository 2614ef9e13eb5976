"""The roofline of a decoder layer's linear ops and the dispatch a measurement implies (pure Python: no GPU, no torch).

bench.kernel_sweep times each op three ways (our kernel with the engine's tiles, the best tiles of a sweep, cuBLAS);
this module says what the hardware allows for that op (the floor: max(bytes / peak bandwidth, flops / peak FLOP/s)),
which implementation wins, by how much, and what the engine should dispatch to.
"""

from __future__ import annotations

from dataclasses import dataclass

ELEMENT_BYTES = 2  # bf16 weights and activations


@dataclass(frozen=True)
class Peak:
    """A device's datasheet peaks: HBM bandwidth (bytes/s) and dense bf16 tensor throughput (FLOP/s)."""

    bandwidth: float
    flops: float


# Matched in order against torch.cuda.get_device_name(): the PCIe H100 before the SXM one's plain "H100".
PEAKS: tuple[tuple[str, Peak], ...] = (
    ("H100 PCIe", Peak(2.0e12, 756e12)),
    ("H100", Peak(3.35e12, 989e12)),
    ("H200", Peak(4.8e12, 989e12)),
)


def peak_for(device_name: str) -> Peak | None:
    """The datasheet peaks of the named device, None for one not in PEAKS (the floor then goes unreported)."""
    return next((peak for key, peak in PEAKS if key in device_name), None)


@dataclass(frozen=True)
class LinearShape:
    """One linear op of a layer: `rows` inputs of length k against weights of `widths` output columns each
    (q/k/v: three; gate/up: two, read by one program)."""

    name: str
    rows: int
    k: int
    widths: tuple[int, ...]
    has_bias: bool = False

    @property
    def weight_bytes(self) -> int:
        return sum(self.widths) * (self.k + self.has_bias) * ELEMENT_BYTES

    @property
    def min_bytes(self) -> int:
        """What any implementation must move: the weights once, the input once, the output once (gate/up: one
        output, the SiLU product)."""
        out_cols = self.widths[0] if self.name == "gate_up" else sum(self.widths)
        return self.weight_bytes + self.rows * (self.k + out_cols) * ELEMENT_BYTES

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.k * sum(self.widths)

    def floor_us(self, peak: Peak) -> float:
        return max(self.min_bytes / peak.bandwidth, self.flops / peak.flops) * 1e6


def layer_shapes(config: dict, rows: int, qkv_bias: bool) -> list[LinearShape]:
    """The linear ops of one decoder layer of a Qwen2/Llama-style config (bench.grpo_step.ARCHITECTURES' keys);
    qkv_bias: whether q/k/v have biases (Qwen2's do)."""
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    return [
        LinearShape("qkv", rows, hidden, (heads * head_dim, kv_heads * head_dim, kv_heads * head_dim), qkv_bias),
        LinearShape("o", rows, heads * head_dim, (hidden,)),
        LinearShape("gate_up", rows, hidden, (inter, inter)),
        LinearShape("down", rows, inter, (hidden,)),
    ]


def metrics(shape: LinearShape, us: float, peak: Peak | None) -> dict:
    """µs per layer, TB/s of weight bytes, TFLOP/s and the time over the floor (None without a peak)."""
    return {
        "us": round(us, 3),
        "weight_tb_s": round(shape.weight_bytes / us / 1e6, 3),
        "tflop_s": round(shape.flops / us / 1e6, 2),
        "x_floor": round(us / shape.floor_us(peak), 3) if peak else None,
    }


def choose(cublas_us: float, ours_us: float, margin: float = 0.03) -> dict:
    """Which implementation wins and by how much (the loser's time over the winner's); the proposed dispatch is
    ours only where it beats cuBLAS by more than `margin`, a difference within run-to-run noise being no reason
    to run our kernel."""
    winner = "ours" if ours_us < cublas_us else "cublas"
    by = max(cublas_us, ours_us) / min(cublas_us, ours_us)
    dispatch = "ours" if ours_us * (1 + margin) < cublas_us else "cublas"
    return {"winner": winner, "by": round(by, 3), "dispatch": dispatch}


def tiles_label(tiles: dict | None) -> str:
    """block_m/n/k, warps, stages, and the kernel where it is not the plain-load one (`tma`)."""
    if not tiles:
        return "-"
    label = "{block_m}/{block_n}/{block_k} w{num_warps} s{num_stages}".format(**tiles)
    return label + (" tma" if tiles.get("tma") else "")


def markdown_table(entries: list[dict]) -> str:
    """One row per (op, rows) of kernel_sweep's `ab` entries: the three timings with their share of the floor."""
    def cell(m: dict | None) -> str:
        if m is None:
            return "-"
        return f"{m['us']:.2f} ({m['x_floor']:.2f}x)" if m["x_floor"] is not None else f"{m['us']:.2f}"

    lines = ["| op | rows | floor µs | cuBLAS µs (x floor) | ours, engine tiles | ours, best tiles | best tiles "
             "| cuBLAS TB/s, TFLOP/s | best ours TB/s, TFLOP/s | winner (by) | dispatch |",
             "|" + " --- |" * 11]
    for e in entries:
        cublas, best = e["cublas"], e.get("ours_best")
        rates = [f"{m['weight_tb_s']:.2f}, {m['tflop_s']:.1f}" if m else "-" for m in (cublas, best)]
        floor = f"{e['floor_us']:.2f}" if e["floor_us"] is not None else "-"
        choice = e["choice"]
        by = f"{choice['by']:.2f}x" if choice["by"] else "-"
        lines.append(f"| {e['op']} | {e['rows']} | {floor} | {cell(cublas)} | {cell(e.get('ours_default'))} "
                     f"| {cell(best)} | {tiles_label(e.get('best_tiles'))} | {rates[0]} | {rates[1]} "
                     f"| {choice['winner']} ({by}) | {choice['dispatch']} |")
    return "\n".join(lines)


def ab_entry(shape: LinearShape, peak: Peak | None, cublas_us: float, ours_default_us: float | None,
             ours_best_us: float | None, best_tiles: dict | None, default_tiles: dict | None) -> dict:
    """One (op, rows) result: the three timings' metrics, the floor, the winner and the proposed dispatch (our
    best tiles where ours is proposed). Our fastest is the better of the engine's tiles and the sweep's."""
    candidates = [(us, tiles) for us, tiles in ((ours_best_us, best_tiles), (ours_default_us, default_tiles))
                  if us is not None]
    fastest_us, fastest_tiles = min(candidates, key=lambda c: c[0]) if candidates else (None, None)
    choice = choose(cublas_us, fastest_us) if fastest_us is not None else \
        {"winner": "cublas", "by": None, "dispatch": "cublas"}
    return {
        "op": shape.name, "rows": shape.rows, "k": shape.k, "widths": list(shape.widths),
        "weight_mb": round(shape.weight_bytes / 1e6, 2), "gflop": round(shape.flops / 1e9, 3),
        "floor_us": round(shape.floor_us(peak), 3) if peak else None,
        "cublas": metrics(shape, cublas_us, peak),
        "ours_default": metrics(shape, ours_default_us, peak) if ours_default_us is not None else None,
        "default_tiles": default_tiles,
        "ours_best": metrics(shape, fastest_us, peak) if fastest_us is not None else None,
        "best_tiles": fastest_tiles,
        "choice": choice,
        "proposed": "cuBLAS" if choice["dispatch"] == "cublas" else f"ours {tiles_label(fastest_tiles)}",
    }
