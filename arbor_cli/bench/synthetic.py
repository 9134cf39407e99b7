"""A model-independent search workload for smoke tests and quick benchmarks.

Game of 24 on a random-weight model ends after one level (no thought parses), so the tree is
trivial. :func:`synthetic_search` grows a bushy tree whatever the model says: it expands random
live nodes (jumping between branches like best-first), batches two parents in one call now and
then, appends a forced block under each expansion, sets random values and releases subtrees.
"""

from __future__ import annotations

import random

from arbor_runtime import Node, Runtime, SamplingParams

DEFAULT_PROMPT = (
    "Use numbers and basic arithmetic operations (+ - * /) to obtain 24.\n"
    "Input: 2 4 10 12\nSteps:\n12 / 4 = 3 (left: 2 3 10)\n10 - 2 = 8 (left: 3 8)\n"
    "3 * 8 = 24 (left: 24)\nAnswer: (12 / 4) * (10 - 2) = 24\nInput: 4 4 6 8\nSteps:\n"
)


def synthetic_search(
    rt: Runtime,
    prompt: str = DEFAULT_PROMPT,
    expansions: int = 8,
    n: int = 2,
    max_new_tokens: int = 8,
    forced_text: str = " (left: 1 2)\n",
    release_every: int = 3,
    temperature: float = 1.0,
    seed: int = 0,
) -> list[Node]:
    """Grow a tree with ``expansions`` expand calls of ``n`` children each; returns the live nodes.

    Every third call expands two random live nodes in one batch; each call appends
    ``forced_text`` under its first child; every ``release_every``-th call releases a random
    subtree. ``seed`` drives these choices; token sampling uses the runtime's own generator.
    """
    rng = random.Random(seed)
    params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature)
    frontier = [rt.new_tree(prompt)]
    for i in range(expansions):
        if i % 3 == 2 and len(frontier) >= 2:
            picks = rng.sample(frontier, 2)
            kids = [k for group in rt.expand_many([(p, n) for p in picks], params) for k in group]
        else:
            kids = rt.expand(rng.choice(frontier), n, params)
        for kid in kids:
            rt.set_value(kid, round(rng.random(), 3))
        frontier += [*kids, rt.append(kids[0], forced_text)]
        if i % release_every == release_every - 1:
            rt.release(rng.choice([x for x in frontier if x.parent is not None]))
            frontier = [x for x in frontier if not x.released]
    return frontier
