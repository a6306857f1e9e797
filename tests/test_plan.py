"""The plan loader: valid plans load, every mistake is one `file:line:col: field: message` line, never a traceback."""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError

from orchestrator.plan.checks import PROTECTED_DIRECTORIES, PROTECTED_TREES, directory_problem
from orchestrator.plan.loader import MAX_PLAN_BYTES, LoadedPlan, PlanError, load_plan, plan_json_schema
from orchestrator.plan.model import Plan

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "plans" / "course-review.yaml"
MIGRATE = Path(sys.executable).parent / "migrate"

# Line numbers below are asserted exactly: keep this text as is.
SMALL_PLAN = """\
name: shop
source:
  address: 203.0.113.10
target:
  address: 203.0.113.20
files:
  - name: uploads
    source: /var/www/shop/uploads
    target: /var/www/shop/uploads
database:
  password: {env: SHOP_DB_PASSWORD}
  source:
    datadir: /var/lib/mysql
    start: systemctl start mariadb
    stop: systemctl stop mariadb
  target:
    datadir: /var/lib/mysql
    start: systemctl start mariadb
    stop: systemctl stop mariadb
dns:
  api_token: {env: CLOUDFLARE_API_TOKEN}
  zone: example.com
  records: [example.com]
cutover:
  max_write_block: 60
services:
  fence: {enable: touch /srv/maintenance, disable: rm -f /srv/maintenance}
"""
SMALL_FENCE = "services:\n  fence: {enable: touch /srv/maintenance, disable: rm -f /srv/maintenance}\n"


def write(tmp_path: Path, text: str | bytes, name: str = "plan.yaml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    return path


def broken(tmp_path: Path, old: str, new: str, base: str = SMALL_PLAN) -> Path:
    assert base.count(old) >= 1, old
    return write(tmp_path, base.replace(old, new, 1))


def error_of(path: Path) -> PlanError:
    with pytest.raises(PlanError) as caught:
        load_plan(path)
    error = caught.value
    assert "\n" not in str(error)
    assert all("\n" not in line for line in error.lines)
    assert str(error) == error.lines[0]
    return error


# --- valid plans --------------------------------------------------------------------------------------------------


def test_the_example_plan_validates_with_its_production_values() -> None:
    loaded = load_plan(EXAMPLE)
    plan = loaded.plan
    assert isinstance(loaded, LoadedPlan)
    assert loaded.sha256 == hashlib.sha256(EXAMPLE.read_bytes()).hexdigest()
    assert loaded.text == EXAMPLE.read_text()
    assert (plan.source.address, plan.target.address) == ("203.0.113.10", "203.0.113.20")
    assert plan.database.source.datadir == plan.database.target.datadir == "/var/lib/mysql"
    assert [tree.target for tree in plan.files] == ["/var/www/course-review/uploads"]
    assert {service.name for service in plan.services.target} == {"nginx", "php-fpm"}
    assert (plan.dns.zone, plan.dns.records) == ("example.com", ["example.com", "www.example.com"])
    assert plan.dns_content == "203.0.113.20"
    assert plan.dns.api_token.env == "CLOUDFLARE_API_TOKEN"


def test_the_example_plan_comments_every_section() -> None:
    lines = EXAMPLE.read_text().splitlines()
    for index, line in enumerate(lines):
        if line and not line[0].isspace() and not line.startswith("#") and line.endswith(":"):
            assert lines[index - 1].startswith("#"), f"section '{line}' has no comment above it"


def test_line_of_points_at_the_key(tmp_path: Path) -> None:
    loaded = load_plan(write(tmp_path, SMALL_PLAN))
    assert loaded.line_of(("files", 0, "target")) == 9
    assert loaded.line_of(("database", "target", "datadir")) == 17
    assert loaded.line_of(("dns", "records", 0)) == 23
    assert loaded.line_of(("health", "checks")) is None


def test_defaults_fill_what_the_plan_leaves_out(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, SMALL_PLAN)).plan
    assert plan.source.ssh_port == 22
    assert plan.cutover.lock_wait_timeout == 3.0
    assert plan.cutover.max_write_block == 60
    assert plan.database.engine == "mariadb"


def test_unquoted_date_is_kept_as_the_text_written(tmp_path: Path) -> None:
    plan = load_plan(broken(tmp_path, "name: shop\n", "name: shop\ndescription: 2026-11-21\n")).plan
    assert plan.description == "2026-11-21"


# --- field errors point at the exact line -------------------------------------------------------------------------


def test_missing_field_points_at_the_mapping_that_lacks_it(tmp_path: Path) -> None:
    path = broken(tmp_path, "    datadir: /var/lib/mysql\n", "")
    assert str(error_of(path)) == f"{path}:12:3: database.source.datadir: field required"


def test_missing_top_level_section(tmp_path: Path) -> None:
    text = SMALL_PLAN.replace("dns:\n  api_token: {env: CLOUDFLARE_API_TOKEN}\n  zone: example.com\n", "")
    text = text.replace("  records: [example.com]\n", "")
    path = write(tmp_path, text)
    assert str(error_of(path)) == f"{path}:1:1: dns: field required"


def test_unknown_key_suggests_the_field_it_resembles(tmp_path: Path) -> None:
    path = broken(tmp_path, "    datadir: /var/lib/mysql\n", "    datdir: /var/lib/mysql\n")
    error = error_of(path)
    assert str(error) == f"{path}:13:5: database.source.datdir: unknown key 'datdir' (did you mean 'datadir'?)"
    # the missing field it explains is reported too, on its own line
    assert f"{path}:12:3: database.source.datadir: field required" in error.lines


def test_unknown_key_without_a_close_match(tmp_path: Path) -> None:
    path = broken(tmp_path, "cutover:\n", "cutover:\n  zzz: 1\n")
    assert str(error_of(path)) == f"{path}:25:3: cutover.zzz: unknown key 'zzz'"


def test_wrong_type_says_what_was_expected(tmp_path: Path) -> None:
    path = broken(tmp_path, "max_write_block: 60", "max_write_block: abc")
    assert str(error_of(path)) == f"{path}:25:3: cutover.max_write_block: expected a number, got 'abc'"


def test_number_where_text_is_expected(tmp_path: Path) -> None:
    path = broken(tmp_path, "name: shop", "name: 2026")
    assert str(error_of(path)) == f"{path}:1:1: name: expected text, got 2026 (put it in quotes)"


def test_out_of_range_port(tmp_path: Path) -> None:
    path = broken(tmp_path, "  address: 203.0.113.20\n", "  address: 203.0.113.20\n  ssh_port: 70000\n")
    assert str(error_of(path)) == f"{path}:6:3: target.ssh_port: must be at most 65535, got 70000"


def test_bad_plan_name(tmp_path: Path) -> None:
    path = broken(tmp_path, "name: shop", "name: my shop")
    assert str(error_of(path)).startswith(f"{path}:1:1: name: must start with a letter or digit")


def test_unknown_health_check_kind_points_at_kind(tmp_path: Path) -> None:
    text = SMALL_PLAN + "health:\n  checks:\n    - kind: http\n      url: http://203.0.113.20/\n    - kind: ping\n"
    path = write(tmp_path, text)
    message = str(error_of(path))
    assert message.startswith(f"{path}:32:7: health.checks[1].kind: unknown kind 'ping'")


def test_missing_field_in_a_health_check(tmp_path: Path) -> None:
    text = SMALL_PLAN + "health:\n  checks:\n    - kind: tcp\n      host: 203.0.113.20\n"
    path = write(tmp_path, text)
    assert str(error_of(path)) == f"{path}:30:7: health.checks[0].port: field required"


# --- dangerous values -----------------------------------------------------------------------------------------------


def test_relative_path_refused(tmp_path: Path) -> None:
    path = broken(tmp_path, "source: /var/www/shop/uploads", "source: var/www/shop/uploads")
    assert str(error_of(path)) == f"{path}:8:5: files[0].source: must be an absolute path"


@pytest.mark.parametrize(
    ("value", "shown"), [("/", "/"), ("/etc", "/etc"), ("/etc/", "/etc"), ("//var/lib", "/var/lib")]
)
def test_root_and_system_directories_refused(tmp_path: Path, value: str, shown: str) -> None:
    path = broken(tmp_path, "target: /var/www/shop/uploads", f"target: {value}")
    expected = f"{path}:9:5: files[0].target: refusing to sync into {shown}: a system directory (never allowed)"
    assert str(error_of(path)) == expected


def test_system_directory_refused_as_datadir(tmp_path: Path) -> None:
    path = broken(tmp_path, "    datadir: /var/lib/mysql\n    start", "    datadir: /var/lib\n    start")
    expected = (
        f"{path}:13:5: database.source.datadir: refusing to sync into /var/lib: a system directory (never allowed)"
    )
    assert str(error_of(path)) == expected


def test_unnormalised_path_refused_with_the_normal_form(tmp_path: Path) -> None:
    path = broken(tmp_path, "target: /var/www/shop/uploads", "target: /var/www/shop/../shop/uploads/")
    message = str(error_of(path))
    assert message.startswith(f"{path}:9:5: files[0].target: must be a normalised path: write '/var/www/shop/uploads'")


# Everything beneath a system tree is refused, not only the tree itself (the paths the old exact-match list let by).
BENEATH_SYSTEM_TREES = [
    "/usr/bin", "/usr/lib", "/usr/local", "/usr/local/app", "/boot/efi", "/etc/ssh", "/etc/mysql", "/root/.ssh",
    "/root/site", "/lib/x86_64-linux-gnu", "/lib64/x", "/proc/self", "/sys/kernel", "/dev/shm", "/dev/shm/x",
    "/run/user", "/run/user/0", "/var/log", "/var/log/nginx", "/var/cache", "/var/cache/apt", "/var/lib/dpkg",
    "/var/lib/docker/volumes/x", "/sbin/x", "/bin/x", "/var/spool/cron", "/home/site/.ssh", "/srv/app/.ssh/keys",
    "/home/site/.gnupg", "/var/run", "/var/run/app", "/var/lock/x",
]  # fmt: skip
# Refused themselves only; ordinary places inside them.
THEMSELVES = ["/tmp", "/var/tmp", "/opt", "/srv", "/var/www", "/home", "/home/site", "/var", "/mnt", "/media"]
ORDINARY = [
    "/var/www/app", "/var/www/shop/uploads", "/srv/data", "/opt/shop/uploads", "/tmp/build", "/var/tmp/x",
    "/home/site/uploads", "/etc2", "/usr2/x", "/library", "/data/mysql", "/mnt/volume/uploads",
]  # fmt: skip


@pytest.mark.parametrize("directory", BENEATH_SYSTEM_TREES + THEMSELVES)
def test_protected_directories_are_refused_by_prefix(directory: str) -> None:
    assert directory_problem(directory) is not None, directory
    assert directory_problem(directory, datadir=True) is not None, directory


@pytest.mark.parametrize("directory", ORDINARY)
def test_ordinary_directories_are_allowed(directory: str) -> None:
    assert directory_problem(directory) is None, directory
    assert directory_problem(directory, datadir=True) is None, directory


def test_the_policy_covers_its_documented_lists() -> None:
    for tree in PROTECTED_TREES:
        assert directory_problem(tree) is not None and directory_problem(tree + "/x/y") is not None, tree
    for directory in PROTECTED_DIRECTORIES:
        assert directory_problem(directory) is not None, directory
    assert directory_problem("") == "must not be empty"
    assert directory_problem("uploads") == "must be an absolute path"


@pytest.mark.parametrize("datadir", ["/var/lib/mysql", "/var/lib/mariadb", "/var/lib/mysql2", "/var/lib/mysql/data"])
def test_a_datadir_may_live_in_the_database_directory_under_var_lib(datadir: str) -> None:
    assert directory_problem(datadir, datadir=True) is None
    # ... but a file tree may not be synced there.
    assert directory_problem(datadir) is not None


def test_allow_protected_path_opts_in_except_for_the_never_allowed(tmp_path: Path) -> None:
    target = "    target: /var/www/shop/uploads\n"
    path = broken(tmp_path, target, "    target: /etc/nginx/sites\n")
    assert "inside /etc, a protected system tree; if you really mean it, set allow_protected_path" in str(
        error_of(path)
    )
    path = broken(tmp_path, target, "    target: /etc/nginx/sites\n    allow_protected_path: true\n")
    assert load_plan(path).plan.files[0].target == "/etc/nginx/sites"
    for never in ("/", "/etc", "/usr", "/var/lib", "/proc/x", "/sys/x", "/dev/shm"):
        assert "never allowed" in str(directory_problem(never, allow_protected=True)), never


def test_two_trees_with_one_target_refused(tmp_path: Path) -> None:
    second = "  - name: media\n    source: /var/www/shop/media\n    target: /var/www/shop/uploads\n"
    path = broken(tmp_path, "database:\n", second + "database:\n")
    expected = f"{path}:12:5: files[1].target: same target as tree 'uploads': two trees would overwrite each other"
    assert str(error_of(path)) == expected


def test_tree_into_the_target_datadir_refused(tmp_path: Path) -> None:
    path = broken(tmp_path, "target: /var/www/shop/uploads", "target: /var/lib/mysql\n    allow_protected_path: true")
    expected = f"{path}:9:5: files[0].target: a tree may not be synced into the target's datadir"
    assert str(error_of(path)) == expected


def test_same_source_and_target_host_refused(tmp_path: Path) -> None:
    path = broken(tmp_path, "address: 203.0.113.20", "address: 203.0.113.10")
    expected = f"{path}:5:3: target.address: source and target are the same host (same address and ssh_port)"
    assert str(error_of(path)) == expected
    # another port on the same address is another host (e.g. a second sshd)
    path = broken(tmp_path, "address: 203.0.113.20", "address: 203.0.113.10\n  ssh_port: 2222")
    assert load_plan(path).plan.target.ssh_port == 2222


def test_cross_checks_also_guard_plans_built_in_code(tmp_path: Path) -> None:
    plan = load_plan(write(tmp_path, SMALL_PLAN)).plan
    data = plan.model_dump()
    data["files"][0]["target"] = "/var/lib/mysql"
    data["files"][0]["allow_protected_path"] = True
    with pytest.raises(ValidationError, match=r"files\[0\]\.target: a tree may not be synced into"):
        Plan.model_validate(data)


# --- fences: a fence that cannot be lifted, files moved with nothing stopping uploads ------------------------------


def test_fence_without_a_way_to_lift_it_is_refused(tmp_path: Path) -> None:
    # A rollback would leave the source fenced while saying it serves.
    path = broken(tmp_path, "  fence: {enable: touch /srv/maintenance, disable: rm -f /srv/maintenance}",
                  "  fence: {enable: touch /srv/maintenance}")  # fmt: skip
    assert str(error_of(path)) == (
        f"{path}:27:3: services.fence.disable: required with services.fence.enable: a rollback runs it so the "
        "source takes writes again (without it the source would stay fenced while the run says it serves)"
    )


def test_target_fence_without_a_way_to_lift_it_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL_PLAN + "  target_fence:\n    enable: touch /srv/maintenance-target\n")
    assert str(error_of(path)).startswith(
        f"{path}:28:3: services.target_fence.disable: required with services.target_fence.enable: the DNS flip runs it"
    )


def test_moving_files_without_a_source_fence_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL_PLAN.removesuffix(SMALL_FENCE))
    error = error_of(path)
    assert str(error).startswith(f"{path}:6:1: files: moving files needs services.fence.enable")
    assert "uploads after the final file sync" in str(error) and "would be lost" in str(error)
    # Built in code, the same plan is refused too.
    data = load_plan(write(tmp_path, SMALL_PLAN, "fenced.yaml")).plan.model_dump()
    data["services"]["fence"] = {}
    with pytest.raises(ValidationError, match=r"files: moving files needs services\.fence\.enable"):
        Plan.model_validate(data)


def test_a_plan_without_files_needs_no_fence(tmp_path: Path) -> None:
    text = SMALL_PLAN.removesuffix(SMALL_FENCE).replace(
        "files:\n  - name: uploads\n    source: /var/www/shop/uploads\n    target: /var/www/shop/uploads\n", ""
    )
    plan = load_plan(write(tmp_path, text)).plan
    assert plan.files == [] and plan.services.fence.enable is None


def test_reverse_problem_names_the_missing_target_fence(tmp_path: Path) -> None:
    assert load_plan(write(tmp_path, REVERSIBLE_PLAN)).plan.reverse_problem() is None
    problem = load_plan(write(tmp_path, SMALL_PLAN, "small.yaml")).plan.reverse_problem()
    assert problem is not None and "services.target_fence.enable" in problem
    assert load_plan(EXAMPLE).plan.reverse_problem() is None


# --- secrets are never echoed ---------------------------------------------------------------------------------------

SECRET = "cf-7Hq2xZsecretTOKEN9"


def test_plain_string_secret_refused_without_echoing_it(tmp_path: Path) -> None:
    path = broken(tmp_path, "api_token: {env: CLOUDFLARE_API_TOKEN}", f"api_token: {SECRET}")
    error = error_of(path)
    assert str(error) == (
        f"{path}:21:3: dns.api_token: a secret must be a reference, {{env: VARIABLE}} or {{file: /path/to/file}},"
        " not a value in the plan"
    )
    assert all(SECRET not in line for line in error.lines)


@pytest.mark.parametrize(
    "written",
    [
        f"password: {SECRET}",
        f"password: {{env: '{SECRET} x'}}",
        f"password: {{env: X, value: {SECRET}}}",
        f"password: [{SECRET}]",
        f"password: 12345678\n  password: {SECRET}",  # duplicate key: ruamel's own message would show both
    ],
)
def test_no_error_about_a_secret_repeats_its_value(tmp_path: Path, written: str) -> None:
    path = broken(tmp_path, "password: {env: SHOP_DB_PASSWORD}", written)
    error = error_of(path)
    assert error.lines[0].startswith(f"{path}:")
    assert all(SECRET not in line and "12345678" not in line for line in error.lines)


def test_validation_error_printed_as_is_hides_the_secret(tmp_path: Path) -> None:
    data = load_plan(write(tmp_path, SMALL_PLAN)).plan.model_dump()
    data["dns"]["api_token"] = SECRET
    with pytest.raises(ValidationError) as caught:
        Plan.model_validate(data)
    assert SECRET not in str(caught.value)


# --- files that are not plans -------------------------------------------------------------------------------------


def test_not_yaml(tmp_path: Path) -> None:
    path = write(tmp_path, "name: shop\nsource: [1,\n")
    assert str(error_of(path)).startswith(f"{path}:3:1: not valid YAML: ")


def test_yaml_syntax_error_points_at_its_line(tmp_path: Path) -> None:
    path = broken(tmp_path, "  zone: example.com", "  zone: example.com: x")
    assert str(error_of(path)) == f"{path}:22:20: not valid YAML: mapping values are not allowed here"


def test_duplicate_key(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL_PLAN + "name: again\n")
    assert str(error_of(path)) == f"{path}:28:1: duplicate key 'name'"


def test_binary_garbage(tmp_path: Path) -> None:
    path = write(tmp_path, b"name: shop\n\xff\xfe\x00garbage")
    assert str(error_of(path)) == f"{path}:2:1: not valid YAML: not UTF-8 text"
    path = write(tmp_path, b"name: shop\n\x00\x01")
    assert str(error_of(path)).startswith(f"{path}:2:1: not valid YAML: ")


def test_empty_file(tmp_path: Path) -> None:
    for text in ("", "\n\n", "# only a comment\n"):
        path = write(tmp_path, text)
        assert str(error_of(path)).startswith(f"{path}:1:1: the plan is empty")


@pytest.mark.parametrize(("text", "kind"), [("- a\n- b\n", "a list"), ("hello\n", "a single value")])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, kind: str) -> None:
    path = write(tmp_path, text)
    assert str(error_of(path)).endswith(f"must be a mapping of keys (name, source, target, ...), not {kind}")


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.yaml"
    assert str(error_of(path)) == f"{path}: cannot read: No such file or directory"


def test_directory(tmp_path: Path) -> None:
    assert str(error_of(tmp_path)) == f"{tmp_path}: cannot read: is a directory"


def test_path_through_a_file(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL_PLAN) / "plan.yaml"
    assert str(error_of(path)) == f"{path}: cannot read: Not a directory"


def test_fifo_does_not_block(tmp_path: Path) -> None:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    assert str(error_of(path)) == f"{path}: cannot read: not a regular file"


def test_unreadable_file(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL_PLAN)
    path.chmod(0)
    try:
        if os.access(path, os.R_OK):  # root reads anything: the permission cannot fail here
            assert load_plan(path).plan.name == "shop"
        else:
            assert str(error_of(path)) == f"{path}: cannot read: Permission denied"
    finally:
        path.chmod(0o600)


def test_huge_file(tmp_path: Path) -> None:
    path = write(tmp_path, "# padding\n" * (MAX_PLAN_BYTES // 10 + 1))
    assert str(error_of(path)).startswith(f"{path}: cannot read: larger than")


def test_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 9)]
    path = write(tmp_path, "\n".join(lines) + "\n")
    assert "values once aliases are expanded: not a plan" in str(error_of(path))


def test_deep_nesting(tmp_path: Path) -> None:
    path = write(tmp_path, "name: " + "[" * 600 + "]" * 600 + "\n")
    assert str(error_of(path)).startswith(f"{path}")


def test_random_bytes_and_mangled_plans_give_one_clean_line(tmp_path: Path) -> None:
    base = SMALL_PLAN.encode()
    path = tmp_path / "fuzz.yaml"
    for seed in range(400):
        rnd = random.Random(seed)
        if seed % 2:
            data = rnd.randbytes(rnd.randint(1, 300))
        else:
            mangled = bytearray(base)
            for _ in range(rnd.randint(1, 6)):
                at = rnd.randrange(len(mangled))
                choice = rnd.random()
                if choice < 0.4:
                    mangled[at] = rnd.choice(b" :-[]{}&*!|>'\"\n\t#%@`,?")
                elif choice < 0.7:
                    del mangled[at : at + rnd.randint(1, 30)]
                else:
                    mangled[at:at] = rnd.randbytes(rnd.randint(1, 4))
            data = bytes(mangled)
        path.write_bytes(data)
        try:
            load_plan(path)
        except PlanError as error:
            assert str(error).startswith(f"{path}"), (seed, str(error))
            assert "\n" not in str(error), seed


# --- JSON Schema and the command line -------------------------------------------------------------------------------


def test_json_schema_for_editors() -> None:
    schema = plan_json_schema()
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["title"]
    assert {"name", "source", "target", "database", "dns"} <= set(schema["required"])
    assert schema["additionalProperties"] is False
    assert "datadir" in schema["$defs"]["DatabaseEndpoint"]["properties"]
    # The limits reach editors too.
    definitions = schema["$defs"]
    assert schema["properties"]["name"]["maxLength"] == 56
    assert definitions["Cutover"]["properties"]["lock_attempts"]["maximum"] == 20
    assert definitions["Cutover"]["properties"]["max_write_block"] == {
        **definitions["Cutover"]["properties"]["max_write_block"],
        "exclusiveMinimum": 0,
        "maximum": 3600,
    }
    assert definitions["HttpCheck"]["properties"]["expect_status"]["minimum"] == 100
    assert definitions["Dns"]["properties"]["records"]["maxItems"] == 100
    assert definitions["FileTree"]["properties"]["allow_protected_path"]["default"] is False


def run_migrate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(MIGRATE), *args], capture_output=True, text=True, timeout=60, check=False)


def test_cli_validate_reports_the_line_and_exits_2(tmp_path: Path) -> None:
    path = broken(tmp_path, "    datadir: /var/lib/mysql\n", "    datdir: /var/lib/mysql\n")
    result = run_migrate("validate", str(path))
    assert result.returncode == 2, result
    assert f"{path}:13:5: database.source.datdir: unknown key 'datdir' (did you mean 'datadir'?)" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_cli_validate_garbage_exits_2_without_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, os.urandom(64) + b"\xff")
    result = run_migrate("validate", str(path))
    assert result.returncode == 2, result
    assert str(path) in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_cli_validate_secret_is_not_echoed(tmp_path: Path) -> None:
    path = broken(tmp_path, "api_token: {env: CLOUDFLARE_API_TOKEN}", f"api_token: {SECRET}")
    result = run_migrate("validate", str(path))
    assert result.returncode == 2, result
    assert SECRET not in result.stderr + result.stdout


def test_cli_validate_accepts_the_example() -> None:
    result = run_migrate("validate", str(EXAMPLE))
    assert result.returncode == 0, result.stderr


def test_empty_secret_asks_for_a_reference(tmp_path: Path) -> None:
    path = broken(tmp_path, "api_token: {env: CLOUDFLARE_API_TOKEN}", "api_token:")
    expected = f"{path}:21:3: dns.api_token: a reference is needed here: {{env: VARIABLE}} or {{file: /path/to/file}}"
    assert str(error_of(path)) == expected


# --- the reverse run's plan (`migrate apply --reverse`) ---------------------------------------------------------------

REVERSIBLE_PLAN = (
    SMALL_PLAN.removesuffix(SMALL_FENCE)
    + """\
services:
  source:
    - {name: web, start: systemctl start nginx, stop: systemctl stop nginx}
  target:
    - {name: web, start: systemctl start nginx, stop: systemctl stop nginx}
    - {name: php, start: systemctl start php-fpm, stop: systemctl stop php-fpm}
  fence:
    enable: touch /srv/maintenance
    disable: rm -f /srv/maintenance
  target_fence:
    enable: touch /srv/maintenance-target
    disable: rm -f /srv/maintenance-target
health:
  checks:
    - {kind: http, url: "http://203.0.113.20:8080/healthz", host_header: example.com}
    - {kind: tcp, host: 203.0.113.20, port: 3306}
    - {kind: sql, query: SELECT 1, expect: "1"}
    - {kind: command, run: systemctl is-active nginx}
transfer:
  source_to_target_key: /root/.ssh/to-target
  source_to_target_options: ["-o", "BindAddress=203.0.113.10"]
"""
)


def test_reverse_section_and_target_fence_validate(tmp_path: Path) -> None:
    text = REVERSIBLE_PLAN + (
        "reverse:\n"
        "  transfer:\n"
        "    source_to_target_key: /root/.ssh/to-source\n"
        '    source_to_target_options: ["-o", "BindAddress=203.0.113.20"]\n'
        "  health:\n"
        "    checks:\n"
        '      - {kind: http, url: "http://203.0.113.10:9090/healthz"}\n'
        "    attempts: 3\n"
    )
    plan = load_plan(write(tmp_path, text)).plan
    assert plan.services.target_fence.disable == "rm -f /srv/maintenance-target"
    assert plan.reverse is not None and plan.reverse.transfer is not None and plan.reverse.health is not None
    assert plan.reverse.transfer.source_to_target_key == "/root/.ssh/to-source"
    assert plan.reverse.health.attempts == 3
    # Both are optional: a plan without them has an empty target fence and no overrides.
    small = load_plan(write(tmp_path, SMALL_PLAN, "small.yaml")).plan
    assert small.reverse is None and small.services.target_fence.disable is None


def test_unknown_key_inside_reverse_is_an_error(tmp_path: Path) -> None:
    path = write(tmp_path, SMALL_PLAN + "reverse:\n  transfr: {}\n")
    assert str(error_of(path)) == f"{path}:29:3: reverse.transfr: unknown key 'transfr' (did you mean 'transfer'?)"
    path = write(tmp_path, SMALL_PLAN + "reverse:\n  transfer:\n    bwlimt: 10M\n")
    assert str(error_of(path)).startswith(f"{path}:30:5: reverse.transfer.bwlimt: unknown key 'bwlimt'")
    path = write(tmp_path, SMALL_PLAN + "reverse:\n  health:\n    checks:\n      - {kind: ftp, url: x}\n")
    assert "reverse.health.checks[0].kind: unknown kind 'ftp'" in str(error_of(path))


def test_reversed_swaps_every_pair(tmp_path: Path) -> None:
    text = REVERSIBLE_PLAN.replace("target:\n  address: 203.0.113.20\n", "target:\n  address: 10.0.0.20\n")
    text = text.replace("source: /var/www/shop/uploads", "source: /srv/old/uploads")
    text = text.replace("    target: /var/www/shop/uploads", "    target: /srv/new/uploads")
    text = text.replace("    datadir: /var/lib/mysql\n", "    datadir: /srv/old/mysql\n", 1)
    text = text.replace("target:\n    datadir: /var/lib/mysql", "target:\n    datadir: /srv/new/mysql")
    text = text.replace("  address: 10.0.0.20\n", "  address: 10.0.0.20\n  public_address: 203.0.113.20\n")
    forward = load_plan(write(tmp_path, text)).plan
    back = forward.reversed()

    assert back.name == "shop-reverse"
    assert (back.source, back.target) == (forward.target, forward.source)
    assert [(t.source, t.target) for t in back.files] == [("/srv/new/uploads", "/srv/old/uploads")]
    assert (back.database.source.datadir, back.database.target.datadir) == ("/srv/new/mysql", "/srv/old/mysql")
    assert back.database.password == forward.database.password
    assert [s.name for s in back.services.source] == ["web", "php"]
    assert [s.name for s in back.services.target] == ["web"]
    assert back.services.fence == forward.services.target_fence
    assert back.services.target_fence == forward.services.fence
    # DNS goes back to where it pointed before the forward run: the source's public address.
    assert back.dns_content == forward.source.dns_content == "203.0.113.10"
    assert back.dns.records == forward.dns.records
    # Without overrides: the forward transfer, and the health checks aimed at the source.
    assert back.transfer == forward.transfer
    http, tcp, sql, command = back.health.checks
    assert http.url == "http://203.0.113.10:8080/healthz" and http.host_header == "example.com"
    assert (tcp.host, tcp.port) == ("203.0.113.10", 3306)
    assert sql == forward.health.checks[2]
    assert command.on == "source" and command.run == "systemctl is-active nginx"
    assert back.reverse is None


def test_reversed_takes_the_overrides(tmp_path: Path) -> None:
    text = REVERSIBLE_PLAN + (
        "reverse:\n"
        "  transfer:\n"
        "    source_to_target_key: /root/.ssh/to-source\n"
        "  health:\n"
        "    checks:\n"
        '      - {kind: http, url: "http://203.0.113.10:9090/ready"}\n'
    )
    forward = load_plan(write(tmp_path, text)).plan
    back = forward.reversed()
    assert back.transfer.source_to_target_key == "/root/.ssh/to-source"
    assert [check.url for check in back.health.checks] == ["http://203.0.113.10:9090/ready"]
    assert back.reverse is None


def test_reversed_source_keeps_the_address_dns_pointed_at(tmp_path: Path) -> None:
    # The forward flip wrote dns.content: the reverse run must find the records there before it flips them back.
    text = REVERSIBLE_PLAN.replace("  records: [example.com]\n", "  records: [example.com]\n  content: 198.51.100.7\n")
    forward = load_plan(write(tmp_path, text)).plan
    back = forward.reversed()
    assert back.source.dns_content == "198.51.100.7"
    assert back.dns_content == "203.0.113.10"


def test_double_reversal_gives_back_the_forward_plan(tmp_path: Path) -> None:
    # A reverse run always uses the shutdown mode: the forward plan says it too (the default, auto, would not).
    shutdown = REVERSIBLE_PLAN.replace("  max_write_block: 60\n", "  max_write_block: 60\n  mode: shutdown\n", 1)
    forward = load_plan(write(tmp_path, shutdown)).plan
    again = forward.reversed().reversed()
    for section in ("source", "target", "files", "database", "services", "health", "transfer", "cutover", "finish"):
        assert getattr(again, section) == getattr(forward, section), section
    assert again.dns_content == forward.dns_content
    assert again.dns.records == forward.dns.records


# --- numbers and strings ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "message"),
    [
        (".inf", "must be a finite number, got inf"),
        (".nan", "must be a finite number, got nan"),
        ("true", "expected a number, got true"),
        ("'1e3'", "expected a number, got '1e3'"),
        ("3601", "must be at most 3600, got 3601"),
        ("0", "must be greater than 0, got 0"),
    ],
)
def test_max_write_block_is_a_finite_number_in_range(tmp_path: Path, written: str, message: str) -> None:
    path = broken(tmp_path, "max_write_block: 60", f"max_write_block: {written}")
    assert str(error_of(path)) == f"{path}:25:3: cutover.max_write_block: {message}"


def test_lock_attempts_and_drain_seconds_are_bounded(tmp_path: Path) -> None:
    path = broken(tmp_path, "max_write_block: 60", "max_write_block: 60\n  lock_attempts: 1100")
    assert str(error_of(path)).endswith("cutover.lock_attempts: must be at most 20, got 1100")
    path = write(tmp_path, SMALL_PLAN + "finish:\n  drain_seconds: .inf\n")
    assert str(error_of(path)).endswith("finish.drain_seconds: must be a finite number, got inf")


def test_the_plan_name_leaves_room_for_the_reverse_run(tmp_path: Path) -> None:
    path = broken(tmp_path, "name: shop", "name: " + "x" * 57)
    assert str(error_of(path)) == (
        f"{path}:1:1: name: at most 56 characters (the reverse run's directory adds '-reverse')"
    )
    path = broken(tmp_path, "name: shop", "name: " + "x" * 10_000)
    assert str(error_of(path)).startswith(f"{path}:1:1: name: ")


def test_the_longest_name_still_reverses(tmp_path: Path) -> None:
    longest = load_plan(write(tmp_path, REVERSIBLE_PLAN.replace("name: shop", "name: " + "x" * 56, 1))).plan
    assert longest.reversed().name == "x" * 56 + "-reverse"
    assert longest.reversed().reversed().name == "x" * 56 + "-reverse-reverse"


def test_expect_status_is_a_real_http_status(tmp_path: Path) -> None:
    checks = "health:\n  checks:\n    - {kind: http, url: 'http://203.0.113.20/', expect_status: 1000}\n"
    assert "expect_status: must be at most 599" in str(error_of(write(tmp_path, SMALL_PLAN + checks)))
    checks = "health:\n  checks:\n    - {kind: http, url: 'ftp://203.0.113.20/'}\n"
    assert "url: must be an http:// or https:// URL" in str(error_of(write(tmp_path, SMALL_PLAN + checks)))


def test_a_record_listed_twice_is_refused(tmp_path: Path) -> None:
    path = broken(tmp_path, "records: [example.com]", "records: [example.com, www.example.com, Example.com.]")
    assert str(error_of(path)) == f"{path}:23:43: dns.records[2]: 'Example.com.' is listed twice"


def test_exclude_patterns_rsync_would_read_as_rules_are_refused(tmp_path: Path) -> None:
    for pattern in ("'+ keep'", "'- drop'", "'!'"):
        path = broken(
            tmp_path,
            "    target: /var/www/shop/uploads\n",
            f"    target: /var/www/shop/uploads\n    exclude: [{pattern}]\n",
        )
        assert "files[0].exclude[0]: must not start with '+ ' or '- ' or be '!'" in str(error_of(path)), pattern


def test_control_characters_in_a_secret_file_are_refused_without_echo(tmp_path: Path) -> None:
    path = broken(tmp_path, "api_token: {env: CLOUDFLARE_API_TOKEN}", 'api_token: {file: "/run/tok\\nen"}')
    assert str(error_of(path)).endswith(
        "dns.api_token.file: must not contain control characters: U+000A at character 9"
    )


# --- the latency threshold (transfer.max_latency_ms) ------------------------------------------------------------


def test_max_latency_needs_a_url_to_measure(tmp_path: Path) -> None:
    no_probe = SMALL_PLAN + "transfer:\n  max_latency_ms: 250\n"
    error = error_of(write(tmp_path, no_probe))
    assert error.lines[0].startswith(f"{tmp_path / 'plan.yaml'}:")
    assert "transfer.max_latency_ms: needs a URL to measure" in error.lines[0]
    given = no_probe + "  latency_url: http://203.0.113.10/healthz\n"
    assert load_plan(write(tmp_path, given)).plan.latency_probe() == ("http://203.0.113.10/healthz", None)


def test_max_latency_defaults_to_the_first_http_check_aimed_at_the_source(tmp_path: Path) -> None:
    checks = (
        "health:\n  checks:\n    - {kind: tcp, host: 203.0.113.20, port: 443}\n"
        "    - {kind: http, url: 'http://203.0.113.20:8080/healthz', host_header: shop.example.com}\n"
    )
    plan = load_plan(write(tmp_path, SMALL_PLAN + checks + "transfer:\n  max_latency_ms: 250\n")).plan
    assert plan.latency_probe() == ("http://203.0.113.10:8080/healthz", "shop.example.com")


@pytest.mark.parametrize("value", ["0", "-5", "60001", "'250'", ".inf"])
def test_max_latency_is_a_number_of_milliseconds_in_range(tmp_path: Path, value: str) -> None:
    plan = SMALL_PLAN + f"transfer:\n  max_latency_ms: {value}\n  latency_url: http://203.0.113.10/healthz\n"
    error = error_of(write(tmp_path, plan))
    assert "transfer.max_latency_ms" in error.lines[0]


@pytest.mark.parametrize(
    ("new", "field", "said"),
    [
        ("  records: [example.com]\n  type: AAAA\n", "dns.type", "an AAAA record holds an IPv6 address"),
        ("  records: [example.com]\n  content: 2001:db8::7\n", "dns.content", "an A record holds an IPv4 address"),
        ("  records: [example.com]\n  type: CNAME\n", "dns.type", "a CNAME record holds a host name"),
    ],
)
def test_the_records_type_must_fit_what_they_would_hold(tmp_path: Path, new: str, field: str, said: str) -> None:
    """Refused by the API at the flip, inside the window otherwise: refused here, naming the field to fix."""
    error = error_of(broken(tmp_path, "  records: [example.com]\n", new))
    assert f": {field}: {said}" in str(error), str(error)
