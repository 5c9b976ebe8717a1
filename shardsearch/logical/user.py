"""The logical names a user already gave: Flax's boxed parameters, read without Flax.

Flax models carry a logical name per dim on their parameters: Linen's
`nn.with_logical_partitioning` boxes a value in a `LogicallyPartitioned`
(`flax.core.meta.Partitioned`: `.names`), and an NNX `Variable` keeps them in
its metadata (`out_sharding`, `sharding_names` or, before Flax 0.11,
`sharding`), set by `nnx.with_partitioning` or `Param(..., sharding=...)`.
Both are pytree nodes whose names live in the tree's structure, so an argument
tree that keeps them (`nnx.state(model)`, the boxed variables of `init`, the
optax state built on them) carries the names into `discover_logical_axes`,
which adopts them (`logical.discover`).

Flax is never imported: a box is recognised by its type's module (`flax.`)
and the attributes above, so this works on any Flax version that keeps them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

import jax
from jax.sharding import PartitionSpec as P

from .axes import LeafAxes, LogicalAxes, LogicalAxis

Names = tuple[str | None, ...]
# NNX metadata keys that hold the logical names, newest first.
_NNX_KEYS = ("out_sharding", "sharding_names", "sharding")


def box_names(node: Any) -> Names | None:
    """The logical names a Flax box carries, or None for anything else.

    Example: `nn.LogicallyPartitioned(w, names=("embed", "mlp"))` →
    `("embed", "mlp")`; `nnx.Param(w, sharding=("embed", None))` →
    `("embed", None)`; a plain array → None.
    """
    module = type(node).__module__ or ""
    if not module.startswith("flax."):
        return None
    names = getattr(node, "names", None) if not hasattr(node, "get_metadata") else None
    if names is None and hasattr(node, "get_metadata"):
        try:
            metadata = node.get_metadata()
        except TypeError:  # a class, or another API under that name
            return None
        if isinstance(metadata, dict):
            names = next((metadata[k] for k in _NNX_KEYS if metadata.get(k) is not None),
                         None)
    return normalise_names(names)


def normalise_names(names: Any) -> Names | None:
    """A `PartitionSpec` or sequence of logical names as a tuple, or None.

    A dim given several names (`P(("a", "b"))`) or anything but a string or None
    is left unnamed (None): a logical name must be one name.

    Example: `P("embed", None)` → `("embed", None)`; `"embed"` → None.
    """
    if names is None or isinstance(names, str) or not isinstance(names, Sequence | P):
        return None
    return tuple(n if isinstance(n, str) and n else None for n in names)


def is_box(node: Any) -> bool:
    """Whether `node` is a Flax box with logical names (see `box_names`)."""
    return box_names(node) is not None


def user_names(tree: Any) -> list[Names | None]:
    """Per leaf of `tree`, in `jax.tree_util.tree_leaves` order, the logical names
    a Flax box around it gives, or None.

    Example: `{"w": nn.LogicallyPartitioned(w, ("embed", "mlp")), "b": b}` →
    `[None, ("embed", "mlp")]` (leaves in key order: `b`, then `w`'s value).
    """
    out: list[Names | None] = []
    for node in jax.tree_util.tree_leaves(tree, is_leaf=is_box):
        names = box_names(node)
        if names is None:
            out.append(None)
        else:
            out += [names] * len(jax.tree_util.tree_leaves(node))
    return out


def given_names(tree: Any, names: Any) -> list[Names | None]:
    """Per leaf of `tree`, the logical names from a tree of names beside it.

    `names` has `tree`'s structure (or a prefix of it) with, where a leaf is,
    a `PartitionSpec` or tuple of names (what `nn.get_partition_spec` gives)
    or None.

    Raises:
      ValueError: `names` does not have `tree`'s structure.
    """
    treedef = jax.tree_util.tree_structure(tree)
    try:
        given = treedef.flatten_up_to(names)
    except (ValueError, TypeError) as err:
        raise ValueError(f"logical names do not have the argument's structure ({err}); give "
                         "a tree like nn.get_partition_spec(state)") from None
    return [normalise_names(n) for n in given]


def adopt(axes: LogicalAxes, given: Sequence[Sequence[Names | None]]) -> LogicalAxes:
    """`axes` (found from the dataflow) renamed after the user's own names.

    The dataflow decides which dims are coupled; the user's names decide what
    the axes are called. Each discovered axis that a user's name falls on takes
    that name, and so do the dims coupled with it that the user left unnamed
    (the Adam moments of a named weight, a bias the user did not annotate).
    Discovered axes that the user gave one name are one axis (the user said
    they are split alike, as Flax's rules would split them; its size is the
    smaller). An axis the user gave two names (dims the dataflow couples) keeps
    the first, in leaf order, and the conflict is recorded (`conflicts`,
    warned as a `UserNamesConflictWarning` by `optimize`); so are names of
    another length than their leaf's rank, which are ignored. A discovered
    name that a user's name now takes (`embed` found, `embed` given elsewhere)
    gets `_2`, `_3`, ...

    Args:
      axes: the discovered axes.
      given: per argument, per leaf (`axes.arguments`' order), its user names
        or None.

    Example: discovered `wq: (embed, heads)`, `wq`'s box names `("embed",
    "q_heads")` → `wq: (embed, q_heads)`, and `wo: (q_heads, embed)` too, since
    the dataflow couples `wo`'s input with `wq`'s output.
    """
    conflicts: list[str] = []
    votes: dict[str, dict[str, str]] = {}  # discovered axis -> user name -> where first
    for a, (argument, names) in enumerate(zip(axes.arguments, given, strict=True)):
        for leaf, user in zip(argument, names, strict=True):
            if user is None:
                continue
            where = f"argument {a} leaf {leaf.path!r}"
            if len(user) != len(leaf.names):
                conflicts.append(f"{where}: logical names {list(user)} for a leaf of shape "
                                 f"{list(leaf.shape or ())}; ignored, its dims keep the "
                                 "discovered names")
                continue
            for d, (found, name) in enumerate(zip(leaf.names, user, strict=True)):
                if found is not None and name is not None:
                    votes.setdefault(found, {}).setdefault(name, f"{where} dim {d}")
    if not votes:
        return dataclasses.replace(axes, conflicts=axes.conflicts + tuple(conflicts))
    # Discovered axes linked by a user name are one axis: the components of
    # the graph of axes and the user names on them, each named by its user
    # name met first (leaf order).
    first_seen = {name: i for i, name in enumerate(dict.fromkeys(
        n for names in votes.values() for n in names))}
    parent: dict[Any, Any] = {}

    def root(node: Any) -> Any:
        while parent.setdefault(node, node) != node:
            node = parent[node]
        return node

    for found, names in votes.items():
        for name in names:
            parent[root(("user", name))] = root(("axis", found))
    best: dict[Any, str] = {}
    for name in first_seen:
        best.setdefault(root(("user", name)), name)
    group = {found: best[root(("axis", found))] for found in votes}
    for found, names in votes.items():
        if len(names) > 1:
            listed = " and ".join(f"{n!r} ({w})" for n, w in names.items())
            conflicts.append(f"the dataflow couples dims the user named {listed}: they must "
                             f"be split alike, so the axis is named {group[found]!r}; give "
                             "them one name")
    taken = set(group.values())
    rename: dict[str, str] = {}
    out_axes: dict[str, LogicalAxis] = {}
    for axis in axes.axes:
        if axis.name in group:
            name = group[axis.name]
            if name in out_axes:
                kept = out_axes[name]
                out_axes[name] = dataclasses.replace(kept, size=min(kept.size, axis.size))
            else:
                out_axes[name] = LogicalAxis(name, axis.size, axis.role)
        else:
            name, k = axis.name, 1
            while name in taken or name in out_axes:
                k += 1
                name = f"{axis.name}_{k}"
            out_axes[name] = dataclasses.replace(axis, name=name)
        rename[axis.name] = name
    arguments = tuple(
        tuple(LeafAxes(leaf.path, leaf.shape,
                       tuple(None if n is None else rename[n] for n in leaf.names))
              for leaf in argument)
        for argument in axes.arguments)
    merges = tuple(_renamed(m, rename) for m in axes.merges)
    return LogicalAxes(tuple(out_axes.values()), arguments, merges, axes.unhandled,
                       axes.conflicts + tuple(conflicts))


def _renamed(text: str, rename: dict[str, str]) -> str:
    # Merge notes name axes as words; keep them readable after the renaming.
    words = re.split(r"(\W+)", text)
    return "".join(rename.get(w, w) if w in rename else w for w in words)
