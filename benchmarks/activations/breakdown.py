"""A published plan with its activation points placed, compiled for the chip.

For one `published-chip` entry, the published plan is compiled by the chip's
own compiler (deviceless) once per activation setting: as published, then
Megatron-LM's sequence parallelism (the sequence of the residual stream, the
heads, the keys and values and the MLP's hidden width on the tensor axis),
with and without the K/V points, with remat as published and full. What is
compared is the static objective's estimate, its collectives by kind, and
the compiler's memory; nothing runs.

    python benchmarks/activations/breakdown.py [--entry ID] [--out DIR]

writes `DIR/breakdown-<entry>.{json,md}`, default DIR
`benchmarks/results/activations`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import shardsearch as ss

ss.use_cpu_devices(1)

from shardsearch.bench import entry_mesh, load_suite  # noqa: E402
from shardsearch.search import Candidate, evaluate, make_context, resolve  # noqa: E402
from shardsearch.workloads import expert_plan, get_workload  # noqa: E402

GiB = 2**30
SP = {"act_seq": "tp", "act_heads": "tp", "act_kv_heads": "tp", "act_mlp": "tp"}
SETTINGS = {
    "as published": {},
    "sequence parallel without K/V": {k: v for k, v in SP.items() if k != "act_kv_heads"},
    "sequence parallel": SP,
    "remat=full": {"remat": "full"},
    "sequence parallel, remat=full": {**SP, "remat": "full"},
}


def run(entry_id: str) -> list[dict]:
    suite = load_suite("published-chip")
    entry = {e.id: e for e in suite.entries}[entry_id]
    chip = entry.hardware or suite.hardware
    mesh = entry_mesh(suite, entry)
    workload = get_workload(entry.workload_name)
    plan = expert_plan(workload, mesh, entry.published.plan)
    ctx, _ = make_context(workload, None, mesh, objective="static", hardware=ss.HARDWARE[chip],
                          dcn_axes=entry.dcn_axes, knobs=("remat", *SP))
    rows = []
    for label, values in SETTINGS.items():
        setting = ctx.knobs.setting(values)
        candidate = Candidate(plan.state_rule, plan.batch_rule, entry.published.plan,
                              knobs=setting)
        specs, fp = resolve(candidate, ctx)
        outcome = evaluate(specs, fp, ctx.with_setting(setting))
        collectives: dict[str, float] = {}
        for c in (outcome.breakdown or {}).get("collectives", ()):
            key = f"{c['kind']} {','.join(c['axes'])}"
            collectives[key] = collectives.get(key, 0.0) + c["bytes"]
        rows.append({"entry": entry_id, "setting": label, "knobs": values,
                     "status": outcome.status.value, "estimate": outcome.estimate,
                     "memory": outcome.memory, "collective_bytes": collectives,
                     "breakdown": {k: v for k, v in (outcome.breakdown or {}).items()
                                   if k != "collectives"},
                     "command": " ".join(["python benchmarks/activations/breakdown.py",
                                          *sys.argv[1:]])})
        print(json.dumps({k: rows[-1][k] for k in ("setting", "status", "estimate")}),
              flush=True)
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| setting | estimate s | memory-bound term s | communication s | compiler memory "
             "GiB (temporaries) | tp collectives GB by kind |", "|---|---|---|---|---|---|"]
    for r in rows:
        b, m = r["breakdown"], r["memory"]
        tp = ", ".join(f"{k.split()[0]} {v / 1e9:.0f}" for k, v in r["collective_bytes"].items()
                       if k.endswith(" tp"))
        est = f"{r['estimate']:.3f}" if r["estimate"] is not None else r["status"]
        lines.append(f"| {r['setting']} | {est} | {b.get('memory', 0):.3f} | "
                     f"{b.get('communication', 0):.3f} | {m.get('total', 0) / GiB:.1f} "
                     f"({m.get('temp', 0) / GiB:.1f}) | {tp} |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--entry", default="megatron-7.1b-h100-96-tp2")
    p.add_argument("--out", default=str(Path(__file__).resolve().parents[1] / "results"
                                        / "activations"))
    a = p.parse_args()
    rows = run(a.entry)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"breakdown-{a.entry}.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / f"breakdown-{a.entry}.md").write_text(
        f"# {a.entry}: the published plan with its activation points placed (compiled for "
        "the chip)\n\nCommand: `" + rows[0]["command"] + "`. Static objective, the chip's "
        "compiler deviceless; nothing ran.\n\n" + table(rows) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
