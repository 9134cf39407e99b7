"""Search algorithms written only against the public Runtime API."""

from controllers.base import Candidate, Controller, SearchResult
from controllers.beam import BeamController
from controllers.best_first import BestFirstController
from controllers.bfs import BFSController
from controllers.dfs import DFSController
from controllers.mcts import MCTSController

#: controller name -> class; each has a config conf/controller/<name>.yaml
CONTROLLERS: dict[str, type[Controller]] = {
    "bfs": BFSController,
    "beam": BeamController,
    "dfs": DFSController,
    "best_first": BestFirstController,
    "mcts": MCTSController,
}

__all__ = [
    "CONTROLLERS",
    "BFSController",
    "BeamController",
    "BestFirstController",
    "Candidate",
    "Controller",
    "DFSController",
    "MCTSController",
    "SearchResult",
]
