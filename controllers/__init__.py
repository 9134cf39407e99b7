"""Search algorithms written only against the public Runtime API."""

from arbor_runtime.controllers.base import Candidate, Controller, SearchResult
from arbor_runtime.controllers.beam import BeamController
from arbor_runtime.controllers.best_first import BestFirstController
from arbor_runtime.controllers.bfs import BFSController
from arbor_runtime.controllers.dfs import DFSController
from arbor_runtime.controllers.mcts import MCTSController

__all__ = [
    "BFSController",
    "BeamController",
    "BestFirstController",
    "Candidate",
    "Controller",
    "DFSController",
    "MCTSController",
    "SearchResult",
]
