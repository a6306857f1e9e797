"""Proof that nothing acknowledged was lost: every write the load generator was told was stored is on the host.

    python -m migrate_lab.verify --lab DIR [--host target] [--load-dir DIR] [--json FILE]

Reads <load dir>/acks.jsonl (written by the load generator, one line per acknowledged write) and checks, on the
chosen host (the target by default):
- every acknowledged review is in its database with the same content (sha256 of author, course, rating, body);
- every acknowledged upload is in its uploads directory with the same sha256, and has its row in `uploads`.
It adds the run's figures from stats.json (longest write stall, failed reads and writes) and, from requests.jsonl,
the failed requests by cause (refused, fenced, timeout, other) and request latency p50 / p99 / max for the run and,
given the migrate journal (--journal), inside its window (writes blocked → DNS flip). It compares the uploads
trees: whether every file of the other host (the one the service moved from) is on the checked host byte for byte,
and how many files only the checked host has (uploads made there after the flip: expected). Prints a human report,
writes it as JSON (<load dir>/verify-<host>.json by default), and exits 1 when anything acknowledged is lost, 2 when
it cannot check (no acknowledgements journal, database unreachable), 0 otherwise.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib
import json
import os
import stat
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from migrate_lab import appdb
from migrate_lab.app import db_connect, review_digest
from migrate_lab.load import (
    ACKS_FILE,
    REQUESTS_FILE,
    STATS_FILE,
    journal_window,
    read_requests,
    request_figures,
    request_lines,
)
from migrate_lab.state import APP_VERIFY_MODULES, LabState

EXIT_OK = 0
EXIT_LOST = 1
EXIT_CANNOT_VERIFY = 2
# How many lost keys / tree differences a report lists (the counts are always complete).
LIST_LIMIT = 20
QUERY_BATCH = 500
SHOWN_DIFFERENCES = 5  # in the human report


@dataclass
class VerifyReport:
    host: str
    load_dir: str
    checked_at: float = field(default_factory=lambda: round(time.time(), 3))
    reviews_acknowledged: int = 0
    reviews_lost: int = 0  # acknowledged, not in the database
    reviews_altered: int = 0  # in the database with other content than acknowledged
    uploads_acknowledged: int = 0
    uploads_lost: int = 0  # file missing, or its sha256 differs
    upload_rows_lost: int = 0  # row missing from `uploads`, or its sha256 differs
    uploads_deleted: int = 0  # names whose last acknowledged write was a delete
    deletes_undone: int = 0  # of those, still there (the file or its row): an acknowledged delete lost
    lost: list[str] = field(default_factory=list)  # the first lost review ids / upload names
    # From the load run's stats.json (None when it has none).
    longest_write_stall_s: float | None = None
    longest_ack_gap_s: float | None = None
    write_attempts_failed: int | None = None
    writes_pending_at_end: int | None = None
    longest_pending_s: float | None = None
    reads_failed: int | None = None
    reads_missing: int | None = None
    per_server: dict[str, Any] = field(default_factory=dict)
    server_names: dict[str, str] = field(default_factory=dict)
    # From requests.jsonl: failed requests by kind and cause, latency for the run and inside the window.
    requests_failed: dict[str, dict[str, int]] = field(default_factory=dict)
    latency: dict[str, dict[str, float]] = field(default_factory=dict)
    window: dict[str, Any] | None = None
    trees_identical: bool | None = None  # both trees hold exactly the same entries
    # Every entry of the source's tree is on the target, identical (after a migration the target also holds
    # what clients uploaded after the flip, so this is the property that matters then).
    source_tree_on_target: bool | None = None
    tree_difference_count: int = 0
    tree_differences: list[str] = field(default_factory=list)  # the first ones
    # The same comparison seen from the checked host: the other host is the one the service moved from.
    other_host: str = ""
    other_tree_files: int = 0  # files (and links) in the other host's uploads
    other_tree_missing: int = 0  # entries of the other host missing on this host, or different
    other_tree_on_host: bool | None = None  # other_tree_missing == 0: all of them here, byte for byte
    only_on_host: int = 0  # files only on this host: uploads made here after the flip (or not yet copied back)
    error: str | None = None  # why the check could not be made

    @property
    def acknowledged_lost(self) -> int:
        uploads = self.uploads_lost + self.upload_rows_lost + self.deletes_undone
        return self.reviews_lost + self.reviews_altered + uploads

    @property
    def ok(self) -> bool:
        return self.error is None and self.acknowledged_lost == 0

    @property
    def exit_code(self) -> int:
        if self.error is not None:
            return EXIT_CANNOT_VERIFY
        return EXIT_OK if self.acknowledged_lost == 0 else EXIT_LOST

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "acknowledged_lost": self.acknowledged_lost, "ok": self.ok}


def read_acks(path: Path) -> list[dict[str, Any]]:
    """The acknowledged writes; a torn last line (the generator killed mid-write) was never fully acknowledged."""
    acks: list[dict[str, Any]] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        try:
            acks.append(json.loads(line))
        except ValueError:
            continue
    return acks


def file_sha256(path: Path) -> str | None:
    try:
        with open(path, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None


def tree_entries(root: Path) -> dict[str, str]:
    """relative path → what it is (file digest, symlink target, directory), for a byte-for-byte comparison."""
    entries: dict[str, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                entries[rel] = f"symlink {os.readlink(path)}"
            elif stat.S_ISDIR(mode):
                entries[rel] = "directory"
            elif stat.S_ISREG(mode):
                entries[rel] = f"file {file_sha256(path)}"
            else:
                entries[rel] = f"special {stat.S_IFMT(mode):o}"
    return entries


def compare_trees(a: Path, b: Path) -> list[str]:
    """The differences between two directory trees (empty when identical)."""
    differences = [f"not a directory: {root}" for root in (a, b) if not root.is_dir()]
    if differences:
        return differences
    return tree_differences(tree_entries(a), tree_entries(b))


def tree_differences(left: dict[str, str], right: dict[str, str]) -> list[str]:
    """The differences between two trees' entries, the left one being the source's."""
    differences: list[str] = []
    for rel in sorted(left.keys() | right.keys()):
        if rel not in right:
            differences.append(f"only on source: {rel}")
        elif rel not in left:
            differences.append(f"only on target: {rel}")
        elif left[rel] != right[rel]:
            differences.append(f"differs: {rel}")
    return differences


def check_reviews(cur: Any, acks: list[dict[str, Any]], report: VerifyReport) -> None:
    wanted = {a["id"]: a["sha256"] for a in acks}
    ids = sorted(wanted)
    found: dict[str, str] = {}
    for start in range(0, len(ids), QUERY_BATCH):
        batch = ids[start : start + QUERY_BATCH]
        placeholders = ", ".join(["%s"] * len(batch))
        cur.execute(f"SELECT id, author, course, rating, body FROM reviews WHERE id IN ({placeholders})", batch)
        for review_id, author, course, rating, body in cur.fetchall():
            found[review_id] = review_digest(author, course, rating, body)
    report.reviews_acknowledged = len(wanted)
    for review_id in ids:
        if review_id not in found:
            report.reviews_lost += 1
            note = review_id
        elif found[review_id] != wanted[review_id]:
            report.reviews_altered += 1
            note = f"{review_id} (altered)"
        else:
            continue
        if len(report.lost) < LIST_LIMIT:
            report.lost.append(note)


def check_uploads(cur: Any, acks: list[dict[str, Any]], uploads_dir: Path, report: VerifyReport) -> None:
    """Each name's last acknowledged write, in the order of the acks: its bytes (file and row), or its absence when
    that write was a delete."""
    last: dict[str, str | None] = {}
    for ack in acks:
        last[ack["name"]] = None if ack["kind"] == "upload_deleted" else ack["sha256"]
    wanted = {name: digest for name, digest in last.items() if digest is not None}
    deleted = sorted(name for name, digest in last.items() if digest is None)
    check_deleted(cur, deleted, uploads_dir, report)
    names = sorted(wanted)
    rows: dict[str, str] = {}
    for start in range(0, len(names), QUERY_BATCH):
        batch = names[start : start + QUERY_BATCH]
        placeholders = ", ".join(["%s"] * len(batch))
        cur.execute(f"SELECT name, sha256 FROM uploads WHERE name IN ({placeholders})", batch)
        rows.update({name: digest for name, digest in cur.fetchall()})
    report.uploads_acknowledged = len(wanted)
    for name in names:
        problems = []
        if file_sha256(uploads_dir / name) != wanted[name]:
            report.uploads_lost += 1
            problems.append("file")
        if rows.get(name) != wanted[name]:
            report.upload_rows_lost += 1
            problems.append("row")
        if problems and len(report.lost) < LIST_LIMIT:
            report.lost.append(f"upload {name} ({' and '.join(problems)})")


def check_deleted(cur: Any, names: list[str], uploads_dir: Path, report: VerifyReport) -> None:
    """Uploads deleted with an acknowledgement are gone: no file, no row (a file copied back by a pass that missed
    the delete would be one)."""
    rows: set[str] = set()
    for start in range(0, len(names), QUERY_BATCH):
        batch = names[start : start + QUERY_BATCH]
        cur.execute(f"SELECT name FROM uploads WHERE name IN ({', '.join(['%s'] * len(batch))})", batch)
        rows.update(name for (name,) in cur.fetchall())
    report.uploads_deleted = len(names)
    for name in names:
        problems = [what for what, there in (("file", (uploads_dir / name).exists()), ("row", name in rows)) if there]
        if problems:
            report.deletes_undone += 1
            if len(report.lost) < LIST_LIMIT:
                report.lost.append(f"deleted upload {name} is back ({' and '.join(problems)})")


def add_stats(stats_path: Path, report: VerifyReport) -> None:
    try:
        stats = json.loads(stats_path.read_text())
    except (OSError, ValueError):
        return
    report.longest_write_stall_s = stats.get("longest_write_stall_s")
    report.longest_ack_gap_s = stats.get("longest_ack_gap_s")
    report.write_attempts_failed = stats.get("write_attempts_failed")
    report.writes_pending_at_end = stats.get("writes_pending_at_end")
    report.longest_pending_s = stats.get("longest_pending_s")
    report.reads_failed = stats.get("reads_failed")
    report.reads_missing = stats.get("reads_missing")
    report.per_server = stats.get("per_server", {})
    report.server_names = stats.get("server_names", {})


def compare_uploads(state: LabState, host: str, report: VerifyReport) -> None:
    """Both uploads trees, compared: both ways (trees_identical) and from the checked host's side, where files
    only on the checked host are uploads made there after the flip, not differences."""
    roots = [state.source.uploads, state.target.uploads]
    missing_roots = [f"not a directory: {root}" for root in roots if not root.is_dir()]
    source_entries = tree_entries(roots[0]) if roots[0].is_dir() else {}
    target_entries = tree_entries(roots[1]) if roots[1].is_dir() else {}
    differences = missing_roots or tree_differences(source_entries, target_entries)
    report.trees_identical = not differences
    report.source_tree_on_target = not any(d.startswith(("only on source", "differs", "not a")) for d in differences)
    report.tree_difference_count = len(differences)
    report.tree_differences = differences[:LIST_LIMIT]

    here, other = (target_entries, source_entries) if host == "target" else (source_entries, target_entries)
    report.other_host = "source" if host == "target" else "target"
    report.other_tree_files = sum(1 for kind in other.values() if kind != "directory")
    report.other_tree_missing = len(missing_roots) + sum(1 for rel, kind in other.items() if here.get(rel) != kind)
    report.other_tree_on_host = report.other_tree_missing == 0
    report.only_on_host = sum(1 for rel, kind in here.items() if rel not in other and kind != "directory")


def add_requests(requests_path: Path, journal: Path | None, report: VerifyReport) -> None:
    """Failed requests and latency from the load's request log (the window from the journal, when given)."""
    if not requests_path.exists():
        return
    report.window = journal_window(journal) if journal is not None else None
    report.requests_failed, report.latency = request_figures(read_requests(requests_path), report.window)


def main_verify(
    state: LabState,
    *,
    host: str = "target",
    load_dir: Path | None = None,
    out: Path | None = None,
    journal: Path | None = None,
    trees: bool = True,
) -> VerifyReport:
    """Check every acknowledged write of the latest load run against `host`; writes the JSON report to `out`
    (default <load dir>/verify-<host>.json) and returns it. `journal`: the migrate journal of the run made under
    the load, for the latency inside its window. `trees=False` skips the byte-for-byte comparison of both uploads
    trees (it reads every file of both: minutes at a million files); the acknowledged uploads are checked all the
    same."""
    directory = load_dir if load_dir is not None else state.load_dir
    lab_host = state.host(host)
    dbapi = appdb.for_state(state)
    report = VerifyReport(host=host, load_dir=str(directory))
    add_stats(directory / STATS_FILE, report)
    add_requests(directory / REQUESTS_FILE, journal, report)
    if trees:
        compare_uploads(state, host, report)
    try:
        acks = read_acks(directory / ACKS_FILE)
    except OSError as exc:
        report.error = f"no acknowledgements journal at {directory / ACKS_FILE}: {exc.strerror}"
    else:
        try:
            password = state.secrets()[state.app_password_env]
            conn = db_connect(state, lab_host, password)
        except (dbapi.error, OSError, KeyError) as exc:
            report.error = f"cannot reach the {host} database at {dbapi.where(lab_host)}: {type(exc).__name__}"
        else:
            try:
                with conn.cursor() as cur:
                    check_reviews(cur, [a for a in acks if a.get("kind") == "review"], report)
                    uploads = [a for a in acks if a.get("kind") in ("upload", "upload_deleted")]
                    check_uploads(cur, uploads, lab_host.uploads, report)
            except dbapi.error as exc:
                report.error = f"query on the {host} database failed: {exc.args[0] if exc.args else exc}"
            finally:
                conn.close()
    target_file = out if out is not None else directory / f"verify-{host}.json"
    target_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = target_file.with_name(target_file.name + ".tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=2))
    os.replace(tmp, target_file)
    return report


def render(report: VerifyReport) -> str:
    def figure(value: float | int | None, unit: str = "") -> str:
        if value is None:
            return "n/a"
        return f"{value:.2f}{unit}" if isinstance(value, float) else f"{value}{unit}"

    lines = [f"verify on {report.host} ({report.load_dir})"]
    if report.error is not None:
        lines.append(f"  CANNOT VERIFY: {report.error}")
    else:
        lines += [
            f"  reviews acknowledged      {report.reviews_acknowledged}",
            f"  reviews lost              {report.reviews_lost}",
            f"  reviews altered           {report.reviews_altered}",
            f"  uploads acknowledged      {report.uploads_acknowledged}",
            f"  uploads lost (files)      {report.uploads_lost}",
            f"  uploads lost (rows)       {report.upload_rows_lost}",
            f"  deleted uploads back      {report.deletes_undone} (of {report.uploads_deleted} deleted)",
        ]
    lines += [
        f"  longest write stall       {figure(report.longest_write_stall_s, ' s')}",
        f"  longest gap between acks  {figure(report.longest_ack_gap_s, ' s')}",
        f"  write attempts failed     {figure(report.write_attempts_failed)}",
        f"  writes pending at end     {figure(report.writes_pending_at_end)}"
        f" (oldest {figure(report.longest_pending_s, ' s')})",
        f"  reads failed              {figure(report.reads_failed)} ({figure(report.reads_missing)} missing)",
    ]
    if report.latency:
        lines += [f"  {line}" for line in request_lines(report.requests_failed, report.latency, report.window)]
    lines += render_uploads(report)
    for address, counts in sorted(report.per_server.items()):
        label = f"{report.server_names.get(address, '?')} {address}"
        lines.append(
            f"  served by {label:<25} {counts.get('writes_acked', 0)} writes,"
            f" {counts.get('uploads_acked', 0)} uploads acknowledged, {counts.get('reads_ok', 0)} reads ok;"
            f" {counts.get('write_attempts_failed', 0)} write attempts and {counts.get('reads_failed', 0)} reads"
            " failed"
        )
    lines += [f"    lost: {key}" for key in report.lost]
    if report.error is None:
        verdict = "OK: nothing acknowledged was lost" if report.ok else "FAILED: acknowledged data is missing"
        if report.ok and report.other_tree_missing:
            verdict += (
                f"; but {report.other_tree_missing} uploads of the {report.other_host} are missing or different"
                f" on the {report.host} (listed above)"
            )
        lines.append(f"  {verdict}")
    return "\n".join(lines)


def render_uploads(report: VerifyReport) -> list[str]:
    """The uploads comparison as the checked host's operator reads it: are the other host's files all here, byte
    for byte; and how many files only this host has (made here after the flip: expected, not a difference)."""
    host, other = report.host, report.other_host
    label = f"uploads of the {other}"
    if report.other_tree_on_host:
        lines = [f"  {label:<25} all {report.other_tree_files} on the {host}, identical byte for byte"]
    else:
        lines = [f"  {label:<25} {report.other_tree_missing} MISSING or different on the {host}"]
        # The differences that matter: what the other host has and this one lacks or holds otherwise.
        here_only = f"only on {host}"
        wanted = [d for d in report.tree_differences if not d.startswith(here_only)]
        lines += [f"    {difference}" for difference in wanted[:SHOWN_DIFFERENCES]]
        if report.other_tree_missing > SHOWN_DIFFERENCES:
            lines.append(f"    ... ({report.other_tree_missing - min(len(wanted), SHOWN_DIFFERENCES)} more)")
    if host == "target":
        lines.append(f"  uploads made on the target after the flip: {report.only_on_host} (only there, as expected)")
    else:
        lines.append(f"  uploads only on the source: {report.only_on_host} (made there since the last copy)")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m migrate_lab.verify", description="Lab verify.")
    parser.add_argument("--lab", default=".lab", help="the lab directory (default: .lab)")
    parser.add_argument("--host", choices=["source", "target"], default="target")
    parser.add_argument("--load-dir", type=Path, default=None, help="where acks.jsonl is (default: <lab>/load)")
    parser.add_argument("--json", type=Path, default=None, help="report file (default: <load dir>/verify-HOST.json)")
    parser.add_argument("--journal", type=Path, default=None, help="migrate journal: latency inside its window")
    args = parser.parse_args(argv)
    state = LabState.load(args.lab)
    module = APP_VERIFY_MODULES.get(state.app)
    if module is not None:  # another app's verify (WordPress's posts, comments and media), built on this module
        app_verify = importlib.import_module(module)
        app_report = app_verify.main_verify(
            state, host=args.host, load_dir=args.load_dir, out=args.json, journal=args.journal
        )
        print(app_verify.render(app_report))
        return int(app_report.exit_code)
    report = main_verify(state, host=args.host, load_dir=args.load_dir, out=args.json, journal=args.journal)
    print(render(report))
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
