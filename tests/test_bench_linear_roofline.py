"""bench/linear_roofline.py: the floor of a layer's linear ops and the dispatch a given set of timings implies (the
GPU timings come from bench.kernel_sweep --parts linear)."""

import pytest

from bench.linear_roofline import LinearShape, ab_entry, choose, layer_shapes, markdown_table, metrics, peak_for

QWEN25_7B = dict(hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4)
H100 = peak_for("NVIDIA H100 80GB HBM3")


def test_peaks_by_device_name():
    assert (H100.bandwidth, H100.flops) == (3.35e12, 989e12)
    assert peak_for("NVIDIA H200").bandwidth == 4.8e12
    assert peak_for("NVIDIA H100 PCIe").bandwidth == 2.0e12  # not the SXM part's figure
    assert peak_for("NVIDIA A10G") is None


def test_layer_shapes_of_qwen25_7b():
    qkv, o, gate_up, down = layer_shapes(QWEN25_7B, 64, qkv_bias=True)
    assert (qkv.k, qkv.widths, qkv.has_bias) == (3584, (3584, 512, 512), True)
    assert (o.k, o.widths) == (3584, (3584,))
    assert (gate_up.k, gate_up.widths) == (3584, (18944, 18944))
    assert (down.k, down.widths) == (18944, (3584,))
    assert qkv.weight_bytes == 4608 * 3585 * 2  # the bias row counted with the weights


def test_floor_is_bandwidth_bound_at_decode_and_compute_bound_for_many_rows():
    gate_up = LinearShape("gate_up", 1, 3584, (18944, 18944))
    # 271.6 MB of weights at 3.35 TB/s, plus one input row and one output row
    assert gate_up.floor_us(H100) == pytest.approx((2 * 18944 * 3584 + 3584 + 18944) * 2 / 3.35e12 * 1e6)
    assert gate_up.floor_us(H100) == pytest.approx(81.08, abs=0.01)
    wide = LinearShape("down", 4096, 18944, (3584,))
    assert wide.floor_us(H100) == pytest.approx(2 * 4096 * 18944 * 3584 / 989e12 * 1e6)


def test_metrics_rates_and_share_of_the_floor():
    down = LinearShape("down", 64, 18944, (3584,))
    m = metrics(down, 50.0, H100)
    assert m["weight_tb_s"] == pytest.approx(3584 * 18944 * 2 / 50e-6 / 1e12, abs=1e-3)
    assert m["tflop_s"] == pytest.approx(2 * 64 * 18944 * 3584 / 50e-6 / 1e12, abs=0.01)
    assert m["x_floor"] == pytest.approx(50.0 / down.floor_us(H100), abs=1e-3)
    assert metrics(down, 50.0, None)["x_floor"] is None


@pytest.mark.parametrize("cublas, ours, winner, dispatch", [
    (10.0, 8.0, "ours", "ours"),
    (10.0, 9.9, "ours", "cublas"),  # a 1 % win is within noise: cuBLAS stays
    (8.0, 10.0, "cublas", "cublas"),
])
def test_choose(cublas, ours, winner, dispatch):
    choice = choose(cublas, ours)
    assert (choice["winner"], choice["dispatch"]) == (winner, dispatch)
    assert choice["by"] == pytest.approx(max(cublas, ours) / min(cublas, ours), abs=1e-3)


def test_ab_entry_proposes_the_faster_of_engine_and_swept_tiles():
    shape = LinearShape("gate_up", 64, 3584, (18944, 18944))
    engine = {"block_m": 64, "block_n": 64, "block_k": 128, "num_warps": 4, "num_stages": 2, "tma": False}
    swept = {**engine, "block_n": 32, "num_stages": 4}
    entry = ab_entry(shape, H100, cublas_us=110.0, ours_default_us=120.0, ours_best_us=95.0, best_tiles=swept,
                     default_tiles=engine)
    assert entry["choice"]["winner"] == "ours" and entry["proposed"] == "ours 64/32/128 w4 s4"
    assert entry["ours_best"]["us"] == 95.0 and entry["ours_default"]["us"] == 120.0
    slower_sweep = ab_entry(shape, H100, 110.0, 90.0, 95.0, swept, engine)  # the engine's tiles are our best
    assert slower_sweep["best_tiles"] == engine and slower_sweep["ours_best"]["us"] == 90.0
    lost = ab_entry(shape, H100, 80.0, 90.0, None, None, engine)
    assert lost["proposed"] == "cuBLAS" and lost["choice"]["by"] == pytest.approx(1.125)
    table = markdown_table([entry, lost])
    assert table.count("\n") == 3 and "| gate_up | 64 |" in table and "ours (1.16x) | ours |" in table
