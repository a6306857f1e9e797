"""Preflight: everything the migration needs, checked before anything changes (reads only).

Every problem is collected, then reported together: an operator fixes them all in one go instead of
discovering them one run at a time.
"""

from __future__ import annotations

import posixpath
import shlex
from collections.abc import Collection, Mapping
from typing import Any

from orchestrator.contracts import StepRuntime, Which, runtime
from orchestrator.database.protocol import NON_TRANSACTIONAL, DatabaseError
from orchestrator.engine.step import Step, StepContext, StepError
from orchestrator.plan.checks import protected_problem
from orchestrator.secrets import redact
from orchestrator.services import owned, probes, storage
from orchestrator.steps.common import RESOLVED_DATADIRS
from orchestrator.steps.modes import SHUTDOWN, CutoverMode
from orchestrator.steps.repl_common import (
    declared_mode,
    engine_requirements,
    mode_reason,
    probe_replication,
    replication,
)
from orchestrator.steps.run_owned import end_left_by_runs, waiting_guards
from orchestrator.transports import rsync
from orchestrator.transports.dns import DnsError
from orchestrator.transports.ssh import TransportError

SPACE_MARGIN = 1.10
ER_ACCESS_DENIED = 1045
COMMAND_TIMEOUT = 60.0

MAX_LINKS_LISTED = 5


def database_directories(
    server_datadir: str, variables: Mapping[str, str], files: Collection[str] = ()
) -> dict[str, str]:
    """The directory each setting (`Database.datadir_settings`) puts database files in, absolute and normalized;
    `files`: the settings that name a file, whose directory counts (`Database.file_settings`).

    Relative values are relative to the datadir (the server's working directory); an empty directory setting
    means the datadir itself, an empty file setting means the feature is off.
    """
    found: dict[str, str] = {}
    for name in variables:
        value = (variables[name] or "").strip()
        if name in files:
            if not value:
                continue
            value = posixpath.dirname(value) or "."
        found[name] = posixpath.normpath(posixpath.join(server_datadir, value or "."))
    return found


def is_within(path: str, root: str) -> bool:
    root = root.rstrip("/") or "/"
    return path == root or path.startswith(root if root == "/" else root + "/")


def outside_datadir(datadir: str, directories: Mapping[str, str], values: Mapping[str, str]) -> list[str]:
    """One problem per variable whose (resolved) directory is not inside the (resolved) datadir."""
    return [
        f"the source database keeps files outside its datadir: {name} = {values.get(name) or directory}"
        f" (resolves to {directory}, not under {datadir}); the final pass copies the datadir only: move them"
        " into it"
        for name, directory in sorted(directories.items())
        if not is_within(directory, datadir)
    ]


class Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, text: str) -> None:
        self.items.append(text)


_first_line = probes.parse_first_line


class Preflight(Step):
    name = "preflight"
    title = "Preflight checks (reads only)"

    def __init__(self, *, mode: CutoverMode = SHUTDOWN) -> None:
        self.mode = mode

    def describe(self, ctx: StepContext) -> list[str]:
        return self.mode.preflight_lines(self._lines(ctx))

    def _lines(self, ctx: StepContext) -> list[str]:
        plan = runtime(ctx).plan
        return [
            f"ssh to the source {plan.source.user}@{plan.source.address} and the target"
            f" {plan.target.user}@{plan.target.address} with verified host keys",
            "ssh from the source to the target (the way rsync will), rsync present on both",
            f"the source database answers with {', '.join(runtime(ctx).database.needed_privileges)}; same major"
            " version on the target",
            "every datadir and tree resolved on its host (symbolic links followed): what it resolves to judged like"
            " the plan's text (protected directories), the datadirs' real directories journaled for every later"
            " step; a datadir that links to nothing refused",
            f"the source database keeps every file under {plan.database.source.datadir} (InnoDB logs and undo,"
            " binary and Aria logs), no symbolic links inside it (it may be one itself), and its open InnoDB files"
            " are visible",
            "enough free space on the target for the datadir and the file trees (+10%)",
            "storage, source and target side by side: filesystem under the datadir and each tree, free bytes and"
            f" inodes, fsync latency of the datadirs (best of {FSYNC_ROUNDS} samples of ≤ {plan.preflight.fsync_writes}"
            f" writes of 4 KiB, ≤ {plan.preflight.fsync_seconds:g} s each), durability settings; a target >"
            f" {plan.preflight.max_fsync_ratio:g}x slower or less durable: {plan.preflight.storage}",
            f"Cloudflare token valid; records {', '.join(plan.dns.records)} point at {plan.source.dns_content}",
        ]

    def run(self, ctx: StepContext) -> dict[str, Any] | None:
        problems = Problems()
        figures: dict[str, Any] = {}
        # Each host reached, and the run's private directory there proven its own before anything is written in it.
        reachable = {which: self._ssh(ctx, which, problems) for which in ("source", "target")}
        # What earlier runs of this plan left (a killed run nobody resumed, a kept tunnel whose journal went) is
        # ended before this run starts anything: none of it is ever taken for this run's.
        for problem in waiting_guards(end_left_by_runs(ctx, keep_this_run=True)):
            problems.add(problem)
        for which in ("source", "target"):
            if reachable[which]:
                self._resolve_paths(ctx, which, problems, figures)
        if reachable["source"]:
            self._source_to_target(ctx, problems)
            self._trees(ctx, problems)
        if reachable["target"]:
            self._sudo_on_target(ctx, problems)
        sides: tuple[Which, Which] = ("source", "target")
        for which in sides:
            if reachable[which]:
                self._rsync(ctx, which, problems)
        source_version = self._source_db(ctx, problems, figures)
        if reachable["source"] and source_version is not None:
            self._datadir(ctx, problems)
        if reachable["target"]:
            self._target_version(ctx, problems, figures, source_version)
        if reachable["source"] and reachable["target"]:

            def _storage() -> None:
                self._space(ctx, problems, figures)
                self._storage(ctx, problems, figures)

            self.mode.check_storage(_storage)  # not on the way back over the reverse replica: no datadir moves
        self._dns(ctx, problems)
        if reachable["source"] and reachable["target"]:
            self._cutover_mode(ctx, problems, figures)
        if problems.items:
            count = len(problems.items)
            raise StepError(f"preflight: {count} problem{'s' if count > 1 else ''}: " + "; ".join(problems.items))
        ctx.log.info("preflight_passed", **{k: v for k, v in figures.items() if not isinstance(v, dict)})
        return figures

    def undo(self, ctx: StepContext) -> None:
        """The rollback's last compensation: what this run (or an earlier one) left on the hosts and no other
        compensation ended — a tunnel, the rsync route's password file or daemon of a run killed in its window."""
        end_left_by_runs(ctx, keep_this_run=False)

    def _cutover_mode(self, ctx: StepContext, problems: Problems, figures: dict[str, Any]) -> None:
        """The cut-over mode this run resolved to, and why (one line each); in replicate mode, what it needs:
        binlog on, distinct server ids, log_slave_updates, ROW format, gtid_strict_mode, mariadb-backup, and
        application accounts that read_only stops."""
        rt = runtime(ctx)
        declared = declared_mode(ctx)  # the plan's word (auto by default), not the mode the run resolved it to
        try:
            found = probe_replication(rt) if self.mode.probes_replication(declared) else []
        except (DatabaseError, TransportError) as exc:
            found = [f"the servers could not be asked: {exc}"]
        for problem in self.mode.requirement_problems(found, lambda: self._app_users(ctx)):
            problems.add(problem)
        mode = self.mode.name
        figures["cutover_mode"] = mode
        figures["mode_reason"] = mode_reason(mode, found, declared, engine_requirements(rt.plan.database.engine))
        ctx.log.info("preflight.cutover_mode", mode=mode)
        ctx.log.info("preflight.mode_reason", why=figures["mode_reason"])

    def _app_users(self, ctx: StepContext) -> list[str]:
        """Accounts that write through read_only would keep writing on the source inside the window: READ_ONLY ADMIN
        (as MariaDB 10.11 spells it), SUPER (which holds it before 11.0.1) or ALL PRIVILEGES on *.*, held directly
        or through a role (granted, default or nested), read from SHOW GRANTS. One problem names them all, each
        account with its privilege and roles."""
        rt = runtime(ctx)
        settings = rt.plan.replication
        if settings is None or not settings.app_users:
            return []
        try:
            conn = rt.db("source")
        except DatabaseError as exc:
            return [f"replicate mode: the application accounts' privileges cannot be read: {exc}"]
        try:
            return replication(rt).writer_problems(conn, list(settings.app_users))
        finally:
            rt.release(conn)

    def _ssh(self, ctx: StepContext, which: Which, problems: Problems) -> bool:
        """The host answers, and the run's private directory there (plan `run_dir`) is made, or found, as the
        account's own: a real directory, mode 0700, owned by the user the commands run as."""
        private = getattr(runtime(ctx).plan, which).private_dir
        try:
            done = (
                runtime(ctx).host(which).run(owned.private_dir_command(private), timeout=COMMAND_TIMEOUT, check=False)
            )
        except TransportError as exc:
            problems.add(f"{which} ssh: {exc}")
            return False
        if owned.UNSAFE_DIR in done.stdout or done.exit_status != 0:
            problems.add(
                f"{which}.run_dir {private}: not a private directory of the account the commands run as (a link, "
                "not a directory, another account's, or it cannot be made); nothing of the run goes there: remove it "
                f"or set {which}.run_dir in the plan"
            )
            return False
        return True

    def _resolve_paths(self, ctx: StepContext, which: Which, problems: Problems, figures: dict[str, Any]) -> None:
        """Every directory the run writes into or reads from on `which`, judged on what the host resolves it to, as
        validation judged its text: /var/run/app is /run/app on most hosts, a protected tree its text does not name.
        The datadir's resolved path is journaled (`datadirs`): every later step acts on the real directory, never on
        a link to it. A datadir that is a link to nothing (a disk not mounted) is refused: the copy would land on the
        link's own filesystem."""
        rt = runtime(ctx)
        endpoint = rt.plan.database.source if which == "source" else rt.plan.database.target
        places = [(f"database.{which}.datadir", endpoint.datadir, endpoint.allow_protected_path, True)]
        for tree in rt.plan.files:
            places.append((f"tree {tree.name}: {which}", getattr(tree, which), tree.allow_protected_path, False))
        try:
            found = probes.ask(rt.host(which), probes.resolve([path for _, path, _, _ in places]),
                               timeout=COMMAND_TIMEOUT)  # fmt: skip
        except TransportError as exc:
            problems.add(f"{which} paths: {exc}")
            return
        for (label, path, allowed, datadir), resolved in zip(places, found, strict=True):
            if resolved.dangling:
                problems.add(f"{label} {path} is a symbolic link to {resolved.real}, which does not exist on the "
                             f"{which}: mount its filesystem or fix the link")  # fmt: skip
                continue
            problem = protected_problem(resolved.real, datadir=datadir, allowed=allowed)
            if problem is not None and resolved.real != path:
                problems.add(f"{label} {path} is {resolved.real} on the {which} (symbolic links followed): {problem}")
            elif problem is not None:  # validation judged the same text: only a plan edited since could get here
                problems.add(f"{label} {path}: {problem}")
        real_datadir = found[0].real
        figures.setdefault(RESOLVED_DATADIRS, {})[which] = real_datadir
        if real_datadir != endpoint.datadir:
            ctx.log.info("preflight.datadir_resolved", side=which, datadir=endpoint.datadir, real=real_datadir)

    def _source_to_target(self, ctx: StepContext, problems: Problems) -> None:
        plan = runtime(ctx).plan
        login = rsync.target_spec(plan, "").rsplit(":", 1)[0]
        command = f"{rsync.target_ssh_command(plan)} {shlex.quote(login)} true"
        try:
            result = runtime(ctx).source.run(command, timeout=COMMAND_TIMEOUT, check=False)
        except TransportError as exc:
            problems.add(f"ssh from the source to the target: {exc}")
            return
        if result.exit_status != 0:
            reason = _first_line(result.stderr) or f"exit {result.exit_status}"
            problems.add(
                f"the source cannot ssh to the target ({reason}):"
                " check transfer.source_to_target_key / _known_hosts and the target's authorized_keys"
            )

    def _sudo_on_target(self, ctx: StepContext, problems: Problems) -> None:
        """What the hop runs on the target through sudo (become: sudo) is allowed by its sudoers: rsync's far end
        and the shell that runs the seed's receiver and the target's fence. Refused: one line per program, before
        anything changes (not five rsync retries later, as a protocol error, after the target's app was stopped)."""
        plan = runtime(ctx).plan
        if plan.target.become != "sudo":
            return
        try:
            answer = (
                runtime(ctx)
                .target.run(
                    sudo_check_command(plan.target.user, HOP_SUDO_PROGRAMS), timeout=COMMAND_TIMEOUT, check=False
                )
                .stdout
            )
        except TransportError as exc:
            problems.add(f"target sudo: {exc}")
            return
        for program in sudo_refused(answer, HOP_SUDO_PROGRAMS):
            problems.add(
                f"target: sudo does not let {plan.target.user} run `{program}` (become: sudo): the source → target "
                f"hop runs `sudo -n -- {program} …` there; allow it without a password in the target's sudoers"
            )

    def _rsync(self, ctx: StepContext, which: Which, problems: Problems) -> None:
        try:
            present = probes.ask(runtime(ctx).host(which), probes.has_program("rsync"), timeout=COMMAND_TIMEOUT)
        except TransportError as exc:
            problems.add(f"rsync on the {which}: {exc}")
            return
        if not present:
            problems.add(f"rsync is not installed on the {which}: install it")

    def _trees(self, ctx: StepContext, problems: Problems) -> None:
        rt = runtime(ctx)
        for tree in rt.plan.files:
            try:
                exists = probes.ask(rt.source, probes.directory_exists(tree.source), timeout=COMMAND_TIMEOUT)
            except TransportError as exc:
                problems.add(f"tree {tree.name}: {exc}")
                continue
            if not exists:
                problems.add(f"tree {tree.name}: {tree.source} does not exist on the source: fix files[].source")

    def _source_db(self, ctx: StepContext, problems: Problems, figures: dict[str, Any]) -> str | None:
        try:
            rt = runtime(ctx)
            conn = rt.db("source")
            version = rt.database.server_version(conn)
            missing = rt.database.missing_privileges(conn, rt.database.needed_privileges)
            notes, facts = rt.database.preflight_notes(conn)
        except DatabaseError as exc:
            hint = ": check database.user and its password" if exc.code == ER_ACCESS_DENIED else ""
            problems.add(f"source database: {exc}{hint}")
            return None
        figures["source_version"] = version
        figures.update(facts)
        if facts.get(NON_TRANSACTIONAL):
            ctx.log.warning(
                "preflight.non_transactional_tables",
                tables=facts[NON_TRANSACTIONAL],
                comparison="outside the snapshot: the replicate mode's comparison reads each at a moment nothing "
                "writes to it, else leaves it to the after-commit audit (said then); the shutdown mode copies them "
                "stopped like every table",
            )
        for note in notes:
            problems.add(note)
        if missing:
            user = runtime(ctx).plan.database.user
            hint = runtime(ctx).database.grant_hint
            problems.add(f"database user {user} lacks {', '.join(sorted(missing))} on the source: {hint}")
        return version

    def _datadir(self, ctx: StepContext, problems: Problems) -> None:
        """The database lives entirely in database.source.datadir, holds no links, and its shutdown can be proven.

        The final pass copies that one directory with rsync -a: files the server keeps elsewhere (redo or undo
        logs, binary logs, Aria logs) would not travel, and a symbolic link (or an .isl file naming a tablespace
        elsewhere) would be copied as a pointer to a path on the target, whatever lies there.
        """
        rt = runtime(ctx)
        plan_datadir = rt.plan.database.source.datadir
        try:
            conn = rt.db("source")
            server_datadir, values = rt.database.datadir_settings(conn)
            server_datadir = server_datadir or plan_datadir
            directories = database_directories(server_datadir, values, rt.database.file_settings)
            # Resolved on the source, links included (readlink -m: the path need not exist).
            paths = [plan_datadir, server_datadir, *directories.values()]
            resolved = probes.ask(rt.source, probes.resolved_paths(paths), timeout=COMMAND_TIMEOUT)
            datadir, server_real = resolved[0], resolved[1]
            links = probes.ask(rt.source, probes.links_in(datadir, MAX_LINKS_LISTED), timeout=COMMAND_TIMEOUT)
            _pids, blind = probes.innodb_files_visible(rt.source, datadir, rt.database.server_files)
        except (DatabaseError, TransportError) as exc:
            problems.add(f"source datadir: {exc}")
            return
        if server_real != datadir:
            problems.add(
                f"the source database's datadir is {server_datadir}, not database.source.datadir {plan_datadir}:"
                " fix database.source.datadir"
            )
            return
        resolved_directories = dict(zip(directories, resolved[2:], strict=True))
        for problem in outside_datadir(datadir, resolved_directories, values):
            problems.add(problem)
        if links:
            listed = ", ".join(links[:MAX_LINKS_LISTED]) + (" and more" if len(links) > MAX_LINKS_LISTED else "")
            problems.add(
                f"the source datadir holds symbolic links or .isl files ({listed}): rsync would copy them as"
                " pointers to paths on the target; move the files they point at into the datadir"
            )
        if blind:
            problems.add(blind)

    def _target_version(
        self, ctx: StepContext, problems: Problems, figures: dict[str, Any], source_version: str | None
    ) -> None:
        try:
            probe = runtime(ctx).database.installed_version()
            target_version = probes.ask(runtime(ctx).target, probe, timeout=COMMAND_TIMEOUT)
        except TransportError as exc:
            problems.add(f"target database version: {exc}")
            return
        if not target_version:
            problems.add(f"no {runtime(ctx).database.name} server found on the target: install the database server")
            return
        figures["target_version"] = target_version
        if source_version is None:
            return
        try:
            database = runtime(ctx).database
            source_major, target_major = database.major_version(source_version), database.major_version(target_version)
        except ValueError as exc:
            problems.add(f"database versions: {exc}")
            return
        figures["major_version"] = source_major
        if source_major != target_major:
            problems.add(
                f"database major versions differ: source {source_major}, target {target_major}:"
                " a datadir copy needs the same major version"
            )

    def _space(self, ctx: StepContext, problems: Problems, figures: dict[str, Any]) -> None:
        rt = runtime(ctx)
        plan = rt.plan
        pairs = [(plan.database.source.datadir, plan.database.target.datadir)]
        pairs += [(tree.source, tree.target) for tree in plan.files]
        try:
            sizes = probes.ask(rt.source, probes.sizes([source for source, _ in pairs]), timeout=600)
            needed: dict[str, int] = {}
            free: dict[str, int] = {}
            for source, target in pairs:
                mount, available = probes.ask(rt.target, probes.free_space(target), timeout=COMMAND_TIMEOUT)
                free[mount] = available
                needed[mount] = needed.get(mount, 0) + sizes.get(source, 0)
        except TransportError as exc:
            problems.add(f"disk space: {exc}")
            return
        figures["source_bytes"] = sum(sizes.values())
        figures["target_free"] = free
        for mount, size in needed.items():
            want = int(size * SPACE_MARGIN)
            if free[mount] < want:
                problems.add(
                    f"target filesystem {mount} has {free[mount]} bytes free, needs {want}"
                    " (source data + 10%): free some space"
                )

    def _storage(self, ctx: StepContext, problems: Problems, figures: dict[str, Any]) -> None:
        """The storage under the data on both hosts, and what the plan says about a slower or less durable target."""
        rt = runtime(ctx)
        try:
            report = survey_storage(rt)
        except TransportError as exc:
            problems.add(f"storage: {exc}")
            return
        figures["storage"] = report.figures()
        for finding in report.findings:
            log = ctx.log.info if finding.kind == "layout" else ctx.log.warning
            log("storage_finding", kind=finding.kind, side=finding.side, where=finding.where, finding=finding.text,
                protects_against=finding.protects_against)  # fmt: skip
        for finding in report.blocking(rt.plan.preflight.storage):
            problems.add(f"storage: {finding.line()}")

    def _dns(self, ctx: StepContext, problems: Problems) -> None:
        plan = runtime(ctx).plan
        try:
            client = runtime(ctx).dns
            client.verify_token(plan.dns.zone)
            zone_id = client.zone_id(plan.dns.zone)
            edit_checked = False
            for name in plan.dns.records:
                records = client.find_records(zone_id, name, plan.dns.type)
                if not records:
                    problems.add(f"DNS record {name} ({plan.dns.type}) not found in zone {plan.dns.zone}: create it")
                    continue
                if not edit_checked:
                    # A read-only token passes every read above; its first edit would fail inside the window.
                    client.check_can_edit(zone_id, records[0])
                    edit_checked = True
                other = OTHER_FAMILY.get(plan.dns.type)
                left = client.find_records(zone_id, name, other) if other else []
                if other and left:
                    problems.add(
                        f"DNS record {name} also has {other} records ({', '.join(sorted(_content(r) for r in left))})"
                        f" the plan does not move (dns.type {plan.dns.type}): clients reaching it over "
                        f"{'IPv6' if other == 'AAAA' else 'IPv4'} would stay on the old server after the commit; "
                        "remove them before the move, and add the target's address after it"
                    )
                contents = sorted({_content(record) for record in records})
                if contents != [plan.source.dns_content]:
                    problems.add(
                        f"DNS record {name} points at {', '.join(contents)}, not the source's"
                        f" {plan.source.dns_content}: fix source.public_address or the record"
                    )
        except (DnsError, StepError) as exc:
            # A DnsError names its provider and carries no token (redacted again to be sure); a StepError is the
            # token's reference that does not resolve.
            text = redact(str(exc))
            problems.add(text if isinstance(exc, DnsError) else f"DNS ({plan.dns.provider}): {text}")


# The address family a plan's records do not move: found beside them, it would keep its clients on the old server.
OTHER_FAMILY = {"A": "AAAA", "AAAA": "A"}
FSYNC_ROUNDS = 2
DURABILITY_VARIABLES = (*storage.DURABLE_SETTINGS, "innodb_flush_method")


# Run through sudo on the target by the hop (it logs in as the target's user): rsync's far end, and `sh` for the
# seed's receiver and the target's fence lifted from the source.
HOP_SUDO_PROGRAMS = ("rsync", "sh")
SUDO_ALLOWED = "__migrate_sudo_allows__"


def sudo_check_command(user: str, programs: tuple[str, ...]) -> str:
    """Shell, run as root: whether `user`'s sudoers rules let it run each program without a password (`sudo -l -U`
    lists another user's rights for one command). One SUDO_ALLOWED line per allowed program."""
    checks = (
        f"sudo -n -l -U {shlex.quote(user)} {shlex.quote(p)} >/dev/null 2>&1 && echo {SUDO_ALLOWED} {shlex.quote(p)}"
        for p in programs
    )
    return "; ".join(checks) + "; true"


def sudo_refused(answer: str, programs: tuple[str, ...]) -> list[str]:
    allowed = {line.split(" ", 1)[1] for line in answer.splitlines() if line.startswith(SUDO_ALLOWED + " ")}
    return [program for program in programs if program not in allowed]


def _db_settings(rt: StepRuntime, which: Which) -> dict[str, str]:
    conn = rt.db(which, retry=False, read_timeout=COMMAND_TIMEOUT)
    try:
        return rt.database.durability_settings(conn)
    finally:
        rt.release(conn)


def survey_storage(rt: StepRuntime) -> storage.StorageReport:
    """Gather both hosts' storage facts (reads, plus a bounded fsync sample in each datadir) and judge them."""
    plan = rt.plan
    options = plan.preflight
    roles = {"datadir": (plan.database.source.datadir, plan.database.target.datadir)}
    roles.update({f"tree {tree.name}": (tree.source, tree.target) for tree in plan.files})
    sides: dict[Which, storage.SideFacts] = {}
    both: tuple[Which, Which] = ("source", "target")
    for index, which in enumerate(both):
        host = rt.host(which)
        facts = storage.SideFacts()
        for role, paths in roles.items():
            facts.mounts[role] = probes.ask(host, probes.mount_facts(paths[index]), timeout=COMMAND_TIMEOUT)
        try:
            facts.settings = _db_settings(rt, which) if which == "source" or rt.db_answers(which) else {}
        except DatabaseError:
            facts.settings = {}
        if which == "target" and not facts.settings:
            # A stopped target will run with what its option files say (the datadir carries no settings).
            defaults = probes.ask(host, probes.server_option_files(), timeout=COMMAND_TIMEOUT)
            facts.settings = {name: defaults[name] for name in DURABILITY_VARIABLES if name in defaults}
            facts.settings_origin = "option files"
        sides[which] = facts
    # The fsync samples alternate between the hosts, twice, and each side keeps its faster one: a neighbour's burst
    # only ever adds latency, and alternating spreads it over both sides instead of one.
    for _round in range(FSYNC_ROUNDS):
        for index, which in enumerate(both):
            sample = probes.fsync_latency(roles["datadir"][index], count=options.fsync_writes,
                                          seconds=options.fsync_seconds)  # fmt: skip
            taken = probes.ask(rt.host(which), sample, timeout=options.fsync_seconds * 3 + COMMAND_TIMEOUT)
            kept = sides[which].fsync
            if kept is None or taken.p50_ms < kept.p50_ms:
                sides[which].fsync = taken
    sources = [paths[0] for paths in roles.values()]
    sizes = probes.ask(rt.source, probes.sizes(sources), timeout=600)
    counts = probes.ask(rt.source, probes.entry_counts(sources), timeout=600)
    needs: dict[str, storage.Need] = {}
    for role, (source_path, _target_path) in roles.items():
        mount = sides["target"].mounts[role].mount_point
        have = needs.get(mount, storage.Need())
        needs[mount] = storage.Need(have.bytes + sizes.get(source_path, 0), have.entries + counts.get(source_path, 0))
    return storage.judge(
        sides["source"], sides["target"], needs, max_fsync_ratio=options.max_fsync_ratio,
        min_fsync_ms=options.min_fsync_ms,
    )  # fmt: skip


def _content(record: Any) -> str:
    if isinstance(record, dict):
        return str(record.get("content"))
    return str(getattr(record, "content", record))
