"""The served weights' bytes in this process's own memory (/metrics weight_bytes_owned): what shows whether a sync
mode keeps a second copy. Its CUDA half (0 once ipc maps the trainer's memory) runs in test_ipc_sync_gpu.py."""

from __future__ import annotations

import torch
from torch import nn

from tandemrl.serve.weight_memory import bytes_inside, owned_weight_bytes


def test_bytes_inside_counts_only_tensors_wholly_within_a_segment():
    segments = [(1000, 500), (4000, 100)]
    tensors = [(1000, 100), (1400, 100), (1450, 100), (4000, 100), (3000, 10), (999, 2)]
    # inside: 1000+100, 1400+100 (ends at 1500, the segment's end), 4000+100; outside: one overlapping the end,
    # one in no segment, one starting before a segment
    assert bytes_inside(tensors, segments) == 300
    assert bytes_inside(tensors, []) == 0


def test_cpu_weights_are_all_owned_and_tied_ones_count_once():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight  # tied: one tensor of 40 floats
    assert owned_weight_bytes(model) == 10 * 4 * 4
    model[1].weight = nn.Parameter(torch.zeros(10, 4, dtype=torch.bfloat16))  # untied, 2 bytes a value
    assert owned_weight_bytes(model) == 10 * 4 * 4 + 10 * 4 * 2


def test_metrics_report_the_served_weights_bytes(server):
    import httpx

    model = server.state.weights.model
    expected = sum(p.numel() * p.element_size() for p in model.parameters())
    lines = [line for line in httpx.get(server.url + "/metrics").text.splitlines()
             if line.startswith("tandemrl_weight_bytes_owned ")]
    assert len(lines) == 1 and lines[0].split()[1] == str(expected) and expected > 0
