"""Generated hostile plans: every variant is refused with exactly one `file:line:col: field: message` line per
problem, never a traceback, within bounded work (node and size counters, memory measured in a subprocess)."""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.plan.loader import MAX_PLAN_BYTES, MAX_PLAN_EXPANDED, MAX_PLAN_VALUES, PlanError, load_plan
from tests.engine.world import Result

MIGRATE = Path(sys.executable).parent / "migrate"
MAX_RSS_MB = 200

# Every field a mutation aims at is written on its own line, `key: value`, once.
BASE = """\
name: shop
description: the shop
source:
  address: 203.0.113.10
  ssh_port: 22
  user: root
  key: /root/.ssh/migrate
  known_hosts: /root/.ssh/known_hosts
  connect_timeout: 10
target:
  address: 203.0.113.20
  ssh_port: 22
files:
  - name: uploads
    source: /var/www/shop/uploads
    target: /var/www/shop/uploads
    owner: www-data:www-data
    exclude:
      - "*.tmp"
database:
  password: {env: SHOP_DB_PASSWORD}
  schemas:
    - shop
  connect_timeout: 10
  read_timeout: 60
  source:
    socket: /run/mysqld/mysqld.sock
    port: 3306
    datadir: /var/lib/mysql
    start: systemctl start mariadb
    stop: systemctl stop mariadb
  target:
    datadir: /srv/db/mysql
    start: systemctl start mariadb
    stop: systemctl stop mariadb
  presync:
    max_rounds: 5
    converged_bytes: 1000
services:
  fence: {enable: touch /srv/maintenance, disable: rm -f /srv/maintenance}
health:
  checks:
    - kind: http
      url: http://203.0.113.20/healthz
      host_header: www.example.com
      expect_status: 200
      timeout: 5
    - kind: tcp
      host: 203.0.113.20
      port: 443
  attempts: 10
  interval: 1
dns:
  api_token: {env: CLOUDFLARE_API_TOKEN}
  zone: example.com
  records:
    - www.example.com
  base_url: https://api.cloudflare.com/client/v4
  timeout: 30
cutover:
  lock_wait_timeout: 3
  lock_attempts: 5
  lock_retry_backoff: 2
  max_write_block: 60
  postpone_flag: hold
finish:
  drain_seconds: 0
transfer:
  bwlimit: 50M
  rsync_timeout: 300
  source_to_target_key: /root/.ssh/to-target
  source_to_target_known_hosts: /root/.ssh/known_hosts
hooks:
  dir: hooks
  timeout: 60
retry:
  attempts: 5
  max_seconds: 120
  max_wait: 10
"""
LINES = BASE.splitlines()


def _field_paths() -> dict[int, str]:
    """Line number (1-based) → the dotted field path written on it, from the indentation."""
    paths: dict[int, str] = {}
    stack: list[tuple[int, str]] = []  # (indent, path) of the enclosing keys and list items
    counters: dict[str, int] = {}
    for number, line in enumerate(LINES, start=1):
        content = line.lstrip(" ")
        indent = len(line) - len(content)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        if content.startswith("- "):
            counters[parent] = counters.get(parent, -1) + 1
            parent = f"{parent}[{counters[parent]}]"
            stack.append((indent, parent))
            content, indent = content[2:], indent + 2
        key = re.match(r"^([a-z_]+):", content)
        path = f"{parent}.{key[1]}" if key and parent else (key[1] if key else parent)
        paths[number] = path
        if key:
            stack.append((indent, path))
    return paths


FIELD_OF_LINE = _field_paths()


def line_of(field: str) -> int:
    return next(number for number, path in FIELD_OF_LINE.items() if path == field)


NUMBER_FIELDS = [
    "source.ssh_port", "source.connect_timeout", "database.connect_timeout", "database.read_timeout",
    "database.source.port", "database.presync.max_rounds", "database.presync.converged_bytes",
    "health.checks[0].expect_status", "health.checks[0].timeout", "health.checks[1].port", "health.attempts",
    "health.interval", "dns.timeout", "cutover.lock_wait_timeout", "cutover.lock_attempts",
    "cutover.lock_retry_backoff", "cutover.max_write_block", "finish.drain_seconds", "transfer.rsync_timeout",
    "hooks.timeout", "retry.attempts", "retry.max_seconds", "retry.max_wait",
]  # fmt: skip
# Not a number in range for any of the fields above (booleans and numeric text included: types are strict).
BAD_NUMBERS = [
    ".inf", "-.inf", ".nan", "1e400", "true", "false", "'1e3'", "'5'", "-1", "1e13", "null", "[1]", "{a: 1}", "abc",
    "10000000000000",
]  # fmt: skip
# Values that exceed just the field named.
OVER_THE_TOP = {
    "cutover.lock_attempts": "1100", "cutover.max_write_block": "3601", "finish.drain_seconds": "86401",
    "health.checks[0].expect_status": "600", "source.ssh_port": "65536", "retry.attempts": "101",
    "health.attempts": "1001", "transfer.rsync_timeout": "86401", "cutover.lock_retry_backoff": "61",
}  # fmt: skip
CONTROL = ['"a\\nb"', '"a\\0b"', '"a\\tb"', '"a\\eb"', '"a\\x7fb"', '"a\\x85b"', '"a\\u202eb"', '"a\\u2028b"']
PATH_FIELDS = [
    "source.key", "source.known_hosts", "database.source.socket", "cutover.postpone_flag", "hooks.dir",
    "transfer.source_to_target_key", "transfer.source_to_target_known_hosts",
]  # fmt: skip
DIRECTORY_FIELDS = ["files[0].source", "files[0].target", "database.source.datadir", "database.target.datadir"]
BAD_DIRECTORIES = [
    "/", "/usr/local", "/etc/ssh", "/root/.ssh", "/boot/efi", "/proc/self", "/dev/shm", "/var/log/x", "/tmp",
    "/var/www", "/home/site", "/srv/app/.ssh", "relative/dir", "/var/www/shop/../../etc", "/srv/[x]", "/srv/*",
    "''", "/srv/" + "b" * 300, "/lib/x86_64-linux-gnu", "/run/user",
]  # fmt: skip
TEXT_FIELDS = {
    "name": ["''", "../x", "a/b", "x" * 57, ".hidden", "-x", "'a b'", "ä", "'y[red]z'", "true", "12"],
    "health.checks[0].url": [
        "ftp://x/", "http://", "'not a url'", "http://h:99999/", "javascript:alert(1)", '"http://a b/"', "''",
        "http://" + "h" * 2100,
    ],
    "dns.base_url": ["ftp://x/", "//host/path", "http:///x"],
    "dns.zone": ["''", "'a b'", "x" * 300, '"ex\\nample.com"', "-.com"],
    "files[0].owner": ["'a b'", "'root;id'", "''", "x:y:z"],
    "transfer.bwlimit": ["fast", "'-1'", "50M;id", "''"],
    "source.address": ["'-oProxyCommand=x'", "'a b'", "''", '"h\\nx"'],
    "source.user": ["'-oProxyCommand=x'", "'a@b'", "''", "x" * 33, "'root;id'"],
    "health.checks[0].host_header": ["'a b'", "x:0", "'[::1]x'", '"a\\nb"'],
    "description": ['"a\\0b"', "x" * 1001],
    "files[0].name": ["''", '"a\\eb"', "x" * 101],
}  # fmt: skip
LIST_ITEM_FIELDS = {
    "files[0].exclude[0]": ['"+ keep"', '"- x"', '"!"', '"a\\nb"'],
    "database.schemas[0]": ["''", "x" * 65, '"a\\0b"'],
    "dns.records[0]": ["''", "'a b'", "x" * 300, '"a\\nb"'],
}


@dataclass(frozen=True)
class Variant:
    label: str
    text: str
    blamed: list[tuple[int, str]]  # (line, field) of each problem


def replace_line(text_lines: list[str], number: int, value: str) -> list[str]:
    """The line's value replaced, its key (or list dash) kept."""
    lines = list(text_lines)
    line = lines[number - 1]
    keyed = re.match(r"^(\s*(- )?[a-z_]+):", line)
    head = keyed[1] + ":" if keyed else line[: line.index("- ") + 1]
    lines[number - 1] = f"{head} {value}"
    return lines


def variants() -> Iterator[Variant]:
    single: list[tuple[str, str]] = [(f, v) for f in NUMBER_FIELDS for v in BAD_NUMBERS]
    single += list(OVER_THE_TOP.items())
    single += [(f, v) for f in PATH_FIELDS + DIRECTORY_FIELDS for v in CONTROL]
    single += [(f, v) for f in DIRECTORY_FIELDS for v in BAD_DIRECTORIES]
    single += [(f, v) for f, values in TEXT_FIELDS.items() for v in values]
    single += [(f, v) for f, values in LIST_ITEM_FIELDS.items() for v in values]
    for field, value in single:
        number = line_of(field)
        lines = replace_line(LINES, number, value)
        yield Variant(f"{field}={value[:40]}", "\n".join(lines) + "\n", [(number, field)])
    # Several problems at once: one line each.
    for group in itertools.islice(itertools.combinations(NUMBER_FIELDS, 3), 0, 60, 7):
        lines = list(LINES)
        for field in group:
            lines = replace_line(lines, line_of(field), ".inf")
        yield Variant("+".join(group), "\n".join(lines) + "\n", sorted((line_of(f), f) for f in group))


ALL_VARIANTS = list(variants())
ERROR_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<field>[A-Za-z0-9_.\[\]]+): (?P<message>.+)$")


def test_the_base_plan_is_valid(tmp_path: Path) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(BASE)
    assert load_plan(path).plan.name == "shop"


def test_the_generator_makes_hundreds_of_variants() -> None:
    assert len(ALL_VARIANTS) >= 500, len(ALL_VARIANTS)


@pytest.mark.parametrize("variant", ALL_VARIANTS, ids=[v.label for v in ALL_VARIANTS])
def test_each_problem_is_one_located_line(tmp_path: Path, variant: Variant) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(variant.text)
    with pytest.raises(PlanError) as caught:  # anything else (a traceback) fails the test
        load_plan(path)
    lines = caught.value.lines
    assert len(lines) == len(variant.blamed), lines
    for line, (number, field) in zip(lines, variant.blamed, strict=True):
        match = ERROR_LINE.match(line)
        assert match is not None, line
        assert match["file"] == str(path)
        assert int(match["line"]) == number, line
        assert match["field"] == field or match["field"].startswith(field + "["), line
        assert "\n" not in line and "\x00" not in line and "\x1b" not in line


def run_measured(*args: str) -> tuple[int, str, int]:
    """Run `migrate validate` in a fresh process; returns exit code, stderr and its peak RSS in MB."""
    probe = (
        "import json, resource, subprocess, sys\n"
        "done = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)\n"
        "peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss // 1024\n"
        "print(json.dumps([done.returncode, done.stderr + done.stdout, peak]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe, str(MIGRATE), "validate", *args], capture_output=True, text=True, check=True
    )
    code, output, peak = json.loads(result.stdout)
    return code, output, peak


def hostile_documents() -> dict[str, tuple[str, str]]:
    """name → (text, the limit its one line must name)."""
    big = "x" * 100_000
    alias = "\n".join([f'big: &b "{big}"', "name: shop", "files:", *(["  - *b"] * 10_000)]) + "\n"
    # The 806 KB plan of the report: one 100 KB string, aliased 10,000 times, padded with comments.
    alias += "# " + "p" * 98 + "\n" * 1
    alias += ("# " + "p" * 97 + "\n") * ((806_000 - len(alias)) // 100)
    laughs = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    laughs += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    return {
        "alias-806KB": (alias, f"more than {MAX_PLAN_EXPANDED // 1024 // 1024} MiB of text"),
        "items-50000": ("name: shop\nfiles:\n" + "  - a\n" * 50_000, f"more than {MAX_PLAN_VALUES} values"),
        "flow-200000": ("name: shop\nfiles: [" + "a," * 200_000 + "a]\n", f"more than {MAX_PLAN_VALUES} values"),
        "billion-laughs": ("\n".join(laughs) + "\n", f"more than {MAX_PLAN_VALUES} values"),
        "deep": ("name: " + "[" * 5000 + "]" * 5000 + "\n", "nested more than"),
        "long-key": ("? " + "k" * 200_000 + "\n: 1\n", "not a plan key"),
    }


@pytest.mark.parametrize("name", list(hostile_documents()))
def test_hostile_documents_are_refused_with_one_line_and_bounded_memory(tmp_path: Path, name: str) -> None:
    text, limit = hostile_documents()[name]
    assert len(text.encode()) <= MAX_PLAN_BYTES, "under the file size limit: the loader's own bounds must act"
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    code, output, peak_mb = run_measured(str(path))
    assert code == 2, output
    lines = output.strip().splitlines()
    assert len(lines) == 1, lines[:5]
    assert lines[0].startswith(str(path)) and limit in lines[0], lines[0]
    assert "Traceback" not in output
    assert peak_mb < MAX_RSS_MB, f"{name}: {peak_mb} MB"


# Every sampled variant through the command's `main` in the test's process; some of them also through the installed
# command in a process of its own, whose peak memory is measured (a process start-up each: the hostile documents
# above measure the loader's bounds).
MEASURED = ALL_VARIANTS[::200]


@pytest.mark.parametrize("variant", ALL_VARIANTS[::40], ids=[v.label for v in ALL_VARIANTS[::40]])
def test_the_command_line_prints_the_same_lines_and_exits_2(
    tmp_path: Path, variant: Variant, migrate_here: Callable[..., Result]
) -> None:
    path = tmp_path / "plan.yaml"
    path.write_text(variant.text)
    here = migrate_here("validate", str(path))
    runs = [(here.returncode, here.stderr + here.stdout)]
    if variant in MEASURED:
        code, output, peak_mb = run_measured(str(path))
        runs.append((code, output))
        assert peak_mb < MAX_RSS_MB
    for code, output in runs:
        assert code == 2, output
        assert "Traceback" not in output
        assert len(output.strip().splitlines()) == len(variant.blamed), output
