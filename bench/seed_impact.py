"""Benchmark: what the replicate mode's seed costs the live site's writes, and how much of it mariadb-backup needs.

    .venv/bin/python bench/seed_impact.py --db-size-mb 256,2048

For each database size, brings up a lab of that size (in a temporary directory unless --lab-dir) and runs the lab's
load (its clients writing reviews and uploads through the source's front door) under each variant in turn, in one
invocation, side by side:
- the seed: the replicate mode's own command (mariadb-backup --backup --stream under nice/ionice and its stamped log,
  dd, the SSH hop, `mbstream -x` into the target's staging directory), then `mariadb-backup --prepare` on the
  target: what `repl_seed` does before it installs the copy;
- the backup over SSH: the same command, the copy dropped on the target (`cat >/dev/null` there): the hop's
  encryption on both hosts, no writes on the target;
- the backup alone: the same command with the copy discarded on the source (`cat >/dev/null` in place of the SSH
  hop): what mariadb-backup itself costs the source;
- the load alone, for as long as the seed took: the baseline.
For each: the clients' writes during it (count, p99, the longest: first attempt → acknowledgement), failed
requests, and the backup's hold on commits read from its stamped log (BLOCK_COMMIT's start until every lock was
released). The lab's two hosts share this machine's two cores and one disk: whatever the target does (its
`mbstream` writing the copy, its prepare) competes with the source here, which two real servers would not.
Run by hand; not part of CI.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from cutover import bench_work, lab_of_size, load_running, source_live

from migrate_lab import planfile
from migrate_lab.load import REQUESTS_FILE
from migrate_lab.state import LabState
from orchestrator.database.mysql import seed as mysql_seed
from orchestrator.plan.loader import load_plan
from orchestrator.runtime import Runtime
from orchestrator.steps.repl_common import DB_PASSWORD_ENV, seed_spec

# In place of the SSH hop to the target: the copy read and dropped on the source (`sh -c 'cat >/dev/null'` takes
# the receiving command that follows as its $0, unused).
DISCARD = ("sh", "-c", "cat >/dev/null")


@dataclass
class Variant:
    name: str
    seconds: float
    writes: int
    write_p99_s: float | None
    longest_write_s: float | None
    failed: int
    commits_held_s: float | None = None


def writes_between(out: Path, began: float, ended: float) -> tuple[int, float | None, float | None, int]:
    """The load's writes that began in [began, ended]: how many, their latency p99 and max, and failed requests."""
    records = [json.loads(line) for line in (out / REQUESTS_FILE).read_text().splitlines() if line.strip()]
    during = [r for r in records if began <= float(r["t"]) <= ended]
    writes = sorted(float(r["ms"]) / 1000 for r in during if r["kind"] == "writes" and r["ok"])
    failed = sum(1 for r in during if not r["ok"])
    if not writes:
        return 0, None, None, failed
    p99 = writes[min(len(writes) - 1, int(len(writes) * 0.99))]
    return len(writes), p99, writes[-1], failed


def run_variant(name: str, state: LabState, work: Path, rate: float, action) -> Variant:  # type: ignore[no-untyped-def]
    out = work / name.replace(" ", "-")
    with load_running(state, out, 1.0, rate):
        began = time.time()
        held = action()
        ended = time.time()
    writes, p99, longest, failed = writes_between(out, began, ended)
    return Variant(name, ended - began, writes, p99, longest, failed, held)


def measure(state: LabState, work: Path, rate: float) -> list[Variant]:
    plan = load_plan(state.plan_file).plan
    for key, value in state.secrets().items():
        os.environ.setdefault(key, value)
    spec = seed_spec(plan)
    with Runtime(plan, state.plan_file) as rt:
        password = rt.db_password()
        env = {DB_PASSWORD_ENV: password} if password and spec.password_env else None

        def seed() -> float | None:
            streamed = rt.source.stream(mysql_seed.seed_stream_command(spec), lambda _line: None, timeout=3600, env=env)
            rt.target.run(mysql_seed.prepare_command(spec), timeout=3600)
            rt.target.run(f"rm -rf {shlex.quote(spec.staging_dir)}", timeout=600)
            return mysql_seed.parse_backup_locks(streamed.stdout).commits_blocked

        def backup_to(ssh_to_target: tuple[str, ...]) -> float | None:
            variant = dataclasses.replace(spec, ssh_to_target=ssh_to_target)
            streamed = rt.source.stream(
                mysql_seed.seed_stream_command(variant), lambda _line: None, timeout=3600, env=env
            )
            return mysql_seed.parse_backup_locks(streamed.stdout).commits_blocked

        # The hop's remote command becomes `cat >/dev/null; exit 0 # <the receiving command>`.
        over_ssh = (*spec.ssh_to_target, "cat >/dev/null;", "exit", "0", "#")
        variants = [run_variant("the seed", state, work, rate, seed)]
        variants.append(run_variant("the backup over SSH", state, work, rate, lambda: backup_to(over_ssh)))
        variants.append(run_variant("the backup alone", state, work, rate, lambda: backup_to(DISCARD)))
        duration = variants[0].seconds
        variants.append(run_variant("the load alone", state, work, rate, lambda: time.sleep(duration)))
    return variants


def table(rows: list[tuple[int, Variant]]) -> str:
    def secs(value: float | None) -> str:
        return "n/a" if value is None else f"{value:.3f} s"

    lines = [
        "| database | variant | seconds | writes | write p99 | longest write | failed requests | commits held by the "
        "backup |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for size, v in rows:
        lines.append(f"| {size} MiB | {v.name} | {v.seconds:.1f} | {v.writes} | {secs(v.write_p99_s)} | "
                     f"{secs(v.longest_write_s)} | {v.failed} | {secs(v.commits_held_s)} |")  # fmt: skip
    for size in dict.fromkeys(size for size, _ in rows):
        by_name = {v.name: v for s, v in rows if s == size}
        base = by_name.get("the load alone")
        for name in ("the seed", "the backup over SSH", "the backup alone"):
            v = by_name.get(name)
            if v and base and v.longest_write_s and base.longest_write_s:
                lines.append(f"{size} MiB: {name}: longest write {v.longest_write_s / base.longest_write_s:.1f}x the "
                             f"load alone's")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db-size-mb", default="256,2048", help="one size or several, comma-separated")
    parser.add_argument("--uploads-size-mb", type=int, default=20)
    parser.add_argument("--rate", type=float, default=40.0, help="load requests per second")
    parser.add_argument("--repeat", type=int, default=1, help="rounds of the three variants per size")
    parser.add_argument("--lab-dir", type=Path, default=None, help="reuse/keep this lab (one size only)")
    args = parser.parse_args(argv)
    sizes = [int(size) for size in str(args.db_size_mb).split(",") if size.strip()]
    if not sizes or (args.lab_dir is not None and len(sizes) > 1):
        parser.error("--lab-dir takes one --db-size-mb")
    rows: list[tuple[int, Variant]] = []
    with bench_work("migrate-bench-seed-") as work:
        for size in sizes:
            with lab_of_size(work, size, args.lab_dir, args.uploads_size_mb) as state:
                planfile.write_plan(state, "replicate")
                for round_ in range(max(1, args.repeat)):
                    source_live(state)
                    for variant in measure(state, work / str(size) / str(round_), args.rate):
                        print(f"{size} MiB, round {round_ + 1}: {variant}", flush=True)
                        rows.append((size, variant))
        print(table(rows))
        if args.repeat > 1:
            for size in sizes:
                for name in ("the seed", "the backup over SSH", "the backup alone", "the load alone"):
                    longest = [v.longest_write_s for s, v in rows if s == size and v.name == name and v.longest_write_s]
                    if longest:
                        print(f"{size} MiB, {name}: median longest write {statistics.median(longest):.3f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
