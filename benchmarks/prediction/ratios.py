"""Each compiled trial's predicted memory beside the compiler's, from a stored study.

    python benchmarks/prediction/ratios.py STORAGE [STUDY]

STORAGE is an Optuna storage URL (`sqlite:///studies.db`); STUDY defaults to
its only study. Prints one markdown row per trial that compiled: its label,
knobs, stage 1's prediction, the compiler's total and their ratio. Run
`optimize` with `--memory-prediction record` (or the default) first: a trial
records its prediction only then.
"""

from __future__ import annotations

import sys

import optuna

from shardsearch.search import TrialRecord


def main() -> int:
    storage = sys.argv[1]
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    names = [sys.argv[2]] if len(sys.argv) > 2 else optuna.get_all_study_names(storage)
    if len(names) != 1:
        print(f"{storage} holds {len(names)} studies; name one: {names}", file=sys.stderr)
        return 2
    study = optuna.load_study(study_name=names[0], storage=storage)
    print("| trial | label | knobs | predicted MiB | compiler MiB | compiler / predicted |\n"
          "|---|---|---|---|---|---|")
    for trial in study.trials:
        record = TrialRecord.from_trial(trial)
        memory = record.outcome.memory if record is not None else {}
        if "total" not in memory or "predicted" not in memory:
            continue
        knobs = ",".join(f"{k}={v}" for k, v in record.knobs) or "-"
        print(f"| {record.number} | {record.label} | {knobs} | "
              f"{memory['predicted'] / 2**20:.1f} | {memory['total'] / 2**20:.1f} | "
              f"{memory['total'] / memory['predicted']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
