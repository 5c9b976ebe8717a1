"""The built-in chips' figures, pinned to the published ones (issue 25, item 8).

Each row is the figure `../shared/ANCHORS.md` gives with its source; where the
sources disagree, the range they span. A constant edited by mistake (a GiB
for a GB, a bidirectional bandwidth for a one-way one) fails here, not in an
estimate nobody checks.
"""

from __future__ import annotations

import pytest

import shardsearch as ss

GiB, GB = 2**30, 10**9

# chip: bf16 FLOP/s, HBM bytes, HBM bandwidth (low, high), link inside the
# slice/node one way, across (None: no published figure), torus
PUBLISHED = {
    "tpu-v4": (2.75e14, 32 * GiB, (1.2e12, 1.2e12), 4.5e10, None, True),
    "tpu-v5e": (1.97e14, 16 * GiB, (8.1e11, 8.19e11), 4.5e10, 3.1e9, True),
    "tpu-v5p": (4.59e14, 95 * GiB, (2.5e12, 2.8e12), 9e10, 6.25e9, True),
    "gpu-h100": (9.89e14, 80 * GB, (3.35e12, 3.35e12), 4.5e11, None, False),
    "gpu-h200": (9.89e14, 141 * GB, (4.8e12, 4.8e12), 4.5e11, None, False),
}


@pytest.mark.parametrize("chip", sorted(PUBLISHED))
def test_a_named_chip_has_its_published_figures(chip):
    flops, memory, (low, high), ici, dcn, torus = PUBLISHED[chip]
    model = ss.HARDWARE[chip]
    data = model.to_json()
    assert data["flops_per_second"]["bf16"] == flops
    assert model.memory_bytes == memory
    assert low <= model.memory_bandwidth <= high
    assert data["ici"]["bandwidth"] == ici and data["ici"]["torus"] is torus
    if dcn is not None:
        assert data["dcn"]["bandwidth"] == dcn
    assert data["about"]["source"]  # every model names where its figures come from


def test_f32_matmuls_are_priced_at_tf32_on_gpus_and_bf16_passes_on_tpus():
    # H100/H200: TF32 tensor cores, 4.95e14 dense (NVIDIA datasheets; the
    # non-tensor-core fp32 6.7e13 of ANCHORS.md is not what XLA's dots use).
    for chip in ("gpu-h100", "gpu-h200"):
        assert ss.HARDWARE[chip].to_json()["flops_per_second"]["f32"] == 4.95e14
    for chip in ("tpu-v4", "tpu-v5e", "tpu-v5p"):
        rates = ss.HARDWARE[chip].to_json()["flops_per_second"]
        assert rates["f32"] == rates["bf16"]  # XLA:TPU runs f32 matmuls as bf16 passes


def test_the_v5e_torus_wraps_only_from_16_chips_an_axis():
    # Cloud TPU v5e slices below 16 chips an axis have no wraparound links.
    assert ss.HARDWARE["tpu-v5e"].to_json()["ici"]["wraparound_from"] == 16
    assert ss.HARDWARE["tpu-v5p"].to_json()["ici"]["wraparound_from"] == 0
