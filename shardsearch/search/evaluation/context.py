"""`Context`: everything fixed for one study that an evaluation reads.

Built by `search.setup.make_context`, which checks what it holds; the
executor (`search.execution`) runs stages 2 and 3 wherever it says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax

from ...base.activations import BATCH_KNOB, names_batch
from ...base.analyzer import ShardingAnalyzer
from ...base.knobs import Knobs, Setting, setting_text
from ...base.target import Target
from ...cost.chips import hardware_for
from ...cost.hardware import HardwareModel
from ...cost.topology import Topology

if TYPE_CHECKING:
    from ..execution.base import Executor
    from .objectives import Objective

# Seconds a measured candidate may go without finishing a step (also the
# default of `optimize(execute_timeout=...)`). Generous: the first step also
# moves the arguments onto the devices.
EXECUTE_TIMEOUT = 120.0


@dataclasses.dataclass
class Context:
    """Everything fixed for one study: the step, its arguments, the mesh, limits.

    Built by `search.setup.make_context`, which checks them.

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
      executor: where stages 2 and 3, the re-timing and the output check run
        (`search.execution`: `InProcess`, `Isolation` or `Lockstep`); set by
        `make_context` (a worker process sets its own).
      execute_timeout: seconds a running candidate may go without finishing
        a step before its worker is stopped (isolated runs only).
      verbose: print each candidate's caught log lines to stderr.
      progress: called with "compiling", "running" and "step" as the
        evaluation goes; a worker uses it to tell the study process it is
        alive, a lockstep process to tell its watchdog. None in the study
        process.
      dcn_axes: the mesh axes that cross hosts, so the hardware model charges
        collectives over them at the network between hosts (`topology()`).
      target: what the mesh compiles for when it is a chip's compile-only
        devices (`base.target.target_mesh`); None for this host's devices.
        Its chip names the default hardware model, and its compiler's
        verdict on memory is final.
      knobs: the step's knobs (`base.knobs.Knobs`) the search chooses, or
        None; `act_batch` held (not chosen, set by the pins) where the search
        chooses others and the step names a batch activation
        (`setup.holding_batch`). In the study process only: a worker gets
        steps, not factories.
      builds: every knob setting the study builds steps for: `knobs`, and the
        activation knobs of the step's named points whether the search
        chooses them or not (the expert plans pin the batch's:
        `space.baselines.pin_batch`); None when the step has neither. In the
        study process only.
      steps: gives the step for a knob setting (`with_setting`): `builds.step`
        in the study process, the programs it was sent in a worker; None
        when the step has no knobs and no named activations.
      setting: the knob setting `step` was built for; `()`: the step as given.
      memory_prediction: what stage 1 does with the memory the step's jaxpr
        predicts for a candidate (`cost.footprint`): "cut" (cut it before
        compiling when, scaled by what the study's compiled candidates showed,
        it is over the budget; always recorded as `memory["predicted"]`),
        "record" (record it, cut nothing on it) or "off" (do not trace for it).
      traced: the step traced for the memory prediction, per knob setting
        (shared by every context `with_setting` derives).
      flax_points: the step's Flax constraints, each point's names per dim
        (`base.activations.trace_points`, the points whose unnamed dims are
        whole), which the study records for a flax-rules export.

    What changes from trial to trial (the study's recorded estimates, its best
    trial) is not here: it travels with the trial (`evaluate(..., standing=...)`,
    `standing.Standing`).
    """

    step: Callable[..., Any]
    abstract_args: tuple[Any, ...]
    mesh: jax.sharding.Mesh
    host_args: Callable[[], tuple[Any, ...]] | None
    budget: int | None
    objective: Objective
    warmup: int = 2
    repeats: int = 7
    compile_timeout: float = 600.0
    hardware: HardwareModel | None = None
    compiles: int = 0
    executor: Executor = None  # type: ignore[assignment]  # make_context sets it
    execute_timeout: float = EXECUTE_TIMEOUT
    verbose: bool = False
    progress: Callable[[str], None] | None = None
    dcn_axes: tuple[str, ...] = ()
    target: Target | None = None
    knobs: Knobs | None = None
    builds: Knobs | None = None
    steps: Callable[[Setting], Callable[..., Any]] | None = None
    setting: Setting = ()
    flax_points: tuple[tuple[Any, ...], ...] = ()
    memory_prediction: str = "cut"
    traced: dict[Setting, Any] = dataclasses.field(default_factory=dict, repr=False)
    root: Context | None = dataclasses.field(default=None, repr=False)

    @property
    def pins_proposals(self) -> bool:
        """Whether the search runs its proposals with their activations' batch
        on their batch split (`space.baselines.pinned`): the step names a
        batch activation and the search does not choose `act_batch` (it
        chooses no knob, or holds `act_batch`: `Knobs.held`)."""
        return (names_batch(self.builds)
                and (self.knobs is None or BATCH_KNOB not in self.knobs.searched()))

    def with_setting(self, setting: Setting) -> Context:
        """This context with the step built for another knob setting.

        The copy shares everything but the step; compiles it counts are
        counted here too (`count_compiles`).

        Raises:
          ValueError: a setting other than `()` for a step without knobs.
        """
        setting = tuple(setting)
        if setting == self.setting:
            return self
        if self.root is not None and setting == self.root.setting:
            return self.root
        if self.steps is None:
            raise ValueError(f"the step has no knobs, so it cannot be built with "
                             f"{setting_text(setting)}")
        root = self.root or self
        return dataclasses.replace(self, step=self.steps(setting), setting=setting,
                                   compiles=0, root=root)

    def count_compiles(self, n: int = 1) -> None:
        """Adds `n` compiles to this context and to the one it was derived from."""
        self.compiles += n
        if self.root is not None:
            self.root.compiles += n

    @property
    def analyzer(self) -> ShardingAnalyzer:
        return ShardingAnalyzer(self.mesh)

    def hardware_model(self) -> HardwareModel:
        """`hardware`, else the target's chip, else the built-in model for
        the mesh's platform.

        Raises:
          ValueError: no model given and none built in for the platform.
        """
        name = self.target.chip if self.target is not None else self.mesh.devices.flat[0].platform
        return hardware_for(name, self.hardware)

    def memory_limit(self) -> int | None:
        """The bytes per device a candidate must fit: the budget, or the chip's
        memory where that is less; None when there is neither."""
        limits = [b for b in (self.budget, self.chip_memory()) if b is not None]
        return min(limits) if limits else None

    def chip_memory(self) -> int | None:
        """Bytes per device that no budget can raise: a target's memory (a
        GPU's from its target config, else the chip's hardware model); None
        for this host's devices."""
        if self.target is None:
            return None
        return self.target.memory_bytes or self.hardware_model().memory_bytes

    def topology(self) -> Topology:
        """The mesh's axes and which of them cross hosts, for the hardware model."""
        return Topology.of(self.mesh, self.dcn_axes)

    def close(self) -> None:
        """Stops the executor's worker process or session, if any."""
        if self.executor is not None:
            self.executor.close()

    def __enter__(self) -> Context:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(ctx: Context, event: str) -> None:
    """Tells the context's watcher (a worker's study process) how far it got."""
    if ctx.progress is not None:
        ctx.progress(event)
