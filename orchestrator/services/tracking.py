"""Change tracking of a file tree on a remote host, so the final pass inside the downtime window costs O(changes).

`inotifywait -m -r` runs detached on the source (setsid, its pid, events and stderr in a state directory there), so it
outlives our SSH session and a resumed run finds it again. It is started, and its watches established, BEFORE the
pre-sync's first pass: every change after that moment is recorded, every change before it is read by the pre-sync.

Event records are `EVENTS ./relative/path` terminated by NUL (`--format '%e %w%f%0' --no-newline`, inotify-tools
>= 3.21): NUL is the only byte a file name cannot hold, so names with newlines, spaces or `[` stay whole, and rsync
reads the same NUL-separated list with `--from0 --files-from`. The tracker watches `.` from inside the tree, so %w%f
is already relative. EVENTS is a comma list of upper-case names: the first space ends it.

The list of changed paths is made ON THE SOURCE with coreutils and perl (perl-base is essential on Debian): sed -z,
sort -z -u (external merge, bounded memory), a streaming prune of paths below a listed directory. Python never holds
the names. Before reading, a barrier: a marker file created and removed in the root, whose DELETE event, once in the
events file, proves every earlier change is there too (one inotify instance delivers its events in order).

The final pass copies that list with `-r --delete --delete-missing-args --from0 --files-from` (verified on the lab):
a listed path that still exists is copied, a listed directory whole (which covers directories created or moved in
before their watch existed); a listed path that no longer exists is deleted on the target (a directory with its
contents). The root's own mtime is not carried (listing the root would recurse the whole tree).

Tracking that cannot be trusted says why (`trust()`); the caller then falls back to a full scan.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import shlex
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from orchestrator.transports.ssh import CommandResult

TRACKER_PROGRAM = "inotifywait"
# Creations, content (close_write, and modify for writers that keep a file open), renames both ways, deletions,
# metadata; the root's own deletion/move and unmounts make the tracking unusable. q_overflow must be asked for:
# inotifywait prints only the events of its -e list, and without it an overflow is dropped silently.
EVENTS = (
    "create", "close_write", "modify", "moved_from", "moved_to", "delete", "attrib",
    "delete_self", "move_self", "unmount", "q_overflow",
)  # fmt: skip
FORMAT = "%e %w%f%0"
# A path below a listed directory is dropped: a listed directory that exists is copied whole (-r), one that is gone
# is deleted whole; listing its children as well would make rsync stat them under a missing parent ("vanished").
# The list is sorted with '/' as the lowest byte, so a directory's descendants follow it.
PRUNE = 'chomp; next if defined $kept && index($_, "$kept/") == 0; print "$_\\0"; $kept = $_;'
# One streaming pass over the new complete records (perl -0: NUL-terminated), adding to the counts so far
# (arguments: offset, overflows, root_gone); prints the new three.
SCAN = (
    "BEGIN { ($o, $q, $g) = splice(@ARGV, 0, 3); } if (chomp) { $o += length($_) + 1; $q++ if /^Q_OVERFLOW/; "
    '$g++ if /^([A-Z_,]*,)?(UNMOUNT|(DELETE_SELF|MOVE_SELF)[A-Z_,]* \\.\\/$)/; } END { print "$o $q $g\\n"; }'
)
BARRIER_PREFIX = ".migrate-tracker-barrier-"
BARRIER_POLL = 0.002  # seconds between two looks for the barrier in the events file
READY_LINE = "Watches established."
WATCH_LIMIT_TEXT = "upper limit on inotify watches reached"
# inotify sees only writes made through this kernel: on these, other clients' writes are invisible.
NETWORK_FILESYSTEMS = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb", "smb2", "smb3", "smbfs", "ceph", "glusterfs", "9p", "afs", "lustre", "gpfs",
        "ocfs2", "gfs2", "beegfs", "virtiofs", "davfs", "ncpfs", "coda", "orangefs", "fuse",
    }
)  # fmt: skip
# A local block device behind FUSE (ntfs-3g): every write goes through this kernel.
LOCAL_FUSE = frozenset({"fuseblk"})


# Markers of the change list's command (ChangeTracker.changes): its exit status, then the trust probe's output.
CHANGES_EXIT = "changes_exit="
PROBE_MARK = "--trust-probe--"
THEN_MARK = "--then--"
THEN_EXIT = "then_exit="


# The change list and the trust probe in one process (ChangeTracker.changes_command; arguments: root, state
# directory, list file, barrier marker, tries, poll seconds). Its probe prints what probe_command's shell prints
# (mounts from /proc/self/mountinfo in findmnt -r's escaping; statfs only without it). The list: every record up
# to the barrier's, overflow markers dropped, the event names and ./ cut, sorted with '/' as the lowest byte,
# pruned below a listed directory (PRUNE), the root alone when listed.
LIST_AND_PROBE = r"""
use strict; use warnings; use Cwd ();
$ENV{LC_ALL} = "C";
my ($root, $dir, $list, $marker, $tries, $poll, $since) = @ARGV;
$since //= 0;
(my $barrier = $marker) =~ s/[0-9a-f]+\z//;  # every list's marker: this prefix and random hex
my ($events, $pidf, $scan) = ("$dir/events", "$dir/pid", "$dir/scanned");
sub slurp { my ($p) = @_; open(my $f, "<", $p) or return undef; local $/; my $s = <$f>; return $s }
sub alive {
    my $p = slurp($pidf) // ""; $p =~ s/\s+\z//;
    return 0 unless $p =~ /^[0-9]+\z/;
    my $comm = slurp("/proc/$p/comm") // ""; $comm =~ s/\n\z//;
    my ($cwd, $top) = (readlink("/proc/$p/cwd"), Cwd::abs_path($root));
    return ($comm eq "inotifywait" && defined $cwd && defined $top && $cwd eq $top) ? 1 : 0;
}
sub keep {
    my ($out, $r, $whole) = @_;
    return if $r eq $marker || $r =~ /\A\Q$barrier\E[0-9a-f]+\z/;  # this or an earlier list's barrier
    if ($r eq ".") { $$whole = 1; return }
    $r =~ tr{/}{\001}; print $out "$r\0";
}
sub make_list {
    my $before = (stat $events)[7]; die "stat: $events: $!\n" unless defined $before;
    my $m = "$root/$marker";
    open(my $t, ">", $m) or die "$m: $!\n"; close $t; unlink $m or die "$m: $!\n";
    my $want = "DELETE ./$marker";
    open(my $ev, "<", $events) or die "$events: $!\n";
    my ($pos, $end, $n) = ($before, undef, 0);
    local $/ = "\0";
    while (1) {
        seek($ev, $pos, 0);
        while (defined(my $r = <$ev>)) {
            last unless chomp $r;
            $pos += length($r) + 1;
            if ($r eq $want) { $end = $pos; last }
        }
        last if defined $end;
        if (++$n > $tries) { print "the tracker did not record the barrier\n"; return 5 }
        if (!alive()) { print "the tracker is not running\n"; return 6 }
        select(undef, undef, undef, $poll);
    }
    my ($tmp, $whole, $read) = ("$list.tmp", 0, $since);
    open(my $sort, "|-", "sort", "-z", "-u", "-o", "$tmp.sorted") or die "sort: $!\n";
    seek($ev, $since, 0);
    while ($read < $end && defined(my $r = <$ev>)) {
        $read += length($r); chomp $r;
        next if $r =~ /^Q_OVERFLOW/;
        $r =~ s/^[A-Z_,]* //; $r =~ s{^\./}{}; $r =~ s{/+\z}{}; $r = "." if $r eq "";
        keep($sort, $r, \$whole);
    }
    if (open(my $x, "<", "$dir/extra.list")) { while (defined(my $r = <$x>)) { chomp $r; keep($sort, $r, \$whole) } }
    close($sort) or die "sort exited " . ($? >> 8) . "\n";
    open(my $o, ">", $tmp) or die "$tmp: $!\n";
    my $count = 0;
    if ($whole) { print $o ".\0"; $count = 1 }
    else {
        open(my $s, "<", "$tmp.sorted") or die "$tmp.sorted: $!\n";
        my $kept;
        while (defined(my $r = <$s>)) {
            chomp $r; $r =~ tr{\001}{/};
            next if defined $kept && index($r, "$kept/") == 0;
            print $o "$r\0"; $kept = $r; $count++;
        }
    }
    close($o) or die "$tmp: $!\n";
    unlink "$tmp.sorted"; rename($tmp, $list) or die "$list: $!\n";
    print "count=$count\nend=$end\n";
    return 0;
}
my $rc = eval { make_list() };
if (!defined $rc) { print $@; $rc = 1 }
print "changes_exit=$rc\n--trust-probe--\n";  # CHANGES_EXIT, PROBE_MARK
# The trust probe, as probe_command's shell prints it.
print "started=", (-f $pidf ? 1 : 0), "\nalive=", alive(), "\nevents_bytes=", ((stat $events)[7] // 0), "\n";
my ($o, $q, $g) = (split(" ", slurp($scan) // ""), 0, 0, 0);
if (-f $events && open(my $ev, "<", $events)) {
    seek($ev, $o, 0); local $/ = "\0";
    while (defined(my $r = <$ev>)) {
        last unless chomp $r;
        $o += length($r) + 1; $q++ if $r =~ /^Q_OVERFLOW/;
        $g++ if $r =~ /^([A-Z_,]*,)?(UNMOUNT|(DELETE_SELF|MOVE_SELF)[A-Z_,]* \.\/$)/;
    }
    if (open(my $w, ">", "$scan.tmp")) { print $w "$o $q $g\n"; close $w; rename("$scan.tmp", $scan) }
}
my $gaps = slurp("$dir/gaps") // ""; my $mounts = slurp("/proc/self/mountinfo");
my $statfs = "";
if (!defined $mounts && open(my $st, "-|", "stat", "-f", "-c", "%T", $root)) { $statfs = <$st> // ""; chomp $statfs }
print "overflows=$q\nroot_gone=$g\nstatfs=$statfs\ngaps=", ($gaps =~ tr/\n//), "\n";
print "--stderr--\n", slurp("$dir/stderr") // "", "--mounts--\n";
for (split /\n/, $mounts // "") {
    my ($head, $tail) = split / - /, $_, 2; next unless defined $tail;
    my $target = (split / /, $head)[4]; my $type = (split / /, $tail)[0];
    next unless defined $target && defined $type;
    s/\\([0-7]{3})/sprintf("\\x%02x", oct($1))/ge for $target, $type;
    print "$type $target\n";
}
exit $rc;
"""


class RemoteHost(Protocol):
    def run(
        self, command: str, *, timeout: float | None = None, check: bool = True, input: str | None = None
    ) -> CommandResult: ...


class TrackingError(RuntimeError):
    """The tracker could not be started, read or stopped."""


@dataclass(frozen=True)
class Trust:
    """Whether the recorded changes are complete; `reasons` says why not, in words for the operator."""

    reasons: tuple[str, ...]
    events_bytes: int = 0

    @property
    def trusted(self) -> bool:
        return not self.reasons


@dataclass(frozen=True)
class ChangeList:
    """A NUL-separated list of changed paths (relative to the tree) in a file on the source."""

    path: str
    count: int
    trust: Trust
    # What the command run after the list made (`changes(then=...)`): its exit status and output (stderr in it);
    # None when it did not run (the list could not be made, or it is empty).
    then: tuple[int, str] | None = None
    # Where the list ended in the tracker's events file (the barrier's record): a later list can start there.
    end: int | None = None


# --- pure parsing ------------------------------------------------------------------------------------------------


def parse_event(record: str) -> tuple[frozenset[str], str]:
    """One NUL-free record 'EVENTS ./path' → (event names, relative path; '.' for the root itself)."""
    events, sep, path = record.partition(" ")
    if not sep or not events or not re.fullmatch(r"[A-Z_,]+", events):
        raise ValueError(f"not an event record: {record[:80]!r}")
    path = path.removeprefix("./").rstrip("/")
    return frozenset(events.split(",")), path or "."


def changed_paths(records: Iterable[str]) -> list[str]:
    """The list `ChangeTracker.changes` makes on the source, for a stream of records (for tests and reasoning):
    unique paths, none below another listed one, the root alone when it is listed."""
    paths: set[str] = set()
    for record in records:
        events, path = parse_event(record)
        if "Q_OVERFLOW" not in events:
            paths.add(path)
    if "." in paths:
        return ["."]
    kept: list[str] = []
    for path in sorted(paths, key=lambda p: p.encode("utf-8", "surrogateescape").replace(b"/", b"\x01")):
        if kept and path.startswith(kept[-1] + "/"):
            continue
        kept.append(path)
    return kept


def _unescape_mount(text: str) -> str:
    return re.sub(r"\\x([0-9a-fA-F]{2})", lambda m: chr(int(m.group(1), 16)), text)


def untrusted_filesystems(root: str, findmnt_raw: str, statfs_type: str) -> list[str]:
    """Network filesystems the tree lives on or holds, from `findmnt -rn -o FSTYPE,TARGET` and `stat -f -c %T`.

    The mount holding the root is the longest mount target that is a prefix of it; mounts below the root count too.
    """
    root = root.rstrip("/") or "/"
    mounts: list[tuple[str, str]] = []
    for line in findmnt_raw.splitlines():
        fstype, _, target = line.strip().partition(" ")
        if fstype and target:
            mounts.append((fstype, _unescape_mount(target)))

    def under(path: str, top: str) -> bool:
        return top == "/" or path == top or path.startswith(top.rstrip("/") + "/")

    holding = [m for m in mounts if under(root, m[1])]
    relevant = [max(holding, key=lambda m: len(m[1]))] if holding else []
    relevant += [m for m in mounts if m[1] != root and under(m[1], root)]
    found = []
    for fstype, target in relevant:
        if _network(fstype):
            found.append(f"{target} is on {fstype}")
    # Without a mount table (no findmnt), the type statfs gives the root still tells.
    if not holding and statfs_type.strip() and _network(statfs_type.strip()):
        found.append(f"{root} is on {statfs_type.strip()}")
    return found


def _network(fstype: str) -> bool:
    kind = fstype.lower()
    if kind in LOCAL_FUSE:
        return False
    return kind in NETWORK_FILESYSTEMS or kind.startswith(("fuse.", "nfs", "smb"))


def stderr_problems(stderr: str) -> list[str]:
    """What inotifywait's stderr says about lost watches (it keeps running after a failed new directory)."""
    problems = []
    for line in stderr.splitlines():
        line = line.strip()
        if WATCH_LIMIT_TEXT in line:
            problems.append(f"the inotify watch limit was reached: {line}")
        elif line.startswith(("Couldn't watch", "Failed to watch", "Error ")):
            problems.append(f"a directory is not watched: {line}")
    return problems


def parse_probe(output: str) -> dict[str, str]:
    values = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key] = value
    return values


def trust_from_probe(root: str, probe: dict[str, str], stderr: str, findmnt_raw: str) -> Trust:
    """Every reason the recorded changes may be incomplete, from what the probe script printed."""
    reasons: list[str] = []
    if probe.get("started") != "1":
        reasons.append("no tracker was started for this tree")
        return Trust(tuple(reasons))
    if probe.get("alive") != "1":
        reasons.append("the tracker is not running (killed, crashed or the host restarted): changes since are unknown")
    reasons += stderr_problems(stderr)
    if READY_LINE not in stderr and not any("watch" in r for r in reasons):
        reasons.append("the tracker is still setting up its watches: changes in unwatched directories are unseen")
    if int(probe.get("gaps", "0") or 0):
        reasons.append("the tracker was started again after it had stopped: changes in between are unknown")
    if int(probe.get("overflows", "0") or 0):
        reasons.append("the inotify event queue overflowed (Q_OVERFLOW): events were dropped")
    if int(probe.get("root_gone", "0") or 0):
        reasons.append("the tree's root or a mount inside it was moved, deleted or unmounted")
    reasons += [
        f"{f}: inotify does not see other clients' writes"
        for f in untrusted_filesystems(root, findmnt_raw, probe.get("statfs", ""))
    ]
    return Trust(tuple(reasons), int(probe.get("events_bytes", "0") or 0))


# --- rsync command lines (run on the source) ---------------------------------------------------------------------


def _slash(path: str) -> str:
    return path.rstrip("/") + "/"


def _list_args(list_file: str) -> list[str]:
    # -a does not imply -r with --files-from: -r makes a listed directory (created, moved in) copy whole.
    # A listed path missing on the source is deleted on the target; --delete clears recursed directories.
    return ["-r", "--delete", "--delete-missing-args", "--from0", f"--files-from={list_file}"]


def _listed_rsync(
    options: list[str],
    source_dir: str,
    destination: str,
    list_file: str,
    *,
    ssh: str | None,
    exclude: Iterable[str],
    chown: str | None,
) -> str:
    """rsync of only the listed paths, SRC/ → DESTINATION/; `-s` always, so no character of a path reaches a shell
    (the same rule as every other rsync of the run: the path checked is the path the user wrote)."""
    argv = ["rsync", "-a", "-s", "--numeric-ids", *_list_args(list_file), *options]
    if chown:
        argv.append(f"--chown={chown}")
    argv += [f"--exclude={pattern}" for pattern in exclude]
    if ssh:
        argv += ["-e", ssh]
    argv += [_slash(source_dir), _slash(destination)]
    return shlex.join(argv)


def final_pass_command(
    source_dir: str,
    destination: str,
    list_file: str,
    *,
    ssh: str | None = None,
    exclude: Iterable[str] = (),
    chown: str | None = None,
    timeout: int = 0,
    whole_file: bool = False,
    extra: Iterable[str] = (),
) -> str:
    """rsync of only the listed paths, SRC/ → DESTINATION/ (e.g. user@target:/dir/); `ssh` is the `-e` value.

    Nanosecond mtimes (--modify-window=-1): a file rewritten at the same size within the second would look unchanged.
    """
    options = ["--modify-window=-1"]
    if timeout > 0:
        options.append(f"--timeout={timeout}")
    if whole_file:
        options.append("--whole-file")
    options += [*extra, "--stats"]
    return _listed_rsync(options, source_dir, destination, list_file, ssh=ssh, exclude=exclude, chown=chown)


def verify_listed_command(
    source_dir: str,
    destination: str,
    list_file: str,
    *,
    ssh: str | None = None,
    exclude: Iterable[str] = (),
    chown: str | None = None,
    extra: Iterable[str] = (),
) -> str:
    """A --dry-run --checksum of only the listed paths: every line it prints is a difference (none = equal).

    It reads the listed files whole on both sides, and nothing else.
    """
    options = ["--dry-run", "--checksum", "--itemize-changes", *extra]
    return _listed_rsync(options, source_dir, destination, list_file, ssh=ssh, exclude=exclude, chown=chown)


# --- naming ------------------------------------------------------------------------------------------------------


def _then_part(stdout: str) -> tuple[str, tuple[int, str] | None]:
    """The output before the `then` command's, and what it did (None: it did not run, or was cut short)."""
    head, marked, rest = stdout.partition(f"\n{THEN_MARK}\n")
    if not marked:
        return stdout, None
    output, found, status = rest.rpartition(THEN_EXIT)
    code = status.strip()
    if not found or not code.isdigit():
        return head + "\n", None
    return head + "\n", (int(code), output)


def tracker_name(plan_name: str, tree_name: str, root: str) -> str:
    """A tracker's directory name: readable, and unique per tree root (two plans, or two labs, never share one)."""
    digest = hashlib.sha256(f"{plan_name}\0{root}".encode()).hexdigest()[:12]
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", f"{plan_name}-{tree_name}")[:60]
    return f"{readable}-{digest}"


def state_dir_command() -> str:
    """Shell: where trackers keep their files on a host (under the SSH user's home, outside every tree)."""
    return 'printf %s "${HOME:?HOME is not set}/.migrate-tracking"'


# --- the tracker -----------------------------------------------------------------------------------------------


def _q(value: str) -> str:
    return shlex.quote(value)


class ChangeTracker:
    """An inotifywait watching `root` on `host`, its files in `state_dir/name` there.

    A tracker is found again from its state directory: a new ChangeTracker with the same root, state_dir and name
    (e.g. after our process was killed) sees the one already running.
    """

    def __init__(
        self, host: RemoteHost, root: str, state_dir: str, *, name: str, program: str = TRACKER_PROGRAM
    ) -> None:
        if not root.startswith("/") or not state_dir.startswith("/"):
            raise ValueError("the tree root and the state directory are absolute paths")
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
            raise ValueError(f"tracker name {name!r}: letters, digits, '.', '_' and '-' only")
        self.host = host
        self.root = root.rstrip("/") or "/"
        self.dir = f"{state_dir.rstrip('/')}/{name}"
        self.program = program

    @property
    def pid_file(self) -> str:
        return f"{self.dir}/pid"

    @property
    def events_file(self) -> str:
        return f"{self.dir}/events"

    @property
    def stderr_file(self) -> str:
        return f"{self.dir}/stderr"

    @property
    def gaps_file(self) -> str:
        """Times a tracker of this directory was started again after one had stopped: changes in between are
        unknown until `remove()` starts the tracking afresh (with a new pre-sync)."""
        return f"{self.dir}/gaps"

    @property
    def list_file(self) -> str:
        return f"{self.dir}/changed.list"

    def _alive_test(self) -> str:
        """Shell: true when the recorded pid is an inotifywait watching our root (a reused pid is not ours)."""
        return (
            f'pid=$(cat {_q(self.pid_file)} 2>/dev/null); [ -n "$pid" ] '
            f'&& [ "$(cat /proc/$pid/comm 2>/dev/null)" = inotifywait ] '
            f'&& [ "$(readlink /proc/$pid/cwd 2>/dev/null)" = "$(readlink -f {_q(self.root)})" ]'
        )

    def start_command(self) -> str:
        events = " ".join(f"-e {e}" for e in EVENTS)
        # The inner shell records its own pid and execs inotifywait: the recorded pid is the tracker's.
        inner = (
            f"cd {_q(self.root)} && echo $$ > {_q(self.pid_file)} && exec {self.program} -m -r --no-newline "
            f"--format {_q(FORMAT)} {events} ."
        )
        return (
            f"set -e; mkdir -p {_q(self.dir)}; "
            f"if {self._alive_test()}; then echo running=$pid; exit 0; fi; "
            f"command -v perl >/dev/null || {{ echo 'perl is needed to prune the change list' >&2; exit 3; }}; "
            f"{_q(self.program.split()[0])} --help 2>&1 | grep -q -- --no-newline "
            f"|| {{ echo 'inotifywait lacks --no-newline (inotify-tools 3.21 or later needed)' >&2; exit 3; }}; "
            f'if [ -f {_q(self.pid_file)} ]; then echo "$(date -u +%FT%TZ) restarted after the tracker stopped" '
            f">> {_q(self.gaps_file)}; fi; "
            f"rm -f {_q(self.events_file)} {_q(self.stderr_file)} {_q(self.list_file)} {_q(self.scan_file)}; "
            f"echo {_q(self.root)} > {_q(self.dir + '/root')}; "
            f"setsid sh -c {_q(inner)} </dev/null >{_q(self.events_file)} 2>{_q(self.stderr_file)} & "
            f"echo started"
        )

    def start(self, *, timeout: float = 600.0) -> bool:
        """Start tracking (or find the tracker already running) and wait until its watches are established.

        A tracker started where one had stopped is recorded as a gap (see `gaps_file`): call `remove()` first when
        starting afresh, before a new pre-sync.

        Returns True when a new tracker was started. Raises TrackingError when it cannot start or dies setting up.
        """
        result = self.host.run(self.start_command(), timeout=60, check=False)
        if result.exit_status != 0:
            last = (result.stderr.strip().splitlines() or ["no message"])[-1]
            raise TrackingError(f"starting the tracker of {self.root}: {last}")
        started = result.stdout.strip().endswith("started")
        self.wait_ready(timeout=timeout)
        return started

    def wait_ready(self, *, timeout: float) -> None:
        """Wait until inotifywait says its watches are established, or fails, or dies."""
        err = _q(self.stderr_file)
        script = (
            f"until grep -q -F {_q(READY_LINE)} {err} 2>/dev/null; do "
            f"if ! {{ {self._alive_test()}; }}; then sleep 0.1; grep -q -F {_q(READY_LINE)} {err} && exit 0; "
            f"cat {err} >&2; exit 4; fi; sleep 0.05; done"
        )
        result = self.host.run(script, timeout=timeout, check=False)
        if result.exit_status == 4:
            lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
            problems = stderr_problems(result.stderr)
            said = problems[0] if problems else (lines[-1] if lines else "no message")
            raise TrackingError(f"the tracker of {self.root} exited while setting up: {said}")
        if result.exit_status != 0:
            raise TrackingError(f"the tracker of {self.root} did not establish its watches in {timeout:g} s")

    @property
    def scan_file(self) -> str:
        """How far `trust()` has read the events file: 'OFFSET OVERFLOWS ROOT_GONE' (it reads each event once)."""
        return f"{self.dir}/scanned"

    @property
    def extra_file(self) -> str:
        """NUL-separated paths added to the change list (e.g. what the pre-window comparison found different)."""
        return f"{self.dir}/extra.list"

    def write_extra(self, paths: list[str], *, timeout: float = 60.0) -> None:
        """Replace the extra list with `paths` (none: emptied; `cat` with no input would wait for one)."""
        extra = _q(self.extra_file)
        if paths:
            self.host.run(f"cat > {extra}", timeout=timeout, input="".join(f"{p}\0" for p in paths))
        else:
            self.host.run(f": > {extra}", timeout=timeout)

    def probe_command(self) -> str:
        events = _q(self.events_file)
        scan = _q(self.scan_file)
        # Incremental: only the events written since the last probe are read, complete records only (a record
        # still being written is read next time), and the counts add up in the scan file.
        return (
            f"export LC_ALL=C; "
            f"if [ -f {_q(self.pid_file)} ]; then echo started=1; else echo started=0; fi; "
            f"if {self._alive_test()}; then echo alive=1; else echo alive=0; fi; "
            f"echo events_bytes=$(stat -c %s {events} 2>/dev/null || echo 0); "
            f"set -- $(cat {scan} 2>/dev/null) 0 0 0; off=$1; "
            f"if [ -f {events} ]; then "
            f"set -- $(tail -c +$((off + 1)) {events} | perl -0 -ne {_q(SCAN)} $1 $2 $3); "
            f'echo "$1 $2 $3" > {scan}.tmp && mv {scan}.tmp {scan}; fi; '
            f"echo overflows=$2; echo root_gone=$3; "
            f"echo statfs=$(stat -f -c %T {_q(self.root)} 2>/dev/null); "
            f"echo gaps=$(cat {_q(self.gaps_file)} 2>/dev/null | wc -l); "
            f"echo --stderr--; cat {_q(self.stderr_file)} 2>/dev/null; "
            f"echo --mounts--; findmnt -rn -o FSTYPE,TARGET 2>/dev/null || true"
        )

    def is_running(self) -> bool:
        """Whether the recorded tracker is alive (an inotifywait on our root)."""
        result = self.host.run(f"if {self._alive_test()}; then echo alive; fi", timeout=30, check=False)
        return "alive" in result.stdout

    def trust(self) -> Trust:
        """Every reason the recorded changes may be incomplete (none: trusted)."""
        return self._trust_from(self.host.run(self.probe_command(), timeout=120, check=False).stdout)

    def _trust_from(self, probe_stdout: str) -> Trust:
        head, _, rest = probe_stdout.partition("--stderr--\n")
        stderr, _, mounts = rest.partition("--mounts--\n")
        return trust_from_probe(self.root, parse_probe(head), stderr, mounts)

    def changes_command(self, list_file: str, *, wait: float, since: int = 0) -> str:
        """Shell: a barrier through the tracker, then the unique changed paths up to it, NUL-separated, in list_file,
        its count, where it ended in the events file (`end`) and its exit status, then the trust probe (what
        `probe_command` prints), in that order; it exits with the list's status. `since`: an earlier list's `end`:
        only the changes recorded after it (and the extra list) are listed.

        The barrier: a marker file created and removed in the root; inotify delivers one instance's events in order,
        so once the marker's DELETE is in the events file every earlier change is too. One perl process does it all
        but the sort (`sort -z -u`: an external merge, bounded memory): this runs inside the window, where each
        process the host starts costs milliseconds (the shell pipeline it replaces started some 25).
        """
        marker = BARRIER_PREFIX + secrets.token_hex(6)
        # Polled every 2 ms: inotify usually delivers the marker's events within a millisecond.
        tries = max(1, int(wait / BARRIER_POLL))
        args = [self.root, self.dir, list_file, marker, str(tries), str(BARRIER_POLL), str(int(since))]
        return f"perl -e {_q(LIST_AND_PROBE)} -- {shlex.join(args)}"

    def changes(
        self, list_file: str | None = None, *, timeout: float = 300.0, then: str | None = None, since: int = 0
    ) -> ChangeList:
        """Write the paths changed since tracking started (`since`: since an earlier list's `end`) and the extra
        list's to `list_file` on the host (default: in the state dir).

        Trust is read AFTER the list is made: a queue overflow or a death before the barrier shows in it.
        `then`: a command run in the same round trip once the list is made and not empty, after the trust probe (the
        final pass over the list: harmless when the list turns out untrusted, the full scan that follows copies
        everything anyway); what it did comes back in `ChangeList.then`.
        """
        target = list_file or self.list_file
        result = self.host.run(
            self.changes_script(target, wait=min(timeout, 60.0), then=then, since=since), timeout=timeout, check=False
        )
        return self.read_changes(target, result.stdout, result.stderr, then=then is not None)

    def changes_script(self, list_file: str, *, wait: float, then: str | None = None, since: int = 0) -> str:
        """Shell: what `changes` runs on the host (also started ahead of time by another command there, its output
        read later by `read_changes`)."""
        # One round trip: the list (its messages on stdout), its exit status, then the trust probe, in that order on
        # the host (one perl process prints them with these markers).
        command = f"{self.changes_command(list_file, wait=wait, since=since)} 2>&1; rc=$?"
        if then is not None:
            command += (
                f'; if [ "$rc" -eq 0 ] && [ -s {_q(list_file)} ]; then echo {THEN_MARK}; ( {then} ) 2>&1; '
                f"echo {THEN_EXIT}$?; fi"
            )
        return command

    def read_changes(self, list_file: str, stdout: str, stderr: str = "", *, then: bool) -> ChangeList:
        """The ChangeList from what `changes_script` printed."""
        then_done = None
        if then:
            stdout, then_done = _then_part(stdout)
        listed, marked, probe = stdout.partition(f"\n{PROBE_MARK}\n")
        lines = [line for line in listed.splitlines() if line.strip()]
        if not marked or not lines or not lines[-1].startswith(CHANGES_EXIT):
            # Cut short before the probe (a deadline, a lost connection): the list cannot be trusted.
            said = (stderr.strip() or stdout.strip() or "no message").splitlines()[-1]
            return ChangeList(list_file, 0, Trust((f"the change list could not be made: {said}",), 0))
        trust = self._trust_from(probe)
        if lines[-1] != f"{CHANGES_EXIT}0":
            last = lines[-2] if len(lines) > 1 else "no message"
            reasons = trust.reasons or (f"the change list could not be made: {last}",)
            return ChangeList(list_file, 0, Trust(tuple(reasons), trust.events_bytes))
        listing = parse_probe("\n".join(lines[:-1]))
        end = int(listing["end"]) if listing.get("end", "").isdigit() else None
        return ChangeList(list_file, int(listing.get("count", "0")), trust, then_done, end)

    def stop(self) -> bool:
        """Stop the tracker this state directory recorded, only if that pid is still an inotifywait on our root."""
        script = f"if {self._alive_test()}; then kill $pid; echo stopped; fi"
        result = self.host.run(script, timeout=30, check=False)
        return "stopped" in result.stdout

    def remove(self) -> None:
        """Delete the state directory (after stop)."""
        self.host.run(f"rm -rf {_q(self.dir)}", timeout=60, check=False)
