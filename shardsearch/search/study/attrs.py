"""Every key shardsearch stores in an Optuna study, in one place.

Studies outlive the code that wrote them: a key here is a stored name, and
renaming one makes older studies unreadable. A new key is a new constant
here, used by name wherever it is read or written.

Study attributes (`study.user_attrs`), written when a search opens the study:
"""

from __future__ import annotations

# ----------------------------------------------------------------- the study
WORKLOAD = "workload"
"""The built-in workload's name ("gpt:tiny"), or None for a raw step."""
MESH = "mesh"
"""The mesh's axes and sizes, `{"dp": 2, "tp": 4}`."""
OBJECTIVE = "objective"
"""The objective's name ("measured", "static", "hybrid", ...)."""
BUDGET = "budget"
"""The per-device memory budget in bytes, or None."""
SPACE = "space"
"""The families searched: "rules", "logical" or "both"."""
SEED = "seed"
"""The sampler's seed."""
SAMPLER = "sampler"
"""The sampler, as `repr` gives it."""
HARDWARE = "hardware"
"""The devices (platform, kind, count) and, for an estimating objective, the
hardware model's name and the axes it took as crossing hosts; for a mesh of a
chip's compile-only devices, `target` (`base.target.Target.to_json()`:
platform, chip, topology, slices, the compiler packages' versions)."""
RESULT = "result"
"""The last finished search's summary (`OptimizeResult.to_json()` without the
trials), None while one runs."""
IDENTITY = "identity"
"""What the study searched (`study.identity.StudyIdentity.to_json()`)."""
NOTES = "notes"
"""What the study's setup could not read (`base.warnings` notes: the logical
axes' unhandled primitives and merges); a trial's own are in its outcome."""
FLAX_POINTS = "flax_points"
"""The step's Flax constraints (`nn.with_logical_constraint` calls made
points by `shardsearch.flax.constraint_points`), each as its names per dim
(`base.activations.name_to_json`), in the order the step passes them; absent
when it has none. A flax-rules export places them."""

# ----------------------------------------------------------------- a trial
OUTCOME = "outcome"
"""The trial's `Outcome.to_json()`."""
ESTIMATE = "estimate"
"""The hardware model's estimate in seconds, when the objective made one."""
BREAKDOWN = "breakdown"
"""The estimate's parts (`cost.breakdown.Breakdown.to_json()`)."""
LABEL = "label"
""""search", or the baseline's (or start plan's) label."""
STATE_RULE = "state_rule"
"""The candidate's state rule, `ShardingRule.to_config()`."""
BATCH_RULE = "batch_rule"
"""The candidate's batch rule, `ShardingRule.to_config()`."""
SECONDS = "seconds"
"""Wall seconds of the trial, from proposal to record."""
KNOBS = "knobs"
"""The candidate's knob setting (`Candidate.knobs`) as `{name: value}`; only on
trials whose setting is not the default, so studies without knobs, and those
recorded before knobs, read as they did."""
OWNER = "owner"
"""The run that owns the trial (`study.ownership.Owner.to_json()`)."""
HEARTBEAT = "heartbeat"
"""Epoch seconds of the owner's last beat."""
REASON = "reason"
"""Why a trial failed without an outcome ("interrupted")."""
PROCESS_STEP_TIMES = "process_step_times"
"""Each JAX process's own step times in a multi-process search. Written by
`execution.lockstep` under `execution.distributed.PROCESS_TIMES_ATTR`
(execution never imports study); `tests/test_layout.py` checks the two agree."""

# ------------------------------------------------- a trial, for other readers
# Copies of what the keys above store, in forms that optuna-dashboard's
# tables and plots use as they are (numbers and short strings, one per key).
# Nothing of ours reads them back: the stored "outcome" stays the record.
READABLE_PREFIX = "readable_"
"""Before the name of a decoded coded parameter (`Candidate.readable`):
"readable_auto_order" = "tp,dp" beside the Lehmer digits `auto_order_<i>`,
"readable_priority" = "auto,memory" beside `priority_<i>`. Search trials only."""
STATUS = "status"
"""The outcome's status: "complete", "cut" or "failed"."""
CUT_STAGE = "cut_stage"
"""The stage that cut the candidate ("check", "compile", "estimate",
"measure"); absent unless cut (the outcome stores the stage's id)."""
VALUE_SECONDS = "value_seconds"
"""The objective's value in seconds; absent unless complete."""
COMPILE_SECONDS = "compile_seconds"
"""Lower + compile wall seconds; 0 when not compiled or reused."""
MEMORY_TOTAL_BYTES = "memory_total_bytes"
"""XLA's per-device total bytes; absent before compiling."""
FLOPS = "flops"
"""Flops per device per step; absent before compiling."""
COLLECTIVE_BYTES = "collective_bytes"
"""Bytes moved by collectives per device per step; absent before compiling."""
BYTES_ACCESSED = "bytes_accessed"
"""Bytes the program reads and writes per device per step, loops counted;
absent before compiling (and in trials stored before it was kept)."""
