"""Stage 1's memory prediction against XLA's totals, on a finished suite's studies.

    python benchmarks/prediction/agreement.py RESULTS SUITE OUT.md [--margin M ...]

RESULTS is a `shardsearch bench --out` folder holding `<SUITE>/studies.db` and
`<SUITE>/entries/`. For every entry's study, every distinct candidate XLA
compiled (its total is recorded) is predicted again from its stored rules with
the current predictor (`shardsearch.search.predict_footprint`; nothing
compiles; each knob setting's step built by a context of the entry's own, as
the study built it, its activation points placed by the `act_*` knobs), and
judged as stage 1 judges, in trial order: its prediction times
the least ratio XLA total / prediction of the candidates before it in its
pool (the same knobs until 2026-12-07; since, the same step knobs and batch
placement, `shardsearch.search.evaluation.evaluate.prediction_pool`; once
there are three), against the entry's budget times the
margin: stage 1's own (the square root of the spread of those ratios, largest
over least, since 2026-12-06; the spread itself before, in the reports made
then), and
any fixed `--margin` given (`shardsearch.search.prediction_summary`). A "false cut" is a candidate
the rule would have cut that XLA fit; "missed" is one XLA found over the budget
that the rule let through to compile. The ratio columns say how far XLA's
total is from the prediction across the entry's candidates: the narrower, the
more the prediction can cut.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

import jax
import optuna

from shardsearch import create_mesh, use_cpu_devices
from shardsearch.bench import load_suite
from shardsearch.search import (
    TrialRecord,
    make_context,
    predict_footprint,
    prediction_summary,
    rule_from_config,
    trace_program,
)
from shardsearch.workloads import get_workload


def entry_rows(suite_dir: Path, suite, margins):
    storage = optuna.storages.RDBStorage(f"sqlite:///{suite_dir / 'studies.db'}")
    names = {s.study_name for s in optuna.get_all_study_summaries(storage)}
    for path in sorted((suite_dir / "entries").glob("*.json")):
        record = json.loads(path.read_text())
        entry = next(e for e in suite.entries if e.id == record["entry"]["id"])
        study_name = record["search"]["study"]
        if study_name not in names:
            continue
        budget = record["budget"]["bytes"]
        if budget is None:  # without a budget stage 1 cuts nothing on memory
            continue
        workload = get_workload(entry.workload_name)
        args = workload.abstract()
        sizes = record["mesh"]
        # The study's own context builds each knob setting's step, its
        # activation points placed (`act_*`) as the search placed them.
        devices = jax.devices()[:math.prod(sizes.values())]
        ctx, _ = make_context(workload, args, create_mesh(tuple(sizes.values()), tuple(sizes),
                                                          devices),
                              objective="static", hardware=entry.hardware or suite.hardware,
                              knobs=entry.knobs, memory_prediction="record")
        mesh = ctx.mesh
        study = optuna.load_study(study_name=study_name, storage=storage)
        programs = {}
        records, ratios = [], []
        for trial in study.trials:
            rec = TrialRecord.from_trial(trial)
            if rec is None or "total" not in rec.outcome.memory or rec.outcome.cache_hit:
                continue
            knobs = tuple(rec.knobs)
            if knobs not in programs:
                step = ctx.steps(knobs) if knobs and ctx.steps is not None else ctx.step
                programs[knobs] = trace_program(step, args)
            state = rule_from_config(rec.state_rule, mesh)
            batch = rule_from_config(rec.batch_rule, mesh)
            specs = (state.apply(args[0]), *(batch.apply(a) for a in args[1:]))
            predicted = predict_footprint(programs[knobs], specs, sizes).total
            memory = dict(rec.outcome.memory, predicted=predicted)
            records.append(dataclasses.replace(
                rec, outcome=dataclasses.replace(rec.outcome, memory=memory)))
            ratios.append(memory["total"] / predicted)
        if not records:
            continue
        judged = {"stage 1": prediction_summary(records, budget)}
        judged.update({f"{m:g}": prediction_summary(records, budget, margin=m) for m in margins})
        yield entry.id, budget, ratios, judged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results")
    parser.add_argument("suite")
    parser.add_argument("out")
    parser.add_argument("--margin", type=float, action="append")
    a = parser.parse_args()
    margins = a.margin or []
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    suite = load_suite(a.suite)
    # As many simulated devices as the suite's largest mesh: each study's
    # context is built on its own mesh (nothing runs on them).
    use_cpu_devices(max(e.devices for e in suite.entries))
    command = " ".join(["python", *sys.argv])
    lines = [f"# Stage 1's memory prediction against XLA: {a.suite}", "",
             f"Command: `{command}`", "",
             "| entry | budget GiB | compiled | XLA / predicted: min, median, max | "
             + " | ".join(f"margin {m}: judged, over, agree, false cuts, missed"
                          for m in ["stage 1", *(f"{m:g}" for m in margins)]) + " |",
             "|---|---|---|---|" + "---|" * (1 + len(margins))]
    for entry_id, budget, ratios, judged in entry_rows(Path(a.results) / a.suite, suite,
                                                       margins):
        cells = [f"{j['judged']}, {j['over']}, {j['agree']}, {j['false_cuts']}, {j['missed']}"
                 for j in judged.values()]
        lines.append(f"| {entry_id} | {budget / 2**30:.1f} | {len(ratios)} | "
                     f"{min(ratios):.2f}, {statistics.median(ratios):.2f}, "
                     f"{max(ratios):.2f} | " + " | ".join(cells) + " |")
        print(lines[-1], flush=True)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
