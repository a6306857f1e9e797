"""`lab verify` on a WordPress lab: every acknowledged post, comment and media item is on the host.

On the checked host: each acknowledged post is a row of wp_posts (type post, published, same title); each comment
a row of wp_comments on the same post with the same content (sha256); each media item an attachment row in
wp_posts whose file (wp_postmeta's _wp_attached_file) is the acknowledged one, and that file is in the host's
uploads tree byte for byte (sha256). The load's figures (failed requests by cause, the longest write stall, latency
inside the window) and the uploads trees' comparison are the same as the demo app's report (verify.py).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pymysql

from migrate_lab import verify
from migrate_lab.app import db_connect
from migrate_lab.load import ACKS_FILE, REQUESTS_FILE, STATS_FILE
from migrate_lab.state import LabState
from migrate_lab.wordpress import TABLE_PREFIX

KINDS = ("post", "comment", "media")


@dataclass
class WpVerifyReport(verify.VerifyReport):
    posts_acknowledged: int = 0
    posts_lost: int = 0
    comments_acknowledged: int = 0
    comments_lost: int = 0
    media_acknowledged: int = 0
    media_rows_lost: int = 0  # no attachment row, or it names another file
    media_files_lost: int = 0  # the file is missing from the uploads tree, or its bytes differ

    @property
    def acknowledged_lost(self) -> int:
        return self.posts_lost + self.comments_lost + self.media_rows_lost + self.media_files_lost


def _lost(report: WpVerifyReport, what: str) -> None:
    if len(report.lost) < verify.LIST_LIMIT:
        report.lost.append(what)


def _rows(cur: Any, sql: str, ids: list[int]) -> dict[int, tuple[Any, ...]]:
    found: dict[int, tuple[Any, ...]] = {}
    for start in range(0, len(ids), verify.QUERY_BATCH):
        batch = ids[start : start + verify.QUERY_BATCH]
        cur.execute(sql.format(ids=",".join(["%s"] * len(batch))), batch)
        for row in cur.fetchall():
            found[int(row[0])] = row
    return found


def check_posts(cur: Any, acks: list[dict[str, Any]], report: WpVerifyReport) -> None:
    report.posts_acknowledged = len(acks)
    sql = f"SELECT ID, post_title FROM {TABLE_PREFIX}posts WHERE post_type = 'post' AND post_status = 'publish'"
    rows = _rows(cur, sql + " AND ID IN ({ids})", [int(a["id"]) for a in acks])
    for ack in acks:
        row = rows.get(int(ack["id"]))
        if row is None or row[1] != ack["title"]:
            report.posts_lost += 1
            _lost(report, f"post {ack['id']} ({ack['title']})")


def check_comments(cur: Any, acks: list[dict[str, Any]], report: WpVerifyReport) -> None:
    report.comments_acknowledged = len(acks)
    sql = (
        f"SELECT comment_ID, comment_post_ID, comment_content FROM {TABLE_PREFIX}comments WHERE comment_ID IN ({{ids}})"
    )
    rows = _rows(cur, sql, [int(a["id"]) for a in acks])
    for ack in acks:
        row = rows.get(int(ack["id"]))
        same = (
            row is not None
            and int(row[1]) == int(ack["post"])
            and hashlib.sha256(str(row[2]).encode()).hexdigest() == ack["sha256"]
        )
        if not same:
            report.comments_lost += 1
            _lost(report, f"comment {ack['id']} on post {ack['post']}")


def check_media(cur: Any, acks: list[dict[str, Any]], uploads: Path, report: WpVerifyReport) -> None:
    report.media_acknowledged = len(acks)
    sql = (
        f"SELECT p.ID, m.meta_value FROM {TABLE_PREFIX}posts p JOIN {TABLE_PREFIX}postmeta m ON m.post_id = p.ID"
        " AND m.meta_key = '_wp_attached_file' WHERE p.post_type = 'attachment' AND p.ID IN ({ids})"
    )
    rows = _rows(cur, sql, [int(a["id"]) for a in acks])
    for ack in acks:
        row = rows.get(int(ack["id"]))
        if row is None or row[1] != ack["file"]:
            report.media_rows_lost += 1
            _lost(report, f"media {ack['id']} ({ack['file']}): no attachment row naming it")
        if verify.file_sha256(uploads / ack["file"]) != ack["sha256"]:
            report.media_files_lost += 1
            _lost(report, f"media {ack['id']}: {ack['file']} missing or different in {uploads}")


def main_verify(
    state: LabState, *, host: str = "target", load_dir: Path | None = None, out: Path | None = None,
    journal: Path | None = None, trees: bool = True,
) -> WpVerifyReport:  # fmt: skip
    """Check every acknowledged write of the latest WordPress load run against `host` (see verify.main_verify)."""
    directory = load_dir if load_dir is not None else state.load_dir
    lab_host = state.host(host)
    report = WpVerifyReport(host=host, load_dir=str(directory))
    verify.add_stats(directory / STATS_FILE, report)
    verify.add_requests(directory / REQUESTS_FILE, journal, report)
    if trees:
        verify.compare_uploads(state, host, report)
    try:
        acks = verify.read_acks(directory / ACKS_FILE)
    except OSError as exc:
        report.error = f"no acknowledgements journal at {directory / ACKS_FILE}: {exc.strerror}"
    else:
        by_kind = {kind: [a for a in acks if a.get("kind") == kind] for kind in KINDS}
        try:
            conn = db_connect(state, lab_host, state.secrets()[state.app_password_env])
        except (pymysql.err.MySQLError, OSError, KeyError) as exc:
            report.error = f"cannot reach the {host} database at {lab_host.db_socket}: {type(exc).__name__}"
        else:
            try:
                with conn.cursor() as cur:
                    check_posts(cur, by_kind["post"], report)
                    check_comments(cur, by_kind["comment"], report)
                    check_media(cur, by_kind["media"], lab_host.uploads, report)
            except pymysql.err.MySQLError as exc:
                report.error = f"query on the {host} database failed: {exc.args[0] if exc.args else exc}"
            finally:
                conn.close()
    target_file = out if out is not None else directory / f"verify-{host}.json"
    target_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = target_file.with_name(target_file.name + ".tmp")
    tmp.write_text(json.dumps(report.to_json(), indent=2))
    os.replace(tmp, target_file)
    return report


def render(report: WpVerifyReport) -> str:
    """The demo app's report, its reviews and uploads lines replaced by WordPress's posts, comments and media."""
    lines = verify.render(report).splitlines()
    if report.error is None:
        start = next(i for i, line in enumerate(lines) if line.strip().startswith("reviews acknowledged"))
        lines[start : start + 7] = [
            f"  posts acknowledged        {report.posts_acknowledged}",
            f"  posts lost                {report.posts_lost}",
            f"  comments acknowledged     {report.comments_acknowledged}",
            f"  comments lost             {report.comments_lost}",
            f"  media acknowledged        {report.media_acknowledged}",
            f"  media lost (rows)         {report.media_rows_lost}",
            f"  media lost (files)        {report.media_files_lost}",
        ]
    return "\n".join(lines)
