"""What the planner decides, as plain records: an admission, how room is made, what a policy's
retention plan does to the store. The planner (:mod:`arbor_runtime.planner`) makes them without
side effects; the scheduler puts them in its plans and the memory manager carries them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    from arbor_runtime.tree import Node


@dataclass(frozen=True, slots=True)
class AdmitPlan:
    """An admission decided, not yet carried out.

    Attributes:
        rows: how many entries of the queue's head start now (0: none fits).
        need: slots they need now: their own slots, plus, when ``whole``, the evicted tokens of
            their paths (restored from the host tier or recomputed).
        active: block ids (in the store) of the running and admitted paths.
        whole: the admitted paths are made whole before they run.
        pinned: below the floor (a lone row whose path does not fit whole), block id -> block-local
            tokens of its path that stay on the device (:meth:`MemoryPlanner.pinned`); the policy
            ranks the rest of the path. None: at or above the floor.
        recompute: blocks of the admitted paths dropped from every tier, parents first, rebuilt
            before the rows run (only when ``whole``).
    """

    rows: int = 0
    need: int = 0
    active: frozenset[int] = field(default_factory=frozenset)
    whole: bool = False
    pinned: dict[int, torch.Tensor] | None = None
    recompute: tuple[Node, ...] = ()


@dataclass(frozen=True, slots=True)
class RoomPlan:
    """How room is made now (:meth:`MemoryPlanner.room_plan`), in order: the parked blocks leave for
    the host tier (``park``), then the policy is asked for one plan (``ask``: a MemoryThreshold that
    brings resident blocks down to ``target``, ``short`` slots short then)."""

    park: bool = False
    ask: bool = False
    target: int = 0
    short: int = 0


@dataclass(frozen=True, slots=True)
class Retention:
    """What carrying out a policy's retention plan does to the store (:meth:`MemoryPlanner.retention`).

    Attributes:
        drop_host: blocks whose host span goes first (the host cap).
        apply: (block id, block-local tokens kept on the device, whether the rest go to the host).
        path: below the floor, block id -> the residency of each active block (its host tokens in it
            come back once every eviction is done, pinned blocks first).
    """

    drop_host: list[int] = field(default_factory=list)
    apply: list[tuple[int, torch.Tensor, bool]] = field(default_factory=list)
    path: dict[int, torch.Tensor] = field(default_factory=dict)
