"""A local Ray instance's processes end with the driver that started it, however the driver ends.

Ray ties the processes it starts for a local instance (GCS, raylet, workers) to the driver through the
kernel, but the raylet's two agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) only notice that
the raylet died and then try for up to 60 s to report it to the GCS, which died with it: a SIGKILLed
``arbor-solve`` left them running for about a minute (issue 47). So when :class:`RayRunner` starts a
local instance it first starts this reaper, a small process in a session of its own that holds the
read end of a pipe whose write end only the driver holds. Every process ``ray.init`` starts carries a
marker in its environment (:data:`MARKER`, set only while ``ray.init`` runs, so nothing else the
driver starts later has it; Ray's workers inherit the raylet's). While the pipe stays open the reaper
notes, every :data:`WATCH_SECONDS`, each process with the marker and each descendant of one (the
agents overwrite their environment with their process title, so parentage is what marks them). When
the driver's end closes (the driver exited, was killed, or crashed), it reads end-of-file and SIGKILLs
every noted process still running. Linux only (it reads ``/proc``); elsewhere it exits at once.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

#: the environment variable that marks the processes of one local Ray instance
MARKER = "ARBOR_RAY_INSTANCE"


@contextlib.contextmanager
def reaped() -> Iterator[subprocess.Popen]:
    """Inside: processes started here carry a fresh marker, which a reaper kills once this process ends.

    The reaper outlives the block (it waits for this process to end); only the environment is put back.
    """
    marker = uuid.uuid4().hex
    reaper = subprocess.Popen(
        [sys.executable, "-m", "arbor_cli.runners.reaper", marker, str(os.getpid())],
        stdin=subprocess.PIPE,
        start_new_session=True,  # a Ctrl-C or a kill of the driver's process group leaves it running
        close_fds=True,
    )
    before = os.environ.get(MARKER)
    os.environ[MARKER] = marker
    try:
        yield reaper
    finally:
        if before is None:
            os.environ.pop(MARKER, None)
        else:
            os.environ[MARKER] = before


#: seconds between two looks at the instance's processes while the driver lives
WATCH_SECONDS = 0.5
#: a process's environment is read again on each look until it is this old (between fork and exec
#: it still shows its parent's)
SETTLE_SECONDS = 5


def processes() -> dict[int, tuple[int, str]]:
    """Every process now: pid -> (parent pid, start time in clock ticks), read from ``/proc``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):  # gone meanwhile
                continue
            found[int(entry.name)] = (int(fields[1]), fields[19])
    return found


def has_marker(pid: int, marker: str) -> bool:
    """Whether the process started with ``MARKER=marker`` in its environment."""
    try:
        environ = (Path("/proc") / str(pid) / "environ").read_bytes()
    except OSError:  # gone, or another user's
        return False
    return f"{MARKER}={marker}".encode() in environ.split(b"\0")


def watch(marker: str, spare: set[int], known: dict[int, str], checked: set[tuple[int, str]]) -> None:
    """Add to ``known`` (pid -> start time) every process with the marker and every descendant of one.

    Descendants count whatever their environment says now: Ray's agents rewrite their process title
    over it (``setproctitle``), so only their parentage tells they belong to the instance. A process's
    environment is read until it is :data:`SETTLE_SECONDS` old (``checked`` holds the (pid, start
    time) pairs not to read again).
    """
    now, settled = processes(), _ticks_now() - SETTLE_SECONDS * os.sysconf("SC_CLK_TCK")
    grew = True
    while grew:
        grew = False
        for pid, (ppid, started) in now.items():
            if pid in known or pid in spare:
                continue
            fresh = (pid, started) not in checked
            if int(started) < settled:  # a younger one may not have exec'd its environment yet
                checked.add((pid, started))
            if ppid in known or (fresh and has_marker(pid, marker)):
                known[pid] = started
                grew = True


def _ticks_now() -> float:
    """Clock ticks since boot (what ``/proc/<pid>/stat`` start times count)."""
    return float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK")


def reap(known: dict[int, str]) -> list[int]:
    """SIGKILL every process in ``known`` that still runs (the same process: its start time matches)."""
    now, killed = processes(), []
    for pid, started in known.items():
        if now.get(pid, (0, None))[1] == started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed


def main(argv: list[str]) -> int:
    """``python -m arbor_cli.runners.reaper MARKER DRIVER_PID``: while stdin stays open, note the
    instance's processes every :data:`WATCH_SECONDS`; at its end (the driver is gone), kill them."""
    marker, driver = argv[0], int(argv[1])
    if not Path("/proc/self/stat").exists():
        return 0
    spare, known, checked = {os.getpid(), driver}, {}, set()
    stdin = sys.stdin.buffer
    while True:
        ready, _, _ = select.select([stdin], [], [], WATCH_SECONDS)
        if ready and not os.read(stdin.fileno(), 4096):  # nothing is ever written: b"" is the end
            break
        watch(marker, spare, known, checked)
    watch(marker, spare, known, checked)
    reap(known)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
