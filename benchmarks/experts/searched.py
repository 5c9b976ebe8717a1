"""The searched plans of a finished static suite, with their own activations'
batch pinned as the expert plans' now are.

A search that chooses no knobs leaves its candidates' activations to XLA's
propagation, while the expert plans run with `act_batch` on their batch's
axes (`shardsearch.search.pin_batch`). This takes each entry's best distinct
searched candidates from the suite's studies (completed, no knob set),
compiles each again with `act_batch` on the axes that split its own batch,
as the search does (static objective, the suite's hardware model), and
prints the estimate both ways beside the entry's best expert:

    python benchmarks/experts/searched.py cpu-static64 benchmarks/results --top 8 \\
        --out benchmarks/results/experts/searched-cpu-static64.md

RESULTS is a `shardsearch bench --out` folder holding `<suite>/studies.db`
and `<suite>/entries/`. A candidate whose batch is replicated, or split in a
way no `act_batch` value names, is listed as not pinned.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pinned import command_line, entry_context, parse, write


def main(argv: list[str] | None = None) -> int:
    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("results", type=Path)
        parser.add_argument("--top", type=int, default=8)

    a, suite = parse(argv, __doc__.splitlines()[0], extra)

    import optuna

    from shardsearch.search import (
        Candidate,
        TrialRecord,
        evaluate,
        fingerprint,
        resolve,
        rule_from_config,
    )

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    folder = a.results / a.suite
    storage = optuna.storages.RDBStorage(f"sqlite:///{folder / 'studies.db'}")
    lines = [f"# Searched plans with their activations' batch pinned: `{a.suite}`", "",
             f"Command: `{command_line('searched.py', argv)}`", "",
             f"Per entry, its best expert plan (pinned, as the suite's run timed it) and its "
             f"{a.top} best distinct searched candidates that set no knob, each as the "
             "search estimated it (activations left to XLA) and with `act_batch` on its own "
             "batch split: estimate in ms, XLA's total per device in GiB.", "",
             "| entry | best expert, ms | trial | as searched, ms | pinned, ms | pinned, GiB |",
             "|---|---|---|---|---|---|"]
    for path in sorted((folder / "entries").glob("*.json")):
        record = json.loads(path.read_text())
        entry = next(e for e in suite.entries if e.id == record["entry"]["id"])
        experts = [p for p in record["plans"]
                   if p["role"] == "expert" and p.get("median_seconds")]
        best = min(experts, key=lambda p: p["median_seconds"], default=None)
        expert = f"{best['label']} {best['median_seconds'] * 1e3:.0f}" if best else "none fits"
        ctx, _, mesh = entry_context(suite, entry, record["budget"]["bytes"])
        sizes = dict(mesh.shape)
        args = ctx.abstract_args
        study = optuna.load_study(study_name=record["search"]["study"], storage=storage)
        searched: dict[str, TrialRecord] = {}
        for trial in study.trials:
            r = TrialRecord.from_trial(trial)
            if r is not None and r.label == "search" and r.outcome.value is not None \
                    and not r.knobs:
                searched.setdefault(r.outcome.fingerprint, r)
        for r in sorted(searched.values(), key=lambda r: r.outcome.value)[:a.top]:
            candidate = Candidate(rule_from_config(r.state_rule, mesh),
                                  rule_from_config(r.batch_rule, mesh))
            value = ",".join(x for x in candidate.batch_axes(args)[1] if sizes[x] > 1)
            cells = ["not pinned", "-"]
            if value and value in ctx.builds.choices.get("act_batch", ()):
                setting = (("act_batch", value),)
                specs, _ = resolve(candidate, ctx)
                o = evaluate(specs, fingerprint(specs, setting), ctx.with_setting(setting),
                             run=False)
                total = o.memory.get("total")
                cells = [f"{o.value * 1e3:.0f}" if o.value is not None else o.status.value,
                         f"{total / 2**30:.1f}" if total else "-"]
            lines.append(f"| {entry.id} | {expert} | {r.number} | "
                         f"{r.outcome.value * 1e3:.0f} | {cells[0]} | {cells[1]} |")
            print(lines[-1], flush=True)
    write(a.out, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
