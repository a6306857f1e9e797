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


class TreeFigures(Contract):
    bytes: int = 0
    files: int = 0
    total_size: int = 0
    seconds: float = 0.0


class FilesResult(Contract):
    """files_presync and files_final."""

    trees: dict[str, TreeFigures] = {}
    bytes: int = 0

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

    def bytes_moved(self) -> int:
        return sum(r.bytes for r in self.rounds)


class DbFinalResult(Contract):
    """The final datadir pass, the source database stopped."""

    final_pass_bytes: int = 0
    final_pass_files_size: int = 0
    final_pass_forced_files: int = 0
    final_pass_seconds: float | None = None

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
    row_counts: dict[str, int] | None = None
    checksums: dict[str, int | None] | None = None
    final_state_seconds: float | None = None


class CutoverResult(FinalState):
    mode: str | None = None
    mode_reason: str | None = None
    writes_blocked_at: float | None = None
    shutdown_seconds: float | None = None
    # The source's clock minus ours, measured before the window (db_final dates the pre-sync's start with it).
    source_clock_offset: float | None = None
    write_block_seconds_so_far: float | None = None


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


class FinishResult(Contract):
    source: str | None = None
    source_services_stopped: list[str] = []
    write_block_seconds: float | None = None
    # The run's total so far, as the report counted it (not this step's own transfer).
    run_bytes_moved: int | None = Field(default=None, alias="bytes_moved")
    # The source's front door (plan section `proxy`): requests that still arrived at the old address after the
    # commit (forwarded to the target), and the earliest moment the source may stop forwarding.
    requests_at_old_address: int | None = None
    forwarded_to: str | None = None
    forwarding_until: float | None = None


# Each step's result model, by step name (what the report reads).
RESULTS: dict[str, type[Contract]] = {
    "prepare_target": PrepareTargetResult,
    "files_presync": FilesResult,
    "db_presync": DbPresyncResult,
    "cutover": CutoverResult,
    "db_final": DbFinalResult,
    "files_final": FilesResult,
    "start_target": StartTargetResult,
    "verify_target": VerifyResult,
    "dns_flip": DnsFlipResult,
    "finish": FinishResult,
}


def result_of(step: str, data: dict[str, Any] | None) -> Contract:
    """The typed result of `step` (a bare Contract for a step without a model, e.g. preflight's figures)."""
    return RESULTS.get(step, Contract).of(data)
