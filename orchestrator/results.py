"""What each step journals: its result and the state it saves, as small models.

A step builds its model and returns `model.journal()` (JSON for the journal); the report and later steps read a
result back with `Model.of(ctx.output(step))` or `Model.of(result)`, never by string keys. Unknown keys are
ignored and every field has a default, so a result journaled by an older run, or a step skipped on resume
(`{"already_in_place": true}`), still reads.
"""

from __future__ import annotations

from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field


class Contract(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    def journal(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True, by_alias=True)

    @classmethod
    def of(cls, data: dict[str, Any] | None) -> Self:
        return cls.model_validate(data or {})

    def bytes_moved(self) -> int:
        """Bytes this step sent over the network."""
        return 0


# --- transfers ---


class TrackerRef(Contract):
    """A tree's change tracker on the source (orchestrator/services/tracking.py), found again from these."""

    state_dir: str
    name: str
    unavailable: str | None = None  # why it could not start (the final pass then scans the whole tree)


class TreeComparison(Contract):
    """The full checksum comparison of a tree before the window (throttled, the source live)."""

    differing: int = 0  # items that differed (on a live tree: written since the pass; the final pass copies them)
    seconds: float = 0.0


class TreeFigures(Contract):
    bytes: int = 0
    files: int = 0
    total_size: int = 0
    entries: int | None = None  # files, directories and links in the tree (rsync's "Number of files")
    seconds: float = 0.0
    # files_presync: the tracker started before the pass, and the full comparison after it.
    tracker: TrackerRef | None = None
    compared: TreeComparison | None = None
    # files_final: "tracked" (only the changed paths) or "full_scan" (and why).
    mode: str | None = None
    listed: int | None = None  # paths in the change list the final pass copied or deleted
    deleted: int | None = None  # entries the final pass deleted on the target (gone from the source since)
    change_list: str | None = None  # that list, NUL-separated, on the source (verify_target reads the same)
    # repl_catchup's pre-window pass: where its list ended in the tracker's events file, once what it copied was
    # checked (what differed then is in the tracker's extra list): the final pass lists only what changed after it.
    since: int | None = None
    fallback_reason: str | None = None
    throttled_seconds: float = 0.0  # paused for the source's load (transfer.max_load)
    # files_final, tracked: how rsync reached the target ("daemon": the window's route; "ssh": -e ssh).
    route: str | None = None
    # files_final, tracked through the window's route: the comparison of the listed paths (rsync --dry-run
    # --checksum), run in the pass's own command right after it: how many differ (None: not compared there,
    # verify_target compares them itself) and the first of them.
    differing: int | None = None
    differing_items: list[str] = []


class FilesResult(Contract):
    """files_presync and files_final."""

    trees: dict[str, TreeFigures] = {}
    bytes: int = 0
    throttled_seconds: float = 0.0

    def bytes_moved(self) -> int:
        return self.bytes


class PresyncRound(Contract):
    round: int
    bytes: int
    files_size: int = 0
    seconds: float = 0.0


class DbPresyncResult(Contract):
    rounds: list[PresyncRound] = []
    converged: bool = False
    predicted_final_seconds: float | None = None
    throttled_seconds: float = 0.0  # paused for the source's load (transfer.max_load)
    # The files the rounds kept finding changed, read into each host's page cache before the window: "warmed N
    # bytes in S s", or why not.
    cache_warm: dict[str, str] = {}

    def bytes_moved(self) -> int:
        return sum(r.bytes for r in self.rounds)


class DbFinalResult(Contract):
    """The final datadir pass, the source database stopped."""

    final_pass_bytes: int = 0
    final_pass_files_size: int = 0
    final_pass_forced_files: int = 0
    final_pass_seconds: float | None = None
    # Inside the window, O(changes): the files this pass copied, checksummed on both hosts before the target starts.
    verified_files: int | None = None
    verify_seconds: float | None = None

    def bytes_moved(self) -> int:
        return self.final_pass_bytes


# --- the cut-over ---


class BinlogPosition(Contract):
    file: str
    position: int
    gtid: str | None = None


class LockFigures(Contract):
    lock_attempts: int | None = None
    lock_wait_seconds: float | None = None
    lock_acquired_at: float | None = None


class FinalState(LockFigures):
    """The source's figures read under the lock: journaled (saved) before the shutdown, the proof the target
    is compared against."""

    binlog: BinlogPosition | None = None
    # The tables the after-commit audit compares ("schema.table"), listed under the lock (O(tables), not O(data)).
    tables: list[str] | None = None
    # Row counts and checksums under the lock: only in a journal written before the audit moved them out of the window.
    row_counts: dict[str, int] | None = None
    checksums: dict[str, int | None] | None = None
    final_state_seconds: float | None = None


class CutoverResult(FinalState):
    mode: str | None = None
    # The engine's write fence in words (Database.fence_name); a journal written before it said none: MariaDB's lock.
    fence: str | None = None
    mode_reason: str | None = None
    writes_blocked_at: float | None = None
    shutdown_seconds: float | None = None
    # The source's clock minus ours, measured before the window (db_final dates the pre-sync's start with it).
    source_clock_offset: float | None = None
    write_block_seconds_so_far: float | None = None


# --- the replicate mode ---


class SeedResult(Contract):
    """repl_seed: the hot backup streamed into the target."""

    bytes: int = 0
    estimate_bytes: int | None = None
    stream_seconds: float | None = None
    prepare_seconds: float | None = None
    backup_stages: dict[str, str] = {}
    # What the backup cost the live source (its stamped log, to the millisecond): its commits held back, from the
    # BLOCK_COMMIT stage's start until every lock was released; DDL, from BLOCK_DDL's start.
    commits_blocked_seconds: float | None = None
    commits_blocked_at: float | None = None  # on the source's clock
    ddl_blocked_seconds: float | None = None
    gtid: str | None = None
    binlog_file: str | None = None
    binlog_position: int | None = None
    throttled_seconds: float = 0.0  # paused for the source's load or the app's latency (transfer.max_*)
    throttle: dict[str, Any] = {}  # the pauses: how many, what caused them, why each ended, the redo bound

    def bytes_moved(self) -> int:
        return self.bytes


class ReplicaResult(Contract):
    """repl_replica: the target a GTID replica of the source through the tunnel."""

    tunnel: str | None = None
    tunnel_port: int | None = None
    start_gtid: str | None = None
    services: list[str] = []


class CatchupResult(Contract):
    """repl_catchup: the comparison and the lag before the window."""

    compared_tables: int = 0
    compared_chunks: int = 0
    compare_seconds: float | None = None
    # Non-transactional tables every read of which raced a write (one line each): left to the after-commit audit.
    not_compared: list[str] = []
    snapshot_gtid: str | None = None
    lag_seconds: float | None = None
    lag_waited_seconds: float | None = None
    health_tries: dict[str, int] = {}  # the checks that passed before the window (their `when`: before, both)
    health_seconds: float | None = None
    prewindow_trees: dict[str, TreeFigures] = {}  # the last tracked pass of each tree before the window

    def bytes_moved(self) -> int:
        return sum(t.bytes for t in self.prewindow_trees.values())


class SwitchResult(Contract):
    """repl_switch: the window's switch from the source to the promoted replica."""

    mode: str = "replicate"
    mode_reason: str | None = None
    writes_blocked_at: float | None = None
    read_only_seconds: float | None = None
    fence_seconds: float | None = None  # the source's fence command (side by side with read_only)
    hold_seconds: float | None = None  # the window's start: journaled, the front door holding, in-flight drained
    # The same, when the source drives its door: journaled, then the hold, the drain and the fence in one command
    # there (hold_seconds and fence_seconds are None then: they are not apart).
    hold_and_fence_seconds: float | None = None
    # Writes stopped on the database (read_only and the final position; PostgreSQL: the clean stop) inside that
    # command, after its fence (read_only_seconds is None then).
    stopped_in_first_command: bool = False
    final_gtid: str | None = None
    wait_seconds: float | None = None
    promote_seconds: float | None = None
    executed_gtid: str | None = None
    switch_seconds: float | None = None
    # The in-window health checks, run side by side with the switch (None: not run here, verify_target runs them).
    health_tries: dict[str, int] | None = None
    health_seconds: float | None = None


# --- the target ---


class PrepareTargetResult(Contract):
    stopped: list[str] = []


class StartTargetResult(Contract):
    db_ready_seconds: float | None = None
    services: list[str] = []
    target_fenced: bool = False


class Compared(Contract):
    tables: int = 0
    compared: int = 0


class VerifyResult(Contract):
    health_tries: dict[str, int] = {}
    row_counts: Compared | None = None
    checksums: Compared | None = None
    trees_differing_items: dict[str, int] | None = None
    trees_verified: dict[str, str] | None = None  # what each tree's in-window comparison covered
    # Shutdown mode: the target's consistent snapshot, taken inside the window while it is fenced (O(1)), which the
    # after-commit audit reads.
    audit_snapshot_at: float | None = None


class AuditResult(Contract):
    """The after-commit audit. Shutdown mode (method "figures"): row counts and CHECKSUM TABLE of every table, the
    target's snapshot taken before its fence lifted against the stopped source, started read-only and isolated.
    Replicate mode (method "chunks"): checksums over primary-key chunks, as repl_catchup compares, the target's
    snapshot opened at the promotion against the read-only source at its final position (`at_gtid`).

    status: "equal", "differs" (names the tables, and the chunks in replicate mode), "incomplete" (one side could
    not be read: nothing proven), "not_run" (why: no snapshot, e.g. the process that took it is gone), "off" (the
    plan asks for neither figure), "not_needed" (older replicate runs: compared before the window only)."""

    status: str = "not_run"
    reason: str | None = None
    method: str = "figures"
    # The engine's whole-table checksum in words (Database.checksum_name); None in an older journal: CHECKSUM TABLE.
    checksum_name: str | None = None
    tables: int = 0
    chunks: int | None = None  # replicate mode: the chunks compared
    rows: int | None = None  # replicate mode: the source's rows compared
    at_gtid: str | None = None  # replicate mode: the source's final position both sides were compared at
    row_counts: dict[str, int] | None = None  # the source's (equal to the target's when status is "equal")
    checksums_compared: int = 0
    differences: list[str] = []
    # Non-transactional tables are outside the snapshot: read live after the commit, a difference may be a write
    # made since (reported, not counted as a loss).
    live_differences: list[str] = []
    source_seconds: float | None = None
    target_seconds: float | None = None
    seconds: float | None = None

    @property
    def needs_attention(self) -> bool:
        return self.status in ("differs", "incomplete")

    def cost(self) -> str | None:
        """What the audit read and how long it took, in words (None: it read nothing)."""
        if self.seconds is None or self.status in ("off", "not_needed", "not_run"):
            return None
        read = f"{self.tables} table(s)"
        if self.rows is not None:
            read += f", {self.rows} row(s) in {self.chunks or 0} chunk(s)"
        return f"{read} in {self.seconds:g} s, after the commit (outside the window)"

    def summary(self) -> str | None:
        """One line for the console and `status` when the audit did not prove the data equal (None: it did, or
        there was nothing to audit)."""
        if self.status == "differs":
            return (f"AUDIT: {len(self.differences)} difference(s) between the target (as migrated) and the source: "
                    + "; ".join(self.differences[:5]) + (" ..." if len(self.differences) > 5 else "")
                    + " (the run is committed: see the report" + ("" if self.method == "chunks" else
                    "; the source's datadir is kept as it was") + ")")  # fmt: skip
        if self.status == "incomplete":
            return f"AUDIT incomplete (nothing proven): {self.reason}"
        if self.status == "not_run":
            return f"audit not run: {self.reason}"
        if self.live_differences:
            return "audit: non-transactional tables read live after the commit differ (may be writes since): " + (
                "; ".join(self.live_differences[:5])
            )
        return None


class RecordSnapshot(Contract):
    """A DNS record as it was before the flip (saved before its edit)."""

    id: str
    name: str
    type: str | None = None
    content: str
    ttl: int | None = None
    proxied: bool | None = None


class DnsFlipResult(Contract):
    records: list[str] = []
    new_content: str | None = None
    old: list[RecordSnapshot] = []
    flipped_at: float | None = None
    target_fence_lifted: bool = False
    write_block_seconds: float | None = None


class SwitchTrafficResult(Contract):
    """The commit at the front door: when the run committed, and when writes flowed again (the door forwarding)."""

    committed_at: float | None = None
    writes_flow_at: float | None = None
    target_fence_lifted: bool = False
    write_block_seconds: float | None = None


class FinishResult(Contract):
    source: str | None = None
    source_services_stopped: list[str] = []
    write_block_seconds: float | None = None
    # Replicate mode: the reverse path (old source a replica of the target) and its teardown.
    reverse_replication: dict[str, Any] | None = None
    # The run's total so far, as the report counted it (not this step's own transfer).
    run_bytes_moved: int | None = Field(default=None, alias="bytes_moved")
    # The orchestrator's peak resident memory so far (getrusage ru_maxrss), in MiB.
    peak_rss_mib: float | None = None
    # Round trips this process made while writes were blocked, by step and kind (transports/meter.py): the report's
    # window parts carry them.
    round_trips: dict[str, dict[str, int]] | None = None
    trackers_stopped: list[str] = []
    # The source's front door (plan section `proxy`): requests that still arrived at the old address after the
    # commit (forwarded to the target), and the earliest moment the source may stop forwarding.
    requests_at_old_address: int | None = None
    forwarded_to: str | None = None
    forwarding_until: float | None = None
    # With proxy.source.wait_forwarding: finish waited until forwarding_until; the requests that arrived after the
    # records' TTL had run out (clients or resolvers keeping an answer longer than its TTL).
    forwarding_waited: bool = False
    requests_after_ttl: int | None = None


# Each step's result model, by step name (what the report reads).
RESULTS: dict[str, type[Contract]] = {
    "prepare_target": PrepareTargetResult,
    "files_presync": FilesResult,
    "db_presync": DbPresyncResult,
    "cutover": CutoverResult,
    "db_final": DbFinalResult,
    "repl_seed": SeedResult,
    "repl_replica": ReplicaResult,
    "repl_catchup": CatchupResult,
    "repl_switch": SwitchResult,
    "files_final": FilesResult,
    "start_target": StartTargetResult,
    "verify_target": VerifyResult,
    "switch_traffic": SwitchTrafficResult,
    "dns_flip": DnsFlipResult,
    "audit": AuditResult,
    "finish": FinishResult,
}


def result_of(step: str, data: dict[str, Any] | None) -> Contract:
    """The typed result of `step` (a bare Contract for a step without a model, e.g. preflight's figures)."""
    return RESULTS.get(step, Contract).of(data)
