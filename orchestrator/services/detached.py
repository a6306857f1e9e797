"""A command one command on a host starts in the background, and a later command there collects.

The window's first command on the source starts the uploads' final pass this way the moment the fence is up: the
pass then runs while that command's answer travels back and the database's side goes on, and the files step reads
its answer with one command of its own, sent beside the promotion, instead of starting the pass one round trip
later. Its output and exit status wait in files beside `out` on the host; its own deadline (coreutils `timeout`,
as for any bounded command) ends it there whatever becomes of us.
"""

from __future__ import annotations

import math
import shlex
from dataclasses import dataclass

EXIT = "__migrate_detached_exit="
MISSING = "__migrate_detached_missing__"
POLL = 0.002  # seconds between two looks, on the host, at whether it ended


@dataclass(frozen=True)
class Detached:
    command: str
    out: str  # a path on the host: its output; `.rc` beside it its status, `.pid` its process
    timeout: float

    def start(self) -> str:
        """Shell: started in the background (not waited for), its pid written down."""
        out = shlex.quote(self.out)
        bounded = f"timeout -k 5 {math.ceil(self.timeout) + 1} sh -c {shlex.quote(self.command)}"
        return (
            f"rm -f {out}.rc; ( {bounded} >{out} 2>&1 </dev/null; echo $? >{out}.rc.new && mv {out}.rc.new {out}.rc ) "
            f">/dev/null 2>&1 </dev/null & echo $! >{out}.pid"
        )

    def collect(self) -> str:
        """Shell: waits until it ended (bounded by its own deadline), prints its output, then its status after EXIT;
        MISSING when it never started (the command meant to start it did not get that far). Its files removed."""
        out = shlex.quote(self.out)
        return (
            f'while [ ! -e {out}.rc ] && kill -0 "$(cat {out}.pid 2>/dev/null)" 2>/dev/null; do sleep {POLL}; done; '
            f'if [ -e {out}.rc ]; then cat {out}; echo; echo "{EXIT}$(cat {out}.rc)"; else echo {MISSING}; fi; '
            f"rm -f {out} {out}.rc {out}.pid"
        )


def parse_collected(stdout: str) -> tuple[int | None, str] | None:
    """(its status, its output) from what `collect` printed; None when it never started."""
    if MISSING in stdout.split("\n"):
        return None
    said, found, status = stdout.rpartition(f"\n{EXIT}")
    if not found:
        return None
    code = status.strip()
    return (int(code) if code.isdigit() else None), said
