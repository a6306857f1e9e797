"""What a run leaves running on the hosts while it runs, named after its owner: the plan (its file and its name) and
the run (its id).

A run starts things on the hosts that outlive a command: the replication tunnels (an `ssh -R` / `ssh -L` control
master on the source), the window's rsync route (a password file on the source, a daemon with its own directory on
the target). Each one's name on the host carries `owner(plan, run)`: `<plan key>-<run tag>`, where the plan key is a
hash of the plan file's resolved path and the plan's name (a reverse run's plan has its own), and the run tag is the
random part of the run's id. So:

- a run only ever finds ITS OWN tunnel when it asks whether one runs (`ssh -O check` of its own socket): a tunnel an
  earlier run left, answering on its socket, is never taken for this run's;
- what an earlier run of the same plan left (a run killed and never resumed, a kept reverse tunnel whose journal was
  removed) is found by the plan key, and ended by what it recorded on the host: a tunnel through its control socket
  (`ssh -O exit`), a daemon by its pid file (checked against its command line), a password file deleted. Never by
  matching a process's name;
- `migrate status` lists them (`sweep_command(..., end=False)`), a new run ends them before it starts anything
  (preflight), and a rollback ends this run's and theirs once every compensation ran.

Everything lives in the run's private directory on the host (the plan's `run_dir`: /var/lib/migrate for root, made
mode 0700 and checked to be the account's own by `private_dir_command` before anything else): no other account can
create, replace or read a name there, so the names may be known in advance.

A guard (orchestrator/services/guard.py, `<run_dir>/migrate-guard-<owner>`) is listed too but never ended: one still
waiting is what restores the source of a run that died in its window. A new run refuses to start beside another
run's waiting guard (it would restore the source in the middle of the new run's window); one that acted is only
listed.

The same names are parsed back here (`parse_sweep`): one line per thing found.
"""

from __future__ import annotations

import hashlib
import shlex
from dataclasses import dataclass
from pathlib import Path

# Answered by private_dir_command when the directory is not the account's own, private directory.
UNSAFE_DIR = "__migrate_private_dir_unsafe__"
TUNNEL_PREFIX = "migrate-tunnel-"
RSYNC_CLIENT_PREFIX = "migrate-rsync."
RSYNC_DAEMON_PREFIX = "migrate-rsyncd."
# The guard on the source (orchestrator/services/guard.py): listed, never ended here. One still waiting is the safety
# net of a run that died in its window; one that acted keeps its directory (its trace) for the operator.
GUARD_PREFIX = "migrate-guard-"
# The commit's record on the source (services/source_commit.commit_record) and the answer beside it: deleted by the
# run's finish; one a run left that never finished (killed after its commit, never resumed) goes with the next run's
# sweep (it speaks for that run only, which is over once another run of the plan starts).
COMMIT_RECORD_PREFIX = "migrate-committed-"


def plan_key(plan_name: str, plan_path: Path | str) -> str:
    """What tells one plan's things from another's: two plans of the same name (two checkouts, two operators)
    moving services through one source, or a plan and its reverse, never end each other's."""
    seed = f"{Path(plan_path).resolve()}\0{plan_name}"
    return hashlib.sha1(seed.encode()).hexdigest()[:10]


def run_tag(run_id: str) -> str:
    """The random part of a run id ('20261127-011446-3fa9c2' → '3fa9c2'); letters and digits only."""
    tail = run_id.rsplit("-", 1)[-1]
    return "".join(ch for ch in tail if ch.isalnum())[:12] or "run"


def owner(plan_name: str, plan_path: Path | str, run_id: str) -> str:
    return f"{plan_key(plan_name, plan_path)}-{run_tag(run_id)}"


@dataclass(frozen=True)
class Leftover:
    """One thing of this plan found on a host: its kind ('tunnel', 'rsync-password', 'rsync-daemon',
    'commit-record', 'guard'), the run tag it belongs to, its path there, and what became of it ('running', 'stale':
    found; 'ended': ended now; 'left': a commit record; a guard: 'waiting' to restore the source, 'acted', or 'gone'
    without acting)."""

    kind: str
    tag: str
    path: str
    state: str

    def line(self, host: str) -> str:
        return f"{self.kind} of run …{self.tag} on the {host} ({self.path}): {self.state}"


def private_dir_command(directory: str) -> str:
    """Shell: the run's private directory made (mode 0700) and proven the account's own: a real directory (no link),
    owned by the user the command runs as; else UNSAFE_DIR and exit 3, nothing written. `mkdir -p` takes a
    directory that exists already: one another account made first is refused, never used."""
    d = shlex.quote(directory)
    return (
        f"umask 077; mkdir -p -m 0700 {d} 2>/dev/null; "
        f"if [ -L {d} ] || [ ! -d {d} ] || [ ! -O {d} ]; then echo {UNSAFE_DIR} {d}; exit 3; fi; chmod 0700 {d}"
    )


def sweep_command(
    key: str,
    keep: tuple[str, ...] = (),
    *,
    end: bool,
    base: str,
    keep_records: tuple[str, ...] | None = None,
) -> str:
    """Run on a host: every tunnel, rsync password directory and rsync daemon of the plan `key` whose run tag is not
    in `keep`: listed (`end=False`: 'running' or 'stale'), or ended (`end=True`): a tunnel through its control socket,
    a daemon by the pid its own pid file holds once its command line names that directory, then the files. One line
    each: '<kind> <tag> <path> <state>'. Commit records (COMMIT_RECORD_PREFIX) of the tags in `keep_records`
    (default: `keep`) are passed over: a run's own record must outlive its rollback's sweep (it is what tells a later
    `migrate apply` that this run committed)."""
    record_keep = " ".join(keep if keep_records is None else keep_records)
    keep_words = " ".join(keep)
    run_dir = shlex.quote(base)
    tunnel_glob = f"{run_dir}/{TUNNEL_PREFIX}{key}-*.ctl"
    client_glob = f"{run_dir}/{RSYNC_CLIENT_PREFIX}{key}-*"
    daemon_glob = f"{run_dir}/{RSYNC_DAEMON_PREFIX}{key}-*"
    if end:
        tunnel_act = (
            'ssh -o ControlPath="$f" -O exit x >/dev/null 2>&1; rm -f "$f" "${f%.ctl}.log"; say tunnel "$f" ended'
        )
        client_act = 'rm -rf "$f"; say rsync-password "$f" ended'
        daemon_act = (
            'pid=$(cat "$f/pid" 2>/dev/null); '
            'if [ -n "$pid" ] && tr "\\0" " " <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$f/rsyncd.conf"; then '
            'kill "$pid" 2>/dev/null; fi; rm -rf "$f"; say rsync-daemon "$f" ended'
        )
    else:
        tunnel_act = (
            'if ssh -o ControlPath="$f" -O check x >/dev/null 2>&1; then say tunnel "$f" running; '
            'else say tunnel "$f" stale; fi'
        )
        client_act = 'say rsync-password "$f" stale'
        daemon_act = (
            'pid=$(cat "$f/pid" 2>/dev/null); '
            'if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then say rsync-daemon "$f" running; '
            'else say rsync-daemon "$f" stale; fi'
        )
    record_glob = f"{run_dir}/{COMMIT_RECORD_PREFIX}{key}-*"
    record_act = 'rm -f "$f"; say commit-record "$f" ended' if end else 'say commit-record "$f" left'
    guard_glob = f"{run_dir}/{GUARD_PREFIX}{key}-*"
    # A guard is waiting while the pid it wrote runs its own script; it acted once its trace says 'restored'.
    guard_act = (
        'pid=$(cat "$f/pid" 2>/dev/null); '
        'if grep -q " restored$" "$f/trace" 2>/dev/null; then say guard "$f" acted; '
        'elif [ -n "$pid" ] && tr "\\0" " " <"/proc/$pid/cmdline" 2>/dev/null | grep -qF "$f/guard.sh"; then '
        'say guard "$f" waiting; else say guard "$f" gone; fi'
    )
    script = f"""shopt -s nullglob
keep=" {keep_words} "
say() {{ echo "$1 $tag $2 $3"; }}
tag_of() {{ local base=${{1##*/}}; base=${{base#"$2"{key}-}}; base=${{base%%.*}}; echo "${{base%%-*}}"; }}
for f in {tunnel_glob}; do
  tag=$(tag_of "$f" {TUNNEL_PREFIX}); case "$keep" in *" $tag "*) continue;; esac
  {tunnel_act}
done
declare -A seen
for f in {client_glob}; do
  [ -n "${{seen[$f]:-}}" ] && continue; seen[$f]=1
  tag=$(tag_of "$f" {RSYNC_CLIENT_PREFIX}); case "$keep" in *" $tag "*) continue;; esac
  {client_act}
done
for f in {daemon_glob}; do
  [ -n "${{seen[$f]:-}}" ] && continue; seen[$f]=1
  tag=$(tag_of "$f" {RSYNC_DAEMON_PREFIX}); case "$keep" in *" $tag "*) continue;; esac
  {daemon_act}
done
for f in {record_glob}; do
  tag=$(tag_of "$f" {COMMIT_RECORD_PREFIX}); case " {record_keep} " in *" $tag "*) continue;; esac
  {record_act}
done
for f in {guard_glob}; do
  tag=$(tag_of "$f" {GUARD_PREFIX}); case "$keep" in *" $tag "*) continue;; esac
  {guard_act}
done
true"""
    return "bash -c " + shlex.quote(script)


def parse_sweep(stdout: str) -> list[Leftover]:
    found: list[Leftover] = []
    for line in stdout.splitlines():
        parts = line.split(" ")
        if len(parts) >= 4 and parts[0] in ("tunnel", "rsync-password", "rsync-daemon", "commit-record", "guard"):
            found.append(Leftover(parts[0], parts[1], " ".join(parts[2:-1]), parts[-1]))
    return found


def tunnel_socket(base: str, owner_name: str, direction: str) -> str:
    """The control socket of a run's tunnel ('fwd': the replica's `ssh -R`; 'rev': the reverse path's `ssh -L`)."""
    return f"{base.rstrip('/')}/{TUNNEL_PREFIX}{owner_name}-{direction}.ctl"
