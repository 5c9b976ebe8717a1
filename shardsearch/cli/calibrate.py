"""`shardsearch calibrate`: measure this machine's devices into a hardware model file.

Runs `cost.calibrate.calibrate` on a mesh of the devices at hand (or of
simulated CPU devices), prints the fitted throughputs and lines, and with
`--out` writes the JSON that `HardwareModel.load` and `optimize --hardware
FILE` read.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from .args import Command, UsageError, WorkFailed, device_count, positive_int, usage
from .optimize import axis_list, make_mesh, simulate_devices
from .render import axes, table


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mesh", required=True, metavar="AXES",
                   help="mesh axes as name=size pairs, e.g. dp=2,tp=4; the collectives are "
                        "fitted per group of these axes, for a mesh of these sizes")
    p.add_argument("--devices", type=device_count, metavar="N",
                   help="simulate N CPU devices (for trying meshes this machine lacks)")
    p.add_argument("--out", metavar="FILE",
                   help="write the model and the samples to this JSON file (read by "
                        "`optimize --hardware FILE` and HardwareModel.load)")
    p.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    p.add_argument("--dcn-axes", type=axis_list, default=(), metavar="AXES",
                   help="mesh axes whose devices sit on different hosts, e.g. dp; recorded "
                        "with the fits, which were measured per axis anyway (default: none)")
    p.add_argument("--sizes", metavar="BYTES,...",
                   help="collective message sizes, each the bytes of the collective's full "
                        "buffer per device, at least two, e.g. 4KiB,1MiB (default: "
                        "1KiB,16KiB,256KiB,2MiB,16MiB)")
    p.add_argument("--repeats", type=positive_int, default=5, metavar="N",
                   help="timed runs per program; the median counts (default 5)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def run(a: argparse.Namespace) -> int:
    # Before anything asks JAX for devices: the count is fixed at backend start.
    if a.devices is not None:
        simulate_devices(a.devices)
    from ..base.mesh import parse_mesh
    from ..cost.calibrate import DEFAULT_SIZES, axis_groups, calibrate
    from ..cost.topology import Topology

    dims, names = usage(parse_mesh, a.mesh)
    sizes = DEFAULT_SIZES if a.sizes is None else usage(_sizes, a.sizes)
    out = None if a.out is None else _out_path(a.out, a.force)
    mesh = make_mesh(dims, names)
    topology = usage(Topology.of, mesh, a.dcn_axes)
    if not axis_groups(topology):
        raise UsageError(f"--mesh {a.mesh}: every axis has size 1, so no collective moves "
                         "anything; calibrate a mesh with an axis of size 2 or more")
    n = mesh.devices.size
    print(f"calibrating {n} {mesh.devices.flat[0].platform} devices on mesh {axes(mesh)}",
          flush=True)
    progress = None if a.quiet else _Bar()
    try:
        result = calibrate(mesh, sizes=sizes,
                           repeats=a.repeats, dcn_axes=a.dcn_axes, progress=progress)
    except ValueError as err:  # calibrate checks its inputs before it measures
        raise UsageError(str(err)) from None
    except RuntimeError as err:  # XLA failing on the devices, nothing fitted
        raise WorkFailed(str(err)) from None
    finally:
        if progress is not None:
            progress.close()
    print(report(result))
    if out is not None:
        try:
            result.save(out)
        except OSError as err:
            raise WorkFailed(f"the calibration finished but {out} could not be written "
                             f"({err.strerror or err})") from None
        print(f"wrote {out}")
    return 0


def report(result: Any) -> str:
    """The fits as text: throughputs per device, then one row per (collective, axes)
    with how far its line misses its farthest sample (relative to that sample)."""
    model = result.model
    flops = "  ".join(f"{dtype} {value / 1e9:.3g} GFLOP/s"
                      for dtype, value in model.flops_per_second)
    lines = [f"{model.name}, measured in {result.seconds:.1f} s",
             f"matmul per device: {flops}",
             f"memory per device: {model.memory_bandwidth / 1e9:.3g} GB/s"]
    rows = [["collective", "axes", "latency", "bandwidth", "worst sample"]]
    for (kind, group), fit in model.fits:
        # How far the line misses its farthest sample: noise, or a poor line.
        off = max(((fit.seconds(s.bytes) - s.seconds) / s.seconds
                   for s in result.samples if (s.kind, s.axes) == (kind, group)),
                  key=abs, default=0.0)
        rows.append([kind, ",".join(group), f"{fit.latency * 1e6:.1f} us",
                     f"{fit.bandwidth / 1e9:.3g} GB/s", f"{off:+.0%}"])
    lines.append(table(rows, right=(2, 3, 4)))
    lines += [f"skipped: {note}" for note in result.skipped]
    return "\n".join(lines)


def _sizes(text: str) -> Any:
    from ..base.units import parse_bytes
    from ..cost.calibrate import DEFAULT_SIZES, Sizes

    messages = tuple(parse_bytes(part.strip()) for part in text.split(","))
    try:
        return Sizes(messages=messages, matmul=DEFAULT_SIZES.matmul,
                     memory=DEFAULT_SIZES.memory)
    except ValueError as err:
        raise ValueError(f"--sizes {text}: {err}") from None


def _out_path(text: str, force: bool) -> Path:
    """`--out`, checked before minutes of measuring: a file in a folder that exists
    and can be written, not one already there unless `--force`."""
    out = Path(text)
    if out.is_dir():
        raise UsageError(f"--out {out} is a directory; give a file name")
    folder = out.parent
    if not folder.is_dir():
        raise UsageError(f"--out {out}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--out {out}: the folder {folder} is not writable")
    if out.exists() and not force:
        raise UsageError(f"--out {out} exists; pass --force to overwrite it")
    return out


class _Bar:
    """A progress bar on stderr: one tick per program, the current one named."""

    def __init__(self) -> None:
        self.bar = None

    def __call__(self, done: int, total: int, label: str) -> None:
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, desc="calibrate", unit="program", leave=False,
                            file=sys.stderr)
        self.bar.update(done - self.bar.n)
        self.bar.set_postfix_str(label)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


COMMAND = Command("calibrate", "measure this machine's devices into a hardware model file",
                  add_arguments, run)
