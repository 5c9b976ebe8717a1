"""Every reported ratio agrees with its interval (issue 25, item 6).

The defects: `speedup` was a ratio of medians while its "95% CI" was the
per-round ratio's, so `mlp-small-dp8-quarter` × default read 1.18x
[1.08–1.16]; and "faster" came from the paired test alone, so a ratio whose
interval held 1 (moe dp8 quarter, 1.04x [0.98–1.09]) counted as a win.
"""

from __future__ import annotations

import runpy
import statistics
from pathlib import Path

import pytest

from shardsearch.bench import interval_problems, speedup, speedups
from shardsearch.search import faster_than

ROOT = Path(__file__).resolve().parent.parent


def _row(label, times, fingerprint=None):
    return {"label": label, "role": "expert", "status": "timed",
            "fingerprint": fingerprint or label, "times": list(times),
            "median_seconds": statistics.median(times)}


def test_the_point_estimate_is_the_median_per_round_ratio_inside_its_interval():
    # Medians 11 and 14: a ratio of medians would say 1.27x, above the
    # per-round ratio's interval [1.08, 1.20].
    winner = [12, 11, 10, 13, 10, 11, 13, 11, 13, 11, 13]
    ref = [14, 12, 12, 14, 10, 13, 14, 14, 14, 12, 14]
    s = speedup(_row("winner", winner), _row("fsdp", ref))
    assert statistics.median(ref) / statistics.median(winner) == pytest.approx(14 / 11)
    assert s["ratio_ci"] == pytest.approx([14 / 13, 12 / 10])
    assert s["speedup"] == pytest.approx(12 / 11)  # the median of the 11 ratios
    assert s["ratio_ci"][0] <= s["speedup"] <= s["ratio_ci"][1]
    assert s["verdict"] == "faster"


def test_faster_needs_the_whole_interval_above_one():
    # The paired test says faster, but the median ratio's interval holds 1.
    winner = [11, 11, 10, 11, 12, 10, 11, 11, 12, 10, 12, 12]
    ref = [11, 12, 12, 12, 13, 10, 11, 12, 12, 12, 12, 13]
    assert faster_than(winner, ref)
    s = speedup(_row("winner", winner), _row("fsdp", ref))
    assert s["ratio_ci"][0] <= 1 < s["speedup"] and s["verdict"] == "tie"
    clear = speedup(_row("winner", [1.0] * 10), _row("fsdp", [2.0] * 10))
    assert (clear["speedup"], clear["ratio_ci"], clear["verdict"]) == (2.0, [2.0, 2.0], "faster")
    slower = speedup(_row("winner", [2.0] * 10), _row("fsdp", [1.0] * 10))
    assert (slower["speedup"], slower["verdict"]) == (0.5, "slower")
    same = speedup(_row("winner", [1.0] * 10, "a"), _row("fsdp", [2.0] * 10, "a"))
    assert same["verdict"] == "same plan"


def test_the_checker_finds_each_kind_of_disagreement():
    plans = [_row("winner", [1.0] * 8), _row("fsdp", [1.1] * 8)]
    good = {"suite": "s", "entry": {"id": "e"}, "plans": plans, "speedups": speedups(plans)}
    assert interval_problems(good) == []
    outside = {**good, "speedups": {**good["speedups"], "vs_best_expert": {
        "speedup": 1.18, "ratio_ci": [1.08, 1.16], "verdict": "faster"}}}
    assert any("outside its interval" in p for p in interval_problems(outside))
    holds_one = {**good, "speedups": {**good["speedups"], "vs_best_expert": {
        "speedup": 1.04, "ratio_ci": [0.98, 1.09], "verdict": "faster"}}}
    assert any("'faster' with an interval" in p for p in interval_problems(holds_one))
    # Consistent on its face, but not what the plans' times give: stale.
    stale = {**good, "speedups": {**good["speedups"], "vs_best_expert": {
        "speedup": 1.2, "ratio_ci": [1.1, 1.3], "verdict": "faster"}}}
    assert any("not what its plans' times give" in p for p in interval_problems(stale))


def test_every_recorded_entry_agrees_with_its_intervals(capsys):
    check = runpy.run_path(str(ROOT / "benchmarks" / "intervals" / "check.py"))
    assert len(check["suite_folders"]()) >= 6  # the walk is not vacuous
    assert check["main"]([]) == 0, capsys.readouterr().out
