"""Benchmark: the downtime window of a real `migrate apply` as the uploads tree grows, with change tracking.

    .venv/bin/python bench/window.py --files 10000 100000 [--lab-dir-root DIR]   (about 10 min for these two here)

For each size, one after the other on a fresh lab (`lab up --files N`, in a temporary directory, taken down after):
the lab's load runs (new uploads, some rewritten in place, some deleted), `migrate apply` migrates, the load stops.
Printed per size, as soon as measured: the window from the run report (writes blocked → DNS flipped), the clients'
view (longest write stall, from the load's acks), the tracked final pass (paths listed, of them deleted, seconds),
the in-window tree verification's scope, the pre-sync time (its pass and its full comparison), the orchestrator's
peak RSS, the acknowledged writes lost (deletes undone included), the lab's setup time and the load average; then
the ratio of the windows (largest size / smallest). Run by hand; not part of CI. Compare only figures of one
invocation: the window on this 2-core machine moves with whatever else runs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from migrate_lab import hosts
from migrate_lab.load import main_load
from migrate_lab.state import LabState
from migrate_lab.verify import main_verify

MIGRATE = Path(sys.executable).with_name("migrate")
DNS_TTL = 3.0


@dataclass
class Row:
    files: int
    window_s: float
    stall_s: float
    listed: int
    deleted: int
    final_pass_s: float
    verify_scope: str
    presync_s: float
    compare_s: float
    peak_rss_mib: float
    lost: int
    lab_up_s: float
    load_average: str


def step_seconds(report: dict[str, Any], name: str) -> float:
    return next((s["duration"] or 0.0 for s in report["steps"] if s["name"] == name), 0.0)


def measure(lab_dir: Path, files: int) -> Row:
    started = time.monotonic()
    state: LabState = hosts.up(lab_dir, default_ports=False, files=files)
    lab_up_s = time.monotonic() - started
    print(f"  lab with {files} files up in {lab_up_s:.0f} s", flush=True)
    load_dir = lab_dir / "bench-load"
    stop = threading.Event()
    load = threading.Thread(
        target=main_load, args=(state,), daemon=True,
        kwargs={"duration": 3600, "rate": 20, "clients": 4, "dns_ttl": DNS_TTL, "upload_every": 5,
                "out": load_dir, "stop": stop, "overwrite_every": 3, "delete_every": 4},
    )  # fmt: skip
    load.start()
    time.sleep(2)
    env = {k: v for k, v in os.environ.items() if k not in ("CLOUDFLARE_EMAIL", "CLOUDFLARE_API_KEY")}
    run = subprocess.run(
        [str(MIGRATE), "apply", str(state.plan_file), "--yes", "--env-file", str(state.env_file)],
        env=env, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    time.sleep(DNS_TTL + 2)
    stop.set()
    load.join(timeout=60)
    if run.returncode != 0:
        raise SystemExit(f"migrate apply failed at {files} files:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    reports = sorted((state.path / ".migrate").glob("*/report-*.json"), key=lambda p: p.stat().st_mtime)
    report = json.loads(reports[-1].read_text())
    # The acknowledged writes only: migrate compared the whole trees before the window itself, and reading both
    # trees again here would take minutes at a million files.
    verify = main_verify(state, host="target", load_dir=load_dir, trees=False)
    tree = report["final_pass_trees"]["uploads"]
    inside = [c["check"] for c in report["checks"] if c["where"] == "inside" and c["check"].startswith("tree")]
    before = [c for c in report["checks"] if c["where"] == "before"]
    return Row(
        files=files,
        window_s=report["write_block_seconds"],
        stall_s=verify.longest_write_stall_s or 0.0,
        listed=tree["paths_listed"] if tree["mode"] == "tracked" else -1,
        deleted=tree.get("deleted") or 0,
        final_pass_s=tree["seconds"],
        verify_scope=inside[0].split(": checksums of ", 1)[-1] if inside else "-",
        presync_s=step_seconds(report, "files_presync"),
        compare_s=before[0]["seconds"] if before else 0.0,
        peak_rss_mib=report["peak_rss_mib"],
        lost=verify.acknowledged_lost,
        lab_up_s=lab_up_s,
        load_average=" ".join(f"{x:.1f}" for x in os.getloadavg()),
    )


HEADER = (
    "| files | window (report) | longest write stall (clients) | final pass: paths listed (deleted), s | "
    "in-window tree check | files_presync s (of which full compare) | peak RSS MiB | lost | lab up s | "
    "load average after |"
)


def row_line(r: Row) -> str:
    return (
        f"| {r.files:,} | {r.window_s:.2f} s | {r.stall_s:.2f} s | {r.listed} ({r.deleted}), {r.final_pass_s:.2f} | "
        f"{r.verify_scope} | {r.presync_s:.1f} ({r.compare_s:.1f}) | {r.peak_rss_mib} | {r.lost} | {r.lab_up_s:.0f} | "
        f"{r.load_average} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--lab-dir-root", type=Path, default=None, help="where the temporary labs go")
    args = parser.parse_args()
    rows = []
    for files in args.files:
        lab_dir = Path(tempfile.mkdtemp(prefix=f"bench-window-{files}-", dir=args.lab_dir_root))
        try:
            print(f"{files} files:", flush=True)
            rows.append(measure(lab_dir, files))
            print(f"  {row_line(rows[-1])}", flush=True)  # each size as soon as measured: a long run keeps it
        finally:
            hosts.down(lab_dir, purge=True)
    print()
    print(HEADER)
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(row_line(r))
    if len(rows) > 1:
        print(
            f"\nwindow at {rows[-1].files:,} files / at {rows[0].files:,}: {rows[-1].window_s / rows[0].window_s:.2f}x"
        )


if __name__ == "__main__":
    main()
