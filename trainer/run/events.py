"""``RUN_DIR/events.jsonl``: what happened during a run (bad steps, rollbacks, resumes, what step hooks report)."""
from __future__ import annotations

import json
import os

EVENTS_FILE = "events.jsonl"


class EventLog:
    """Append-only JSON lines shared by all ranks (one ``os.write`` per record on an
    ``O_APPEND`` descriptor, so lines of different ranks do not interleave).

    Args:
        path: the file; its folder is created.
    """

    def __init__(self, path: str):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)

    @classmethod
    def of_run(cls, run_dir: str) -> "EventLog":
        """The event log of the run in ``run_dir`` (``run_dir/events.jsonl``)."""
        return cls(os.path.join(run_dir, EVENTS_FILE))

    def write(self, record: dict) -> None:
        """Append ``record`` as one JSON line (keys sorted) with a single ``os.write``."""
        line = (json.dumps(record, sort_keys=True, default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
        finally:
            os.close(fd)
