"""Stage 1's margin rules replayed on finished suites' studies.

    python benchmarks/prediction/margins.py [--pool POOL ...] OUT.md FOLDER [FOLDER ...]

Each FOLDER is a `shardsearch bench --out` suite folder (`<out>/<suite>`)
holding `studies.db` and `entries/`. For every entry with a memory limit (its
budget, or the hardware model's memory, as the static objective's default
budget), every candidate XLA compiled (its total and the prediction recorded)
is judged in trial order as stage 1 judges it: once three distinct compiled
candidates of its pool (below) came before it, its prediction times the least
of their ratios XLA total / prediction, against the limit times a margin. The
margins compared: the spread of those ratios (largest over least; stage 1's
rule before 2026-12-06), its square root (the rule since), their median over
the least, and fixed 1.25 and 1.5.

*right*: a cut XLA also found over the limit; *false*: a cut of a candidate
XLA fit (a plan the search would have lost); *missed*: over the limit, not
cut, so compiled for nothing. *seconds*: the trial seconds of the right cuts,
most of which a cut before compiling saves. A replay: the study's trials stay
as they ran, where a rule that cut would have changed what the sampler
proposed next.

`--pool` (repeatable: a table per pool) says which candidates' ratios
calibrate each other (`POOLS`):
`setting`, the whole knob setting, stage 1's key until 2026-12-07 and the
default here; `batch`, stage 1's key since (`shardsearch.search.prediction_pool`:
the step's own knobs, such as remat and microbatches, and whether the
activations' batch is placed); `own`, the step's own knobs alone; `placed`,
the step's own knobs and which activation points are placed, not where.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import optuna

from shardsearch.search import prediction_pool

SAMPLES = 3  # shardsearch's PREDICTION_SAMPLES
RULES: dict[str, Callable[[Sequence[float]], float]] = {
    "spread": lambda rs: max(rs) / min(rs),
    "square root of the spread": lambda rs: (max(rs) / min(rs)) ** 0.5,
    "median over least": lambda rs: statistics.median(rs) / min(rs),
    "fixed 1.25": lambda rs: 1.25,
    "fixed 1.5": lambda rs: 1.5,
}


POOLS = {"setting": "the whole knob setting (stage 1 until 2026-12-07)",
         "own": "the step's own knobs, the activation points left out",
         "batch": "the step's own knobs and whether the activations' batch is placed "
                  "(stage 1 since 2026-12-07)",
         "placed": "the step's own knobs and which activation points are placed (not where)"}


def limit_of(entry: dict) -> int | None:
    """The entry's budget, else its hardware model's memory (read off the
    model's description, as the results record it)."""
    budget = entry["budget"].get("bytes") or entry["budget"].get("chip_bytes")
    if budget:
        return budget
    found = re.search(r"\((\d+) GiB HBM", str(entry.get("hardware_model")))
    return int(found.group(1)) * 2**30 if found else None


def pool_key(knobs: dict, pool: str) -> str:
    """The key whose candidates' ratios are pooled (`POOLS`)."""
    if pool == "own":
        knobs = {k: v for k, v in knobs.items() if not k.startswith("act_")}
    elif pool == "placed":
        knobs = {k: v if not k.startswith("act_") else v != "auto" for k, v in knobs.items()}
    elif pool == "batch":
        return json.dumps(prediction_pool(knobs))
    return json.dumps(knobs, sort_keys=True)


def judge(trials: Sequence[optuna.trial.FrozenTrial], limit: int,
          pool: str = "setting") -> dict[str, list[float]]:
    """Per rule: right, false, missed, seconds of the right cuts."""
    counts = {rule: [0, 0, 0, 0.0] for rule in RULES}
    seen: dict[str, dict[str, float]] = {}
    for trial in trials:
        outcome = trial.user_attrs.get("outcome") or {}
        memory = outcome.get("memory") or {}
        total, predicted = memory.get("total"), memory.get("predicted")
        if not total or not predicted:
            continue
        knobs = pool_key(trial.user_attrs.get("knobs") or {}, pool)
        fingerprint = outcome.get("fingerprint") or f"trial {trial.number}"
        before = seen.setdefault(knobs, {})
        ratios = list(before.values())
        if len(ratios) >= SAMPLES and fingerprint not in before:
            for rule, margin in RULES.items():
                cut = predicted * min(ratios) > limit * margin(ratios)
                row = counts[rule]
                if cut and total > limit:
                    row[0] += 1
                    row[3] += trial.user_attrs.get("seconds") or 0.0
                elif cut:
                    row[1] += 1
                elif total > limit:
                    row[2] += 1
        before.setdefault(fingerprint, total / predicted)
    return counts


def suite_studies(folder: Path) -> list[tuple[str, int, list]]:
    """`(folder/entry, limit, trials)` for each entry of a suite folder with
    a memory limit whose study is in the folder's `studies.db`."""
    storage = f"sqlite:///{folder / 'studies.db'}"
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    found = []
    for path in sorted((folder / "entries").glob("*.json")):
        entry = json.loads(path.read_text())
        limit = limit_of(entry)
        if limit is not None and entry["search"]["study"] in names:
            study = optuna.load_study(study_name=entry["search"]["study"], storage=storage)
            found.append((f"{folder.name}/{path.stem}", limit, study.trials))
    return found


def write_report(out: Path, lines: list[str]) -> int:
    """Writes `lines` to `out` (its folder made) and prints them; 0."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def main(argv: list[str]) -> int:
    command, pools = " ".join(argv), []
    while argv[:1] == ["--pool"]:
        pools.append(argv[1])
        argv = argv[2:]
    pools = pools or ["setting"]
    if unknown := [p for p in pools if p not in POOLS]:
        raise SystemExit(f"--pool: one of {', '.join(POOLS)}, not {unknown[0]!r}")
    out, folders = Path(argv[0]), [Path(f) for f in argv[1:]]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    studies = [study for folder in folders for study in suite_studies(folder)]
    lines = ["# Stage 1's margin rules replayed on the suites' studies", "",
             f"Command: `python benchmarks/prediction/margins.py {command}`", "",
             "Per entry and rule: right cuts / false cuts / missed (module docstring)."]
    for pool in pools:
        lines += ["", f"## Ratios pooled by {POOLS[pool]} (`--pool {pool}`)", "",
                  "| entry | limit GiB | " + " | ".join(RULES) + " |",
                  "|---|---|" + "---|" * len(RULES)]
        totals = {rule: [0, 0, 0, 0.0] for rule in RULES}
        for name, limit, trials in studies:
            counts = judge(trials, limit, pool)
            for rule, row in counts.items():
                totals[rule] = [a + b for a, b in zip(totals[rule], row, strict=True)]
            cells = " | ".join(f"{r} / {f} / {m}" for r, f, m, _ in counts.values())
            lines.append(f"| {name} | {limit / 2**30:.0f} | {cells} |")
        cells = " | ".join(f"**{r} / {f} / {m}** ({s:.0f} s)" for r, f, m, s in totals.values())
        lines.append(f"| all | | {cells} |")
    return write_report(out, lines)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
