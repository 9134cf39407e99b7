"""Search algorithms written only against the public Runtime API."""

from controllers.base import Candidate, Controller, SearchResult
from controllers.bfs import BFSController

CONTROLLERS = {"bfs": BFSController}

__all__ = ["CONTROLLERS", "BFSController", "Candidate", "Controller", "SearchResult"]
