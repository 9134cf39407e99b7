"""The works the engine runs: what a caller submits, and the account it is counted to.

Plain data (the engine fills them in): a :class:`Work` is one public operation (a prefill, a choose
pass, a release, a compress), an :class:`ExpandJob` an expansion with its rows and children; an
:class:`Account` is where one caller's work is counted and what tells searches apart for their turns.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from arbor_runtime.events import EventLog
from arbor_runtime.metrics import RuntimeMetrics

if TYPE_CHECKING:
    from arbor_runtime.engine.scheduler import Request
    from arbor_runtime.generation import Row, StopChecker
    from arbor_runtime.grammar import GrammarCompiler
    from arbor_runtime.tree import Node

__all__ = ["Account", "ExpandJob", "Staged", "Work"]

#: a prefill or choose pass: yields what it needs, is sent the slots admitted, returns its result
Staged = Generator["Request", int, Any]


@dataclass(slots=True)
class Account:
    """Where one caller's work is counted (a problem's search, in a run with many at once); also
    what tells searches apart for search-level admission (:mod:`~arbor_runtime.engine.turns`).
    ``closed``: the account's ``rt.account()`` block has ended (its search is over)."""

    metrics: RuntimeMetrics = field(default_factory=RuntimeMetrics)
    events: EventLog = field(default_factory=EventLog)
    closed: bool = False


@dataclass(eq=False, slots=True)
class Work:
    """One submitted operation: ``run`` (a prefill, a choose pass, a release) or an expansion
    (:class:`ExpandJob`). ``run()`` returns the result, or a generator (:data:`Staged`) for work
    that asks the scheduler for room: ``steps`` holds it and ``request`` what it asks for now, while
    the work waits; such a ``run`` has ``check()``, which the engine calls before it plans the
    request again (the work's nodes may have been released meanwhile)."""

    name: str
    account: Account | None
    run: Callable[[], Any] | None = None
    result: Any = None
    error: BaseException | None = None
    done: bool = False
    started: float = 0.0
    peak: int = 0  # most pool slots in use while this work was in flight
    waiting_since: float | None = None  # when it first had to wait for room or for its search's turn
    steps: Staged | None = None
    request: Request | None = None


@dataclass(eq=False, slots=True)
class ExpandJob(Work):
    """An expansion in flight: its rows, and its children as they finish."""

    requests: Sequence[tuple[Node, int]] = ()
    stops: Sequence[StopChecker] = ()  # one per request: its sampling params and when its rows end
    grammar: GrammarCompiler | None = None  # matchers for requests sampled under a regex or grammar
    rows: list[Row] = field(default_factory=list)
    children: dict[int, Node] = field(default_factory=dict)
