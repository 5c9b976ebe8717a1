"""`Context`: everything fixed for one study that an evaluation reads.

Built by `search.setup.make_context`, which checks what it holds; the
executor (`search.execution`) runs stages 2 and 3 wherever it says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax

from ...base.analyzer import ShardingAnalyzer
from ...cost.chips import hardware_for
from ...cost.hardware import HardwareModel
from ...cost.topology import Topology

# Seconds a measured candidate may go without finishing a step (also the
# default of `optimize(execute_timeout=...)`). Generous: the first step also
# moves the arguments onto the devices.
EXECUTE_TIMEOUT = 120.0


@dataclasses.dataclass
class Context:
    """Everything fixed for one study: the step, its arguments, the mesh, limits.

    Built by `search.context.make_context`, which checks them.

    Attributes:
      step: `step(state, *batch) -> (state, metrics)`, not jitted.
      abstract_args: `(state, *batch)` as ShapeDtypeStructs.
      mesh: a concrete Mesh (compiling needs devices).
      host_args: a function giving fresh host copies of the arguments (needed
        by objectives that run the step), or None.
      budget: per-device bytes, or None for no memory limit.
      objective: the `search.objectives.Objective` that scores candidates past
        stage 2 (`objective.name` is what studies store).
      warmup, repeats: untimed and timed calls per measured candidate.
      compile_timeout: seconds before a compile counts as failed.
      hardware: the model behind the objectives that estimate ("static",
        "hybrid"); None: the built-in one for the mesh's platform
        (`hardware_model()`).
      compiles: how many compiles this context has run (for tests and reports).
      isolation: a `search.isolate.Isolation` when stages 2 and 3 run in a
        worker process, None to run them in this one.
      execute_timeout: seconds a running candidate may go without finishing
        a step before its worker is stopped (isolated runs only).
      verbose: print each candidate's caught log lines to stderr.
      progress: called with "compiling", "running" and "step" as the
        evaluation goes; a worker uses it to tell the study process it is
        alive. None in the study process.
      dcn_axes: the mesh axes that cross hosts, so the hardware model charges
        collectives over them at the network between hosts (`topology()`).
      estimates: the estimates the study has recorded so far, one per
        distinct candidate, ascending: what the "hybrid" objective compares a
        candidate with. The search loop refreshes them from the study before
        each trial (so a resumed study, and several processes sharing one,
        see every recorded trial); a worker process gets them with each job.
    """

    step: Callable[..., Any]
    abstract_args: tuple[Any, ...]
    mesh: jax.sharding.Mesh
    host_args: Callable[[], tuple[Any, ...]] | None
    budget: int | None
    # Not annotated with its class: `search.objectives` imports this module
    # (an objective scores with `measure`), so this one cannot import it back.
    objective: Any
    warmup: int = 2
    repeats: int = 7
    compile_timeout: float = 600.0
    hardware: HardwareModel | None = None
    compiles: int = 0
    isolation: Any = None
    execute_timeout: float = EXECUTE_TIMEOUT
    verbose: bool = False
    progress: Callable[[str], None] | None = None
    dcn_axes: tuple[str, ...] = ()
    estimates: tuple[float, ...] = ()

    @property
    def analyzer(self) -> ShardingAnalyzer:
        return ShardingAnalyzer(self.mesh)

    def hardware_model(self) -> HardwareModel:
        """`hardware`, else the built-in model for the mesh's platform.

        Raises:
          ValueError: no model given and none built in for the platform.
        """
        return hardware_for(self.mesh.devices.flat[0].platform, self.hardware)

    def topology(self) -> Topology:
        """The mesh's axes and which of them cross hosts, for the hardware model."""
        return Topology.of(self.mesh, self.dcn_axes)

    def close(self) -> None:
        """Stops the worker process, if any; a later evaluation starts a new one."""
        if self.isolation is not None:
            self.isolation.close()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(ctx: Context, event: str) -> None:
    """Tells the context's watcher (a worker's study process) how far it got."""
    if ctx.progress is not None:
        ctx.progress(event)
