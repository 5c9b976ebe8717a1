"""Benchmark suite files: what hardware a suite is for and its entries.

A suite is a JSON file (fields in the repository's `benchmarks/README.md`).
The suites shipped with shardsearch are package data, `shardsearch/bench/
suites/<name>.json`, found with `importlib.resources` whatever the current
folder; `load_suite` also takes a path to any suite file, or a name looked up
in a folder the caller names. It reads and checks the file, naming the file
and the entry in every error. `prepare_devices` makes JAX's devices the
suite's (simulating CPU devices when it asks) or refuses. The runner
(`runner.run_suite`) runs it.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import math
import os
from collections.abc import Mapping, Sequence
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

import jax

from ..base import mesh as _mesh
from ..base.jsonfile import read_json
from ..base.limits import check_simulated_devices
from ..base.target import TARGET_CHIPS
from ..base.units import parse_bytes
from ..cost.chips import HARDWARE
from ..search.evaluation.confirm import MIN_ROUNDS
from ..search.evaluation.objectives import OBJECTIVES
from ..search.space.logical import SPACES
from ..workloads._custom import CUSTOM, custom_workload
from .published import Published

# The shipped suites: `<name>.json` files in this package's `suites` folder.
BUILTIN_SUITES = "suites"
PLATFORMS = ("cpu", "gpu", "tpu")
# A quarter of what the replicated plan needs per device (`runner.resolve_budget`):
# plain data parallelism does not fit, so the plan must shard the parameters.
QUARTER = "quarter"
# For an entry with a `published` run: the chip's memory, or what the published
# plan needs here (XLA's figures for CPU devices) when that is more; the plan
# ran on the chip, so CPU figures above the chip's memory overstate the chip's.
PUBLISHED = "published"
_ENTRY_KEYS = ("id", "workload", "size", "mesh", "trials", "timeout", "budget", "objective",
               "seed", "space", "spec", "hardware", "dcn_axes", "published", "knobs")
# Fields entries of the first suites never had: recorded only when set, so
# those suites' entry files keep their form.
OPTIONAL_KEYS = ("spec", "hardware", "dcn_axes", "published", "knobs")
_SUITE_KEYS = ("schema", "suite", "description", "platform", "devices", "simulated", "hardware",
               "timing", "entries", "target")
_TIMING_KEYS = ("warmup", "repeats", "rounds")


@dataclasses.dataclass(frozen=True)
class Entry:
    """One benchmark: a workload on a mesh with a search budget.

    Attributes:
      id: unique in its suite; names the result and rule files.
      workload, size: a built-in workload and its preset ("gpt", "small").
      mesh: axes as `name=size` pairs, e.g. "dp=2,tp=4" (no -1).
      trials: trials of the search, baselines included (None: until `timeout`).
      timeout: seconds of search (None: until `trials`); per run of the entry.
      budget: per-device bytes, a size such as "16GiB", "quarter" (a quarter of
        the replicated plan's XLA total per device, `runner.resolve_budget`),
        "published" (the chip's memory, or the published plan's XLA total here
        when larger; entries with `published` only), or None.
      objective: "measured" or "static".
      seed: the sampler's and the workload's seed.
      space: the search space, "rules", "logical" or "both" (`optimize(space=...)`).
      spec: for size "custom" only: the shape, `(key, value)` pairs of
        `workloads.get_workload("llama:custom", **sizes)` (a JSON object in the file).
      hardware: the static objective's model for this entry, a key of
        `HARDWARE`; None: the suite's `hardware`.
      dcn_axes: mesh axes that cross hosts (`optimize(dcn_axes=...)`).
      published: a measured run to compare with (`bench.published.Published`);
        None for an ordinary entry.
      knobs: the workload's step knobs the search chooses too
        (`optimize(knobs=...)`): true for all, or a list of their names;
        None (left out) for none.

    Example: `Entry("gpt-dp2-tp4", "gpt", "small", "dp=2,tp=4", trials=40)`.
    """

    id: str
    workload: str
    size: str
    mesh: str
    trials: int | None = 40
    timeout: float | None = None
    budget: int | str | None = None
    objective: str = "measured"
    seed: int = 0
    space: str = "both"
    spec: tuple[tuple[str, Any], ...] | None = None
    hardware: str | None = None
    dcn_axes: tuple[str, ...] = ()
    published: Published | None = None
    knobs: bool | tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("id", "workload", "size", "mesh"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string, got {value!r}")
        if not all(c.isalnum() or c in "-_." for c in self.id):
            raise ValueError(f"id {self.id!r} may hold only letters, digits, '-', '_' and "
                             "'.' (it names files)")
        dims, _names = _mesh.parse_mesh(self.mesh)
        if -1 in dims:
            raise ValueError(f"mesh {self.mesh!r}: give every axis size (no -1)")
        for name, low in (("trials", 1), ("seed", 0)):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                      or value < low):
                raise ValueError(f"{name} must be a whole number >= {low}, got {value!r}")
        if self.timeout is not None and not (isinstance(self.timeout, int | float)
                                             and self.timeout > 0):
            raise ValueError(f"timeout must be positive seconds, got {self.timeout!r}")
        if self.trials is None and self.timeout is None:
            raise ValueError("give trials or timeout (or both): the search needs a limit")
        if self.budget is not None and self.budget not in (QUARTER, PUBLISHED):
            parse_bytes(self.budget)
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective {self.objective!r}; choose one of {tuple(OBJECTIVES)}")
        if self.space not in SPACES:
            raise ValueError(f"space {self.space!r}; choose one of {SPACES}")
        if (self.spec is not None) != (self.size == CUSTOM):
            raise ValueError(f"size {self.size!r} with spec {self.spec!r}: give a spec (the "
                             f"shape's sizes) exactly when the size is {CUSTOM!r}")
        if self.spec is not None:
            spec = dict(self.spec)
            object.__setattr__(self, "spec", tuple(spec.items()))
            custom_workload(self.workload, spec, "spec")  # checks it; builds no arrays
        if self.hardware is not None and self.hardware not in HARDWARE:
            raise ValueError(f"hardware {self.hardware!r}; choose one of {tuple(HARDWARE)} "
                             "or leave it out for the suite's")
        object.__setattr__(self, "dcn_axes", tuple(self.dcn_axes))
        names = _mesh.parse_mesh(self.mesh)[1]
        stray = [a for a in self.dcn_axes if a not in names]
        if stray:
            raise ValueError(f"dcn_axes names {stray[0]!r}, not an axis of mesh {self.mesh!r}")
        if self.published is not None and not isinstance(self.published, Published):
            object.__setattr__(self, "published", Published.from_json(self.published))
        knobs = self.knobs
        if isinstance(knobs, list | tuple):
            if not knobs or not all(isinstance(k, str) and k for k in knobs):
                raise ValueError(f"knobs {knobs!r}: give true, or a non-empty list of the "
                                 "workload's knob names")
            object.__setattr__(self, "knobs", tuple(knobs))
        elif knobs not in (None, True, False):
            raise ValueError(f"knobs {knobs!r}: give true (every knob the workload declares) "
                             "or a list of knob names, e.g. [\"remat\"]")
        if self.budget == PUBLISHED and self.published is None:
            raise ValueError(f"budget {PUBLISHED!r} needs a 'published' run to take the plan "
                             "from; give one, or another budget")

    @property
    def workload_name(self) -> str:
        """The name `get_workload` takes, e.g. "gpt:small" (for a custom shape,
        the name that spells it: 'llama:custom:{"layers":32,...}')."""
        if self.spec is not None:
            return custom_workload(self.workload, dict(self.spec)).name
        return f"{self.workload}:{self.size}"

    def to_json(self) -> dict[str, Any]:
        """The entry as its file gives it; the optional fields only when set."""
        out = dataclasses.asdict(self)
        out["spec"] = dict(self.spec) if self.spec is not None else None
        out["dcn_axes"] = list(self.dcn_axes)
        out["published"] = self.published.to_json() if self.published else None
        out["knobs"] = list(self.knobs) if isinstance(self.knobs, tuple) else self.knobs
        for key in OPTIONAL_KEYS:
            if not out[key]:
                del out[key]
        return out

    @property
    def devices(self) -> int:
        """Devices the mesh uses."""
        return math.prod(_mesh.parse_mesh(self.mesh)[0])


@dataclasses.dataclass(frozen=True)
class Suite:
    """A suite file: the hardware it is for and its entries, in order.

    Attributes:
      name: the suite's name ("cpu-sim8").
      path: the file it was read from (a package resource for a shipped suite).
      platform: "cpu", "gpu" or "tpu": what `jax.devices()` must report.
      devices: how many devices JAX must have.
      simulated: CPU devices simulated by the runner (`jax_num_cpu_devices`);
        such entries are also timed on one device for reference.
      entries: the entries.
      hardware: the static objective's model of the hardware planned for, a
        key of `cost.hardware.HARDWARE` ("tpu": v5e-class); None: the devices' own.
      warmup, repeats: untimed and timed steps per candidate in the search.
      rounds: interleaved rounds of the comparison run.
      description: one paragraph for people.
      target: compile every entry for its chip (`hardware`) with the chip's
        own compiler, deviceless (`base.target.target_mesh`), instead of for
        this machine's devices; static entries only.
    """

    name: str
    path: Path | Traversable
    platform: str
    devices: int
    simulated: bool
    entries: tuple[Entry, ...]
    warmup: int = 2
    repeats: int = 7
    rounds: int = 20
    description: str = ""
    hardware: str | None = None
    target: bool = False

    def __post_init__(self) -> None:
        where = f"suite file {self.path}"
        if not isinstance(self.name, str) or not self.name or not all(
                c.isalnum() or c in "-_." for c in self.name):
            raise ValueError(f"{where}: suite name {self.name!r} must be letters, digits, '-', "
                             "'_' or '.' (it names the results folder)")
        if self.platform not in PLATFORMS:
            raise ValueError(f"{where}: platform {self.platform!r}; choose one of {PLATFORMS}")
        if self.hardware is not None and self.hardware not in HARDWARE:
            raise ValueError(f"{where}: hardware {self.hardware!r}; choose one of "
                             f"{tuple(HARDWARE)} or leave it out")
        if self.simulated and self.platform != "cpu":
            raise ValueError(f"{where}: only cpu devices can be simulated; set "
                             "\"simulated\": false or \"platform\": \"cpu\"")
        # rounds: the winner's re-timing takes them too, and under MIN_ROUNDS it
        # could never call a searched plan faster than a baseline.
        for name, low in (("devices", 1), ("warmup", 0), ("repeats", 1),
                          ("rounds", MIN_ROUNDS)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ValueError(f"{where}: {name} must be a whole number >= {low}, got "
                                 f"{value!r}")
        if self.simulated:
            check_simulated_devices(self.devices, f"{where}: devices")
        seen: set[str] = set()
        for i, entry in enumerate(self.entries):
            at = f"{where}: entry {i} ({entry.id!r})"
            if entry.id in seen:
                raise ValueError(f"{at}: the id is used twice; give each entry its own id")
            seen.add(entry.id)
            chip = entry.hardware or self.hardware
            if self.target and (chip not in TARGET_CHIPS or entry.objective != "static"):
                raise ValueError(f"{at}: a target suite compiles for the entry's chip, one of "
                                 f"{tuple(TARGET_CHIPS)}, with the static objective; got "
                                 f"hardware {chip!r}, objective {entry.objective!r}")
            if entry.devices > self.devices and not self.target:
                raise ValueError(f"{at}: mesh {entry.mesh} needs {entry.devices} devices but "
                                 f"the suite has {self.devices}; shrink the mesh")

    def select(self, ids: Sequence[str] | None) -> tuple[Entry, ...]:
        """The entries named by `ids` (in suite order), or all of them for None.

        Raises:
          ValueError: an id the suite does not have; the message lists them.
        """
        if not ids:
            return self.entries
        known = [e.id for e in self.entries]
        unknown = [i for i in ids if i not in known]
        if unknown:
            raise ValueError(f"suite {self.name!r} has no entry {unknown[0]!r}; its entries "
                             f"are {', '.join(known)}")
        return tuple(e for e in self.entries if e.id in ids)


def builtin_suites() -> Traversable:
    """The folder of the suites shipped with shardsearch (package data).

    Example: `sorted(p.name for p in builtin_suites().iterdir())` →
    `["cpu-sim8.json", "cpu-static64.json", ...]`.
    """
    return importlib.resources.files(__package__) / BUILTIN_SUITES


def suite_names(suites_dir: str | Path | None = None) -> list[str]:
    """The suite names in `suites_dir` (None: the shipped suites), sorted.

    Example: `suite_names()` → `["cpu-sim8", "cpu-static64", "gpu-1", ...]`.
    """
    folder = builtin_suites() if suites_dir is None else Path(suites_dir)
    if not folder.is_dir():
        return []
    return sorted(p.name[:-len(".json")] for p in folder.iterdir()
                  if p.name.endswith(".json") and p.is_file())


def find_suite(name_or_path: str,
               suites_dir: str | Path | None = None) -> Path | Traversable:
    """The suite file: a path to a file, or a name looked up in a folder.

    Args:
      name_or_path: a path to a suite file (it ends in `.json`, holds a path
        separator or names an existing file; relative to the current folder),
        or a suite name such as "cpu-sim8".
      suites_dir: where names are looked up: a folder of `<name>.json` files,
        or None for the suites shipped with shardsearch (`builtin_suites()`).

    Returns:
      The file: a `Path`, or a package resource for a shipped suite.

    Raises:
      ValueError: no such file, or `suites_dir` is not a folder; the message
        lists the suites that are there.

    Example: `find_suite("cpu-sim8")` → `.../shardsearch/bench/suites/cpu-sim8.json`.
    """
    path = Path(name_or_path)
    if path.suffix == ".json" or os.sep in name_or_path or path.is_file():
        if not path.is_file():
            raise ValueError(f"suite file {path} does not exist; give a path to a suite JSON "
                             "file or a suite name")
        return path
    if suites_dir is not None and not Path(suites_dir).is_dir():
        where = "" if Path(suites_dir).is_absolute() else f" (in {Path.cwd()})"
        raise ValueError(f"suites folder {suites_dir}{where} does not exist or is not a "
                         "folder; give a folder that holds <name>.json suite files")
    folder = builtin_suites() if suites_dir is None else Path(suites_dir)
    found = folder / f"{name_or_path}.json"
    if found.is_file():
        return found
    names = ", ".join(suite_names(suites_dir)) or "none"
    if suites_dir is None:
        raise ValueError(f"unknown suite {name_or_path!r}: shardsearch ships no such suite "
                         f"(its suites: {names}); give one of those names, a path to a suite "
                         "file, or a folder to look names up in")
    raise ValueError(f"unknown suite {name_or_path!r}: no {found} (suites there: {names}); "
                     "give one of those names or a path to a suite file")


def load_suite(name_or_path: str, suites_dir: str | Path | None = None) -> Suite:
    """Reads and checks a suite file (its fields: the repository's `benchmarks/README.md`).

    Args:
      name_or_path, suites_dir: as for `find_suite`: a path to a suite file,
        or a name looked up in `suites_dir` (None: the shipped suites).

    Raises:
      ValueError: unknown suite, unreadable or malformed file; the message
        names the file and, for an entry's problem, the entry.

    Example: `load_suite("cpu-sim8").entries[0].workload_name` → `"mlp:small"`.
    """
    path = find_suite(name_or_path, suites_dir)
    where = f"suite file {path}"
    try:
        data = read_json(path, where, invalid="{where} is {problem}")
    except OSError as err:
        raise ValueError(f"{where} cannot be read: {err.strerror or err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object with 'suite' and 'entries'")
    _check_keys(data, _SUITE_KEYS, where)
    if data.get("schema", 1) != 1:
        raise ValueError(f"{where}: schema {data.get('schema')!r} is newer than this "
                         "shardsearch reads (1); upgrade shardsearch")
    for key in ("suite", "platform", "devices", "entries"):
        if key not in data:
            raise ValueError(f"{where}: missing {key!r}")
    if not isinstance(data["entries"], list) or not data["entries"]:
        raise ValueError(f"{where}: 'entries' must be a non-empty list of entry objects")
    timing = data.get("timing", {})
    if not isinstance(timing, dict):
        raise ValueError(f"{where}: 'timing' must be an object with {_TIMING_KEYS}")
    _check_keys(timing, _TIMING_KEYS, f"{where}: timing")
    entries = []
    for i, raw in enumerate(data["entries"]):
        name = raw.get("id") if isinstance(raw, dict) else None
        at = f"{where}: entry {i}" + (f" ({name!r})" if name else "")
        if not isinstance(raw, dict):
            raise ValueError(f"{at}: expected an object with {_ENTRY_KEYS[:4]}")
        _check_keys(raw, _ENTRY_KEYS, at)
        missing = [k for k in _ENTRY_KEYS[:4] if k not in raw]
        if missing:
            raise ValueError(f"{at}: missing {missing[0]!r}")
        try:
            entries.append(Entry(**raw))
        except (TypeError, ValueError) as err:
            raise ValueError(f"{at}: {err}") from None
    try:
        return Suite(name=data["suite"], path=path, platform=data["platform"],
                     devices=data["devices"], simulated=bool(data.get("simulated", False)),
                     entries=tuple(entries), description=data.get("description", ""),
                     hardware=data.get("hardware"), target=bool(data.get("target", False)),
                     **timing)
    except TypeError as err:
        raise ValueError(f"{where}: {err}") from None


def _check_keys(data: Mapping[str, Any], known: Sequence[str], where: str) -> None:
    unknown = [k for k in data if k not in known]
    if unknown:
        raise ValueError(f"{where}: unknown field {unknown[0]!r}; fields are {', '.join(known)}")


def prepare_devices(suite: Suite, devices: int | None = None) -> None:
    """Simulates the suite's CPU devices if it asks for them, then checks that
    JAX has the platform and device count the suite is for.

    Must run before JAX starts its backend when devices are simulated.

    Raises:
      ValueError: JAX's devices are not the suite's (or can no longer be
        changed), or more devices to simulate than `limits.MAX_SIMULATED_DEVICES`.
    """
    count = devices if devices is not None else suite.devices if suite.simulated else None
    if count is not None:
        check_simulated_devices(count, "--devices" if devices is not None else
                                f"suite file {suite.path}: devices")
        # Simulated devices are CPU devices: keep an accelerator from becoming the default.
        jax.config.update("jax_platforms", "cpu")
        try:
            _mesh.use_cpu_devices(count)
        except RuntimeError as err:
            raise ValueError(str(err)) from None
    have = jax.devices()
    platform = have[0].platform
    if platform != suite.platform or len(have) != suite.devices:
        hint = (f"simulate them with --devices {suite.devices}" if suite.platform == "cpu"
                else f"run it on a machine with {suite.devices} {suite.platform} devices "
                     "(limit the visible ones, e.g. CUDA_VISIBLE_DEVICES, if it has more)")
        raise ValueError(
            f"suite {suite.name!r} ({suite.path}) is for {suite.devices} {suite.platform} "
            f"devices, but JAX has {len(have)} {platform} devices; {hint}, or choose the "
            "suite for this machine")
