"""Cut-over: the moment writes stop on the source and its database's final state is copied to the target.

A file copy of a running InnoDB is not consistent even under FLUSH TABLES WITH READ LOCK (purge, page
flushing and change-buffer merges keep writing), so the lock only freezes SQL writes long enough to record
the final figures; the source database is then shut down cleanly and the final datadir pass copies files
nothing is writing any more.

Order, each fact journaled BEFORE the action it protects, so a crash at any point leaves a state undo can
repair: fence the service → FTWRL (bounded wait, retried with backoff) → binlog position and row counts
under the lock → clean shutdown of the source database → final datadir pass → budget check.

"Stopped" is proven, not assumed: a stop command may return while the server is still shutting down (MariaDB
closes client connections early, before InnoDB has flushed), so after it the step waits until no process on
the source holds the datadir's InnoDB files open. Everything after the fence is bounded by what is left of
the write-block budget (cutover.max_write_block).
"""

from __future__ import annotations

import contextlib
import re
import shlex
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pymysql

from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.secrets import redact
from orchestrator.steps.db_presync import DATADIR_EXCLUDES
from orchestrator.steps.window import bounded_retry
from orchestrator.transports import mysql as mysql_tx
from orchestrator.transports import rsync
from orchestrator.transports.ssh import TransportError

ER_LOCK_WAIT_TIMEOUT = 1205
SOURCE_DB_START_TIMEOUT = 120.0
# How often the source is asked whether anything still holds the datadir's InnoDB files open.
RELEASE_POLL_INTERVAL = 0.05
# The datadir's InnoDB files (ibdata*, ib_logfile*, ibtmp1, redo and temporary directories of MySQL 8, undo
# tablespaces): the server holds them open until its shutdown has flushed everything.
INNODB_FILES = ("ib*", "#innodb_redo/*", "#innodb_temp/*", "undo*")
MAX_HOLDERS_LISTED = 5
RUNNING = "(running)"
# Files changed on the source since the pre-sync began (less this margin, for the clock offset's error)
# are recopied whatever their size and mtime say.
FORCE_MARGIN = 2.0
QUERY_SUMMARY_CHARS = 80
MODE_REASON = (
    "a file copy of a running InnoDB is not consistent under FLUSH TABLES WITH READ LOCK; the source "
    "database is stopped cleanly while writes are blocked and the final pass copies its quiet datadir"
)

# A statement that may carry a password (SET PASSWORD, IDENTIFIED BY [PASSWORD] / AS / USING / VIA, PASSWORD(),
# MASTER_PASSWORD=, ...) has EVERY string literal masked: listing the forms one by one always misses one.
_SECRET_STATEMENT = re.compile(r"PASSWORD|IDENTIFIED|\bUSING\s+['\"]", re.IGNORECASE)
# A quoted literal with its escapes ('it''s', 'a\'b'), or an unterminated one (a truncated query) to the end.
_LITERAL = re.compile(r"""'(?:[^'\\]|\\.|'')*(?:'|$)|"(?:[^"\\]|\\.|"")*(?:"|$)""", re.DOTALL)


@dataclass(frozen=True)
class Blocker:
    """A session that held up FLUSH TABLES WITH READ LOCK."""

    id: int
    user: str
    command: str
    seconds: int
    state: str
    query: str

    def summary(self) -> str:
        query = f": {self.query}" if self.query else ""
        return f"#{self.id} {self.user} {self.command} for {self.seconds}s{query}"


def mask_query(text: str | None, limit: int = QUERY_SUMMARY_CHARS) -> str:
    """One line of a query, secrets masked, truncated: safe for logs and error messages."""
    if not text:
        return ""
    line = " ".join(text.split())
    if _SECRET_STATEMENT.search(line):
        line = _LITERAL.sub("'***'", line)
    line = redact(line)
    return line if len(line) <= limit else line[: limit - 1] + "…"


def find_blockers(conn: pymysql.connections.Connection) -> list[Blocker]:
    """Sessions other than ours that are running something, longest first."""
    with conn.cursor() as cur:
        cur.execute(
            "SELECT ID, USER, COMMAND, TIME, STATE, INFO FROM information_schema.PROCESSLIST "
            "WHERE ID <> CONNECTION_ID() AND COMMAND NOT IN ('Sleep', 'Daemon', 'Binlog Dump', 'Killed') "
            "ORDER BY TIME DESC LIMIT 10"
        )
        rows = cur.fetchall()
    return [
        Blocker(
            id=int(row[0]),
            user=str(row[1] or ""),
            command=str(row[2] or ""),
            seconds=int(row[3] or 0),
            state=str(row[4] or ""),
            query=mask_query(row[5]),
        )
        for row in rows
    ]


def tables_in_use(conn: pymysql.connections.Connection, limit: int = 10) -> list[str]:
    """Tables some session holds open or locked (LOCK TABLES leaves no running query to show)."""
    with conn.cursor() as cur:
        cur.execute("SHOW OPEN TABLES WHERE In_use > 0")
        rows = cur.fetchall()
    return [f"{row[0]}.{row[1]}" for row in rows[:limit]]


def summarize_blockers(blockers: list[Blocker], in_use: list[str] | None = None, limit: int = 3) -> str:
    parts: list[str] = []
    if blockers:
        parts.append("; ".join(b.summary() for b in blockers[:limit]))
        if len(blockers) > limit:
            parts.append(f"and {len(blockers) - limit} more")
    if in_use:
        parts.append("tables in use: " + ", ".join(in_use))
    if not parts:
        return "no running query seen (the blocker may have finished)"
    return "; ".join(parts)


def backoff_delays(attempts: int, first: float) -> list[float]:
    """Seconds to wait after each failed attempt but the last: first, 2*first, 4*first, ..."""
    return [first * (2**i) for i in range(max(attempts - 1, 0))]


def binlog_position(conn: pymysql.connections.Connection) -> dict[str, Any] | None:
    """The binlog file and position (and GTID when known), or None when binary logging is off."""
    row: tuple[Any, ...] | None = None
    for statement in ("SHOW BINLOG STATUS", "SHOW BINARY LOG STATUS", "SHOW MASTER STATUS"):
        try:
            with conn.cursor() as cur:
                cur.execute(statement)
                row = cur.fetchone()
            break
        except pymysql.err.ProgrammingError:
            continue  # syntax this server does not know: try the next spelling
    if not row:
        return None
    position: dict[str, Any] = {"file": row[0], "position": int(row[1])}
    with conn.cursor() as cur:
        try:
            cur.execute("SELECT @@GLOBAL.gtid_binlog_pos")
            gtid = cur.fetchone()
        except pymysql.err.MySQLError:
            gtid = None
    if gtid and gtid[0]:
        position["gtid"] = gtid[0]
    return position


def presync_began(ctx: StepContext) -> float | None:
    """When this run's datadir pre-sync started (orchestrator clock), from the journal; None if unknown."""
    events = ctx.history()
    starts = [ev["ts"] for ev in events if ev.get("event") == "step_started" and ev.get("step") == "db_presync"]
    return float(starts[0]) if starts else None


def source_clock_offset(rt: Any) -> float:
    """The source's clock minus ours, within about the round trip of one SSH command."""
    asked = time.time()
    answer = rt.source.run("date +%s.%N", timeout=30).stdout.strip()
    answered = time.time()
    return float(answer) - (asked + answered) / 2


def glob_escape(path: str) -> str:
    """`path` as a literal for find's -lname (fnmatch): its *, ?, [ and backslashes escaped."""
    return re.sub(r"([*?\[\\])", r"\\\1", path)


def innodb_holders_command(datadir: str, pids: Iterable[int] = ()) -> str:
    """A command for the source: '/proc/<pid>/fd <file>' for every open descriptor on the datadir's InnoDB files,
    and '/proc/<pid>/fd (running)' for each of `pids` (the server's, seen before its stop) still running.

    /proc/<pid>/fd/* links name the real path, so `datadir` must be resolved (readlink -f) first. Processes that
    vanish during the scan, and those the ssh user may not look into, are silently skipped: see
    `innodb_files_visible` for the latter. A zombie (exited, not yet reaped) is not running.
    """
    base = glob_escape(datadir.rstrip("/") or "/")
    tests = " -o ".join(f"-lname {shlex.quote(base + '/' + name)}" for name in INNODB_FILES)
    command = f"find /proc/[0-9]*/fd -mindepth 1 -maxdepth 1 \\( {tests} \\) -printf '%h %l\\n' 2>/dev/null"
    for pid in sorted(set(pids)):
        stat = f"/proc/{int(pid)}/stat"
        command += (
            f"; s=$(sed 's/.*) //' {stat} 2>/dev/null | cut -d' ' -f1)"
            f'; [ -n "$s" ] && [ "$s" != Z ] && echo \'/proc/{int(pid)}/fd {RUNNING}\''
        )
    return command + "; true"


def parse_holders(output: str) -> dict[int, set[str]]:
    """innodb_holders_command's output → {pid: {open InnoDB files}}."""
    holders: dict[int, set[str]] = {}
    for line in output.splitlines():
        fd_dir, _, target = line.partition(" ")
        parts = fd_dir.split("/")  # /proc/<pid>/fd
        if len(parts) == 4 and parts[2].isdigit():
            holders.setdefault(int(parts[2]), set()).add(target)
    return holders


def describe_holders(holders: dict[int, set[str]]) -> str:
    items = []
    for pid, files in sorted(holders.items()):
        held = sorted(files - {RUNNING})
        items.append(f"pid {pid} holds {', '.join(held[:2])} open" if held else f"pid {pid} still runs")
    more = f" and {len(items) - MAX_HOLDERS_LISTED} more" if len(items) > MAX_HOLDERS_LISTED else ""
    return "; ".join(items[:MAX_HOLDERS_LISTED]) + more


def real_datadir(host: Any, datadir: str) -> str:
    """The datadir with every symbolic link resolved, as the kernel names its files in /proc/<pid>/fd."""
    resolved = host.run(f"readlink -f -- {shlex.quote(datadir)}", timeout=60).stdout.strip()
    return resolved or datadir


def innodb_holders(
    host: Any, datadir: str, timeout: float | None = 60.0, pids: Iterable[int] = ()
) -> dict[int, set[str]]:
    """Processes on `host` that hold the InnoDB files of the (resolved) `datadir` open, and those of `pids` alive."""
    return parse_holders(host.run(innodb_holders_command(datadir, pids), timeout=timeout, check=False).stdout)


def innodb_files_visible(host: Any, datadir: str) -> tuple[set[int], str | None]:
    """While the database runs: the pids holding its InnoDB files, or why none can be seen.

    The check that the database has really stopped relies on seeing them: an ssh user who may not look into
    the server's /proc/<pid>/fd sees nothing, and nothing would look like stopped.
    """
    holders = innodb_holders(host, datadir)
    if holders:
        return set(holders), None
    return set(), (
        f"no process is seen holding the InnoDB files of {datadir} open while the database runs: the cut-over "
        "could not prove the source database has stopped; connect as root (or as the database's user) and check "
        "that database.source.datadir is the server's datadir"
    )


class Cutover(Step):
    name = "cutover"
    title = "Cut-over: fence, lock, final figures, clean shutdown of the source database, final datadir pass"
    begins_downtime = True

    def __init__(self) -> None:
        self._lock_conn: pymysql.connections.Connection | None = None
        self._clock_offset = 0.0
        self._datadir = ""
        # The database server's processes, seen holding its InnoDB files before the stop: they must be gone after.
        self._server_pids: set[int] = set()

    def describe(self, ctx: StepContext) -> list[str]:
        plan = ctx.rt.plan
        c = plan.cutover
        fence = plan.services.fence.enable
        lines = [
            f"on {plan.source.address}: fence the service: {fence}"
            if fence
            else "no fence command: writes are blocked by the database lock only",
            f"FLUSH TABLES WITH READ LOCK on the source database, waiting at most {c.lock_wait_timeout:g} s, "
            f"{c.lock_attempts} tries with backoff from {c.lock_retry_backoff:g} s",
            "under the lock: binlog position, row counts of every table"
            + (" and CHECKSUM TABLE" if plan.database.verify.checksum else ""),
            f"on {plan.source.address}: stop the source database cleanly: {plan.database.source.stop}",
            f"final pass of {plan.database.source.datadir} → "
            f"{plan.target.address}:{plan.database.target.datadir} (full speed, delta transfer; every file "
            "changed since the pre-sync began is recopied)",
            f"writes may stay blocked at most {c.max_write_block:g} s (cutover.max_write_block)",
        ]
        return lines

    def check(self, ctx: StepContext) -> bool:
        return False  # never skipped: re-running is safe and the final pass is cheap when nothing changed

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        rt = ctx.rt
        plan = rt.plan
        result: dict[str, Any] = {"mode": plan.cutover.mode, "mode_reason": MODE_REASON}
        # Measured before writes stop: one round trip less inside the window.
        self._clock_offset = source_clock_offset(rt)
        self._datadir = real_datadir(rt.source, plan.database.source.datadir)

        if ctx.saved("source_db_stopped"):
            # A re-run after the shutdown began: the final figures were journaled under the lock; a
            # stopped database has none to give. Make sure it is down (the stop is idempotent), redo the
            # final pass.
            ctx.log.info("cutover.resume_after_shutdown")
            blocked_at = float(ctx.saved("writes_blocked_at"))
            rt.budget.start(blocked_at)
            result.update(ctx.saved("final_state") or {})
            self._stop_source_db(ctx)
        else:
            try:
                # The lock's session is opened while writes still flow: connecting is not part of the window.
                conn = self._open_lock_session(ctx)
                # Before the window too: proving the shutdown later needs the server's open files to be visible.
                self._server_pids, blind = innodb_files_visible(rt.source, self._datadir)
                if blind:
                    raise StepError(blind)
                blocked_at = self._fence(ctx)
                result["writes_blocked_at"] = blocked_at
                lock = self._take_lock(ctx, conn)
                result.update(lock)
                final_state = self._final_state(ctx)
                ctx.save("final_state", {**lock, **final_state})
                result.update(final_state)
                rt.budget.check("about to stop the source database")
                ctx.save("source_db_stopped", True)
                result["shutdown_seconds"] = self._stop_source_db(ctx)
            finally:
                self._release_lock()
        result["writes_blocked_at"] = blocked_at

        rt.budget.check("finishing the cut-over's shutdown")
        result.update(self._final_pass(ctx))
        rt.budget.check("the final datadir pass")
        result["write_block_seconds_so_far"] = round(time.time() - blocked_at, 3)
        return result

    def undo(self, ctx: StepContext) -> None:
        rt = ctx.rt
        plan = rt.plan
        self._release_lock()
        if ctx.saved("source_db_stopped"):
            ctx.log.info("cutover.undo.start_source_db", command=plan.database.source.start)
            rt.source.run(plan.database.source.start, timeout=SOURCE_DB_START_TIMEOUT)
            self._wait_source_db(ctx, SOURCE_DB_START_TIMEOUT)
            ctx.save("source_db_stopped", False)
        if ctx.saved("fenced") and plan.services.fence.disable:
            ctx.log.info("cutover.undo.lift_fence", command=plan.services.fence.disable)
            rt.source.run(plan.services.fence.disable, timeout=60)
            ctx.save("fenced", False)

    # -- the sequence

    def _fence(self, ctx: StepContext) -> float:
        rt = ctx.rt
        fence = rt.plan.services.fence.enable
        saved_at = ctx.saved("writes_blocked_at")
        # Counted from just before the fence goes up (the conservative end); on a re-run, from the first fence.
        blocked_at = float(saved_at) if saved_at else time.time()
        if fence:
            ctx.save("fenced", True)
        if not saved_at:
            ctx.save("writes_blocked_at", blocked_at)
        if fence:
            rt.source.run(fence, timeout=60)
        rt.budget.start(blocked_at)
        ctx.log.info("cutover.fenced", fence=bool(fence))
        return blocked_at

    def _open_lock_session(self, ctx: StepContext) -> pymysql.connections.Connection:
        rt = ctx.rt
        c = rt.plan.cutover
        # The session must outlive the longest lock wait: a client read timeout would drop it (and the lock).
        conn = rt.db("source", read_timeout=max(rt.plan.database.read_timeout, c.lock_wait_timeout + 30))
        self._lock_conn = conn
        with conn.cursor() as cur:
            # Whole seconds: MariaDB refuses a fractional lock_wait_timeout.
            cur.execute("SET SESSION lock_wait_timeout = %s", (max(1, round(c.lock_wait_timeout)),))
        return conn

    def _take_lock(self, ctx: StepContext, conn: pymysql.connections.Connection) -> dict[str, Any]:
        c = ctx.rt.plan.cutover
        delays = backoff_delays(c.lock_attempts, c.lock_retry_backoff)
        waited = 0.0
        last_blockers: list[Blocker] = []
        last_in_use: list[str] = []
        for attempt in range(1, c.lock_attempts + 1):
            asked = time.monotonic()
            try:
                with conn.cursor() as cur:
                    cur.execute("FLUSH TABLES WITH READ LOCK")
            except pymysql.err.OperationalError as exc:
                waited += time.monotonic() - asked
                if exc.args and exc.args[0] != ER_LOCK_WAIT_TIMEOUT:
                    detail = redact(str(exc.args[-1]))
                    raise StepError(f"FLUSH TABLES WITH READ LOCK failed: {detail}") from None
                last_blockers = find_blockers(conn)
                last_in_use = tables_in_use(conn)
                ctx.log.warning(
                    "cutover.lock_wait_timeout",
                    attempt=attempt,
                    of=c.lock_attempts,
                    waited_s=round(waited, 3),
                    blocked_by=[b.summary() for b in last_blockers],
                    tables_in_use=last_in_use,
                )
                if attempt <= len(delays):
                    ctx.rt.budget.check(f"waiting for FLUSH TABLES WITH READ LOCK ({attempt} tries)")
                    time.sleep(delays[attempt - 1])
                continue
            waited += time.monotonic() - asked
            acquired_at = time.time()
            ctx.log.info("cutover.locked", attempt=attempt, lock_wait_s=round(waited, 3))
            return {
                "lock_attempts": attempt,
                "lock_wait_seconds": round(waited, 3),
                "lock_acquired_at": acquired_at,
            }
        raise StepError(
            f"could not get FLUSH TABLES WITH READ LOCK in {c.lock_attempts} tries of "
            f"{c.lock_wait_timeout:g} s: blocked by {summarize_blockers(last_blockers, last_in_use)}"
        )

    def _final_state(self, ctx: StepContext) -> dict[str, Any]:
        rt = ctx.rt
        conn = self._lock_conn
        assert conn is not None
        budget = rt.budget
        started = time.monotonic()
        doing = "reading the source's final figures"

        def _limit(table: str) -> float | None:
            # One query per table, each bounded by what is left of the budget (a query cut short closes the
            # lock's session, which releases the lock: the step fails and undo lifts the fence).
            budget.check(f"{doing}: {table}")
            remaining = budget.remaining()
            return None if remaining is None else max(remaining, 0.1)

        try:
            tables = mysql_tx.list_tables(conn, rt.plan.database.schemas)
            state: dict[str, Any] = {"binlog": binlog_position(conn)}
            doing = "counting the source's rows under the lock"
            state["row_counts"] = dict(mysql_tx.row_counts(conn, tables, limit=_limit))
            if rt.plan.database.verify.checksum:
                doing = "checksumming the source's tables under the lock"
                state["checksums"] = dict(mysql_tx.checksums(conn, tables, limit=_limit))
        except pymysql.err.MySQLError:
            budget.check(doing)  # a query cut short by the budget: say so
            raise
        state["final_state_seconds"] = round(time.monotonic() - started, 3)
        ctx.log.info("cutover.final_state", tables=len(tables), binlog=state["binlog"])
        return state

    def _time_left(self, ctx: StepContext) -> float:
        """Seconds the next action inside the window may take: what is left of the budget."""
        remaining = ctx.rt.budget.remaining()
        return ctx.rt.plan.cutover.max_write_block if remaining is None else max(remaining, 0.1)

    def _stop_source_db(self, ctx: StepContext) -> float:
        rt = ctx.rt
        endpoint = rt.plan.database.source
        started = time.monotonic()
        stop_timeout = min(rt.plan.database.read_timeout + 300, self._time_left(ctx))
        try:
            rt.source.run(endpoint.stop, timeout=stop_timeout)
        except TransportError:
            rt.budget.check("stopping the source database")  # cut short by the budget: say so
            raise
        # First the files (a stop command may return while the server is still shutting down, and a server
        # about to close its connections may still answer), then the server itself must be gone.
        self._wait_innodb_released(ctx)
        if self._source_db_answers(ctx):
            raise StepError(
                f"the source database is still running after its stop command ({endpoint.stop}): it still"
                " answers; writes stay blocked"
            )
        seconds = round(time.monotonic() - started, 3)
        ctx.log.info("cutover.source_db_stopped", seconds=seconds)
        return seconds

    def _wait_innodb_released(self, ctx: StepContext) -> None:
        """Wait until no process on the source holds the datadir's InnoDB files open, within the budget.

        A stop command may return before the server is gone (it only signalled it, or gave up waiting): until
        then InnoDB may still be flushing, and a copy of the datadir would not be consistent. The server's
        processes seen before the stop must have exited too (after closing InnoDB, a server still closes its
        binary and Aria logs in the datadir).
        """
        rt = ctx.rt
        datadir = self._datadir or real_datadir(rt.source, rt.plan.database.source.datadir)
        started = time.monotonic()
        polls = 0
        while True:
            try:
                holders = innodb_holders(rt.source, datadir, timeout=self._time_left(ctx), pids=self._server_pids)
            except TransportError:
                rt.budget.check("waiting for the source database to stop")
                raise
            polls += 1
            if not holders:
                ctx.log.info("cutover.innodb_released", waited_s=round(time.monotonic() - started, 3), polls=polls)
                return
            remaining = rt.budget.remaining()
            if remaining is None or remaining <= 0:
                raise StepError(
                    f"the source database is still running after its stop command ({rt.plan.database.source.stop}):"
                    f" {describe_holders(holders)} after {time.monotonic() - started:.1f} s, and the write-block"
                    f" budget (cutover.max_write_block {rt.plan.cutover.max_write_block:g} s) is spent"
                )
            time.sleep(min(RELEASE_POLL_INTERVAL, remaining))

    def _source_db_answers(self, ctx: StepContext) -> bool:
        conn = self._lock_conn
        if conn is not None:
            # The session holding the lock dies with the server: a live ping means it is still up.
            try:
                conn.ping(reconnect=False)
            except (pymysql.err.MySQLError, OSError):
                return False
            return True
        return bool(ctx.rt.db_answers("source"))

    def _final_pass(self, ctx: StepContext) -> dict[str, Any]:
        started = time.monotonic()
        rt = ctx.rt
        plan = rt.plan
        forced = self._mark_recent_files_stale(ctx)
        command = rsync.push_command(
            plan,
            plan.database.source.datadir,
            plan.database.target.datadir,
            exclude=DATADIR_EXCLUDES,
            live=False,  # the downtime window: no bandwidth limit, no nice
            inplace=True,
            # rsync's quick check compares whole seconds by default: a file rewritten in the second it was
            # last copied, at the same size, would be skipped. Nanoseconds close that gap.
            # Delta transfer whatever transfer.whole_file says: the target holds a pre-synced copy of every
            # file, so only the blocks written since travel (a hot table is mostly unchanged), and this pass
            # is the one inside the downtime window.
            extra=["--modify-window=-1", "--no-whole-file"],
        )
        # Bounded by what is left of the write-block budget, retries included: a pass that cannot finish in time
        # fails here and the run rolls back, instead of keeping writes blocked past the budget.
        remaining = max(1.0, rt.budget.remaining() or plan.cutover.max_write_block)
        retry = bounded_retry(plan.retry, remaining)
        stats = rsync.push(rt.source, command, what="final datadir pass", retry=retry, timeout=remaining)
        # With delta transfer, the literal data is what travelled; the files' size is what was brought up to date.
        moved = stats.literal_bytes
        seconds = round(time.monotonic() - started, 3)
        ctx.log.info(
            "cutover.final_pass", bytes=moved, files_size=stats.transferred_bytes, forced=forced, seconds=seconds
        )
        return {
            "final_pass_bytes": moved,
            "final_pass_files_size": stats.transferred_bytes,
            "final_pass_forced_files": forced,
            "final_pass_seconds": seconds,
        }

    def _mark_recent_files_stale(self, ctx: StepContext) -> int:
        """Make the final pass copy every file the source changed since the pre-sync began.

        Size and mtime are not proof of equal content: a file rewritten within the timestamp tick in which a
        pre-sync round read it keeps the mtime the target copy got. Files last written before the pre-sync
        began were copied whole by its first round. Setting the target copies' mtime to the epoch forces rsync
        to transfer them; unknown start (no journal): every file.
        """
        rt = ctx.rt
        db = rt.plan.database
        began = presync_began(ctx)
        newer = ""
        if began is not None:
            since = began + self._clock_offset - FORCE_MARGIN
            newer = f" -newermt @{since:.3f}"
        listing = rt.source.run(
            f"cd {shlex.quote(db.source.datadir)} && find . -type f{newer} -print0", timeout=600
        ).stdout
        names = [name for name in listing.split("\0") if name]
        if names:
            rt.target.run(
                f"cd {shlex.quote(db.target.datadir)} && xargs -0 -r touch -c -m -d @0 --",
                input="\0".join(names) + "\0",
                timeout=600,
            )
        ctx.log.info("cutover.forced_files", files=len(names), presync_began=began)
        return len(names)

    def _wait_source_db(self, ctx: StepContext, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ctx.rt.db_answers("source"):
            if time.monotonic() > deadline:
                raise StepError(f"the source database did not answer within {timeout:g} s of its start command")
            time.sleep(0.5)

    def _release_lock(self) -> None:
        conn, self._lock_conn = self._lock_conn, None
        if conn is None:
            return
        # Closing the session releases FTWRL; a server already gone released it too.
        with contextlib.suppress(pymysql.err.MySQLError, OSError):
            conn.close()
