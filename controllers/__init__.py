"""Search algorithms written only against the public Runtime API."""

from controllers.base import Candidate, Controller, SearchResult
from controllers.beam import BeamController
from controllers.best_first import BestFirstController
from controllers.bfs import BFSController
from controllers.dfs import DFSController
from controllers.mcts import MCTSController

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
