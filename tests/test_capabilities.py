"""Policies declare what they ask of the runtime once, as a frozen :class:`Capabilities`.

The table is what every policy answered under the old per-attribute booleans (recorded before
they became ``capabilities``): the move changed no answer, and the booleans are gone (only the
planner reads capabilities; tests/test_structure.py checks that).
"""

from __future__ import annotations

import dataclasses

import pytest

from arbor_runtime.policies import Capabilities, SnapKVPolicy, build_policy

NAMES = (
    "offload",
    "keep_active_whole",
    "needs_attention",
    "frees_memory",
    "observation_window",
    "restores_active_path",
    "shrinks_active_path",
)
F, T = False, True
TREE_BLIND = (F, F, F, T, None, F, T)
TREE_BLIND_ATTENTION = (F, F, T, T, None, F, T)
KEEPS_ALL = (F, F, F, F, None, F, F)
ARBOR = (T, T, T, T, None, T, F)
#: (policy, its arguments) -> the seven answers, in NAMES order
EXPECTED = {
    ("full", ()): KEEPS_ALL,
    ("h2o", ()): TREE_BLIND_ATTENTION,
    ("streaming", ()): TREE_BLIND,
    ("snapkv", ()): (F, F, T, T, 64, F, T),
    ("snapkv", (("window_size", 16),)): (F, F, T, T, 16, F, T),
    ("thinkv", ()): TREE_BLIND_ATTENTION,
    ("arbor", ()): ARBOR,
    ("kvp", ()): TREE_BLIND,
    ("random", ()): TREE_BLIND,
    ("lychee", ()): KEEPS_ALL,
    ("quest", ()): KEEPS_ALL,
    ("oracle_topk", ()): KEEPS_ALL,
    ("oracle_topk", (("memory", "arbor"),)): ARBOR,
    ("lychee", (("memory", "h2o"),)): TREE_BLIND_ATTENTION,
    ("quest", (("memory", "streaming"),)): TREE_BLIND,
    ("quest", (("memory", "snapkv"),)): (F, F, T, T, 64, F, T),
    ("lychee", (("memory", "arbor"),)): ARBOR,
    ("quest", (("memory", "arbor"),)): ARBOR,
    ("lychee", (("memory", "arbor"), ("rehydrate", "ranked"))): (T, T, T, T, None, F, F),  # on demand
    ("quest", (("memory", "arbor"), ("rehydrate", "ranked"))): (T, T, T, T, None, F, F),
}


@pytest.mark.parametrize(("name", "args"), list(EXPECTED), ids=lambda v: str(v))
def test_each_policy_answers_as_before_through_its_capabilities(name, args):
    policy = build_policy(name, budget_tokens=4096, **dict(args))
    caps = policy.capabilities
    assert isinstance(caps, Capabilities)
    assert tuple(getattr(caps, n) for n in NAMES) == EXPECTED[(name, args)]


def test_a_sparse_wrapper_forwards_its_memory_policys_fields_too():
    caps = build_policy("lychee", budget_tokens=4096, memory=SnapKVPolicy(window_size=8)).capabilities
    assert caps.observation_window == 8 and caps.needs_attention and caps.shrinks_active_path


@pytest.mark.parametrize(
    ("name", "args", "degrades"),
    [
        ("arbor", {}, True),
        ("arbor", {"degrade": False}, False),
        ("lychee", {"memory": "arbor"}, True),
        ("lychee", {"memory": "arbor", "rehydrate": "ranked"}, False),  # it has no floor to go below
        ("h2o", {}, False),
        ("full", {}, False),
    ],
)
def test_only_arbor_degrades_below_its_floor_and_pins_its_sinks(name, args, degrades):
    caps = build_policy(name, budget_tokens=4096, **args).capabilities
    assert caps.degrades is degrades
    assert caps.sink_tokens == (4 if name in ("arbor", "lychee") else 0)


def test_capabilities_are_frozen_and_derive_the_two_path_answers():
    caps = Capabilities(keep_active_whole=True)
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.offload = True  # type: ignore[misc]
    assert caps.restores_active_path and not caps.shrinks_active_path
    assert Capabilities().shrinks_active_path and not Capabilities(frees_memory=False).shrinks_active_path
    assert not Capabilities(keep_active_whole=True, restores_active_path=False).restores_active_path
    ranked = dataclasses.replace(caps, restores_active_path=False)  # what a sparse wrapper does
    assert (ranked.keep_active_whole, ranked.restores_active_path) == (True, False)


@pytest.mark.parametrize("name", ["full", "h2o", "snapkv", "arbor", "lychee"])
def test_the_old_names_are_gone(name):
    """A policy answers one question, ``capabilities``; the seven booleans every module used to
    branch on are no longer there to branch on."""
    policy = build_policy(name, budget_tokens=4096)
    assert [n for n in NAMES if hasattr(policy, n)] == []
