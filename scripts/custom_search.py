"""A custom search in a few lines, run through arbor-solve's own config (same groups and overrides).

    python scripts/custom_search.py model=tiny-random task.end=901 controller.n_generate=3

``GreedyLookahead`` samples ``n_generate`` thoughts, peeks one greedy thought past each (one batch),
and goes down the thought whose peek scores best; every other branch is released at once.
"""

from __future__ import annotations

import sys
from dataclasses import replace

import hydra
from omegaconf import DictConfig, OmegaConf

from arbor_cli.run import run
from arbor_runtime import Node
from arbor_runtime.controllers import Candidate, Controller


class GreedyLookahead(Controller):
    """Greedy descent where each choice looks one thought ahead."""

    def __init__(self, *args, n_generate: int = 3, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.n_generate, self.peek = n_generate, replace(self.sampling, temperature=0.0)

    def search(self, root: Node) -> tuple[int, Candidate | None]:
        cur, steps = self.root_candidate(root), 0
        while steps < self.task.max_steps and not self.is_solution(self.best):
            steps += 1
            kids = self.expand([(cur.node, self.n_generate)])[0]  # duplicates of seen states dropped
            self.offer(kids)  # self.best: the best finished path so far
            live = [c for c in kids if c.result.valid and not self.is_terminal(c)]
            if not live:
                break
            peeks = [group[0] for group in self.expand([(c.node, 1) for c in live], self.peek, dedup=False)]
            self.offer(peeks)
            cur = max(zip(live, peeks, strict=True), key=lambda lp: (lp[1].key, lp[0].key))[0]
            self.settle([cur])  # release all but the way on and the best answer
        return steps, self.best


@hydra.main(version_base="1.3", config_path="pkg://arbor_cli.conf", config_name="config")
def main(cfg: DictConfig) -> None:
    keep = {k: cfg.controller[k] for k in ("n_generate", "temperature", "top_p") if k in cfg.controller}
    cfg.controller = OmegaConf.create({"_target_": f"{__name__}.{GreedyLookahead.__qualname__}", **keep})
    sys.exit(run(cfg))


if __name__ == "__main__":
    main()
