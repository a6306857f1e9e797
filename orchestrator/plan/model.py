"""The declarative plan a user writes, as pydantic models.

Every model forbids unknown keys (a typo must never be silently ignored) and carries defaults for everything a
newcomer should not have to think about. Secrets are never values in the plan: they are `SecretRef`s that name an
environment variable or a file, resolved only when a step needs them.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from orchestrator.database.names import EngineName, replicate_refusal
from orchestrator.plan.checks import (
    MAX_SOCKET_BYTES,
    Location,
    control_character,
    directory_problem,
    dns_content_form,
    inside,
    path_problem,
    text_problem,
)

# Validation context keys: the loader runs the cross-field checks itself, to blame the exact field of the plan;
# a plan derived by `Plan.reversed()` may carry a name longer than a user may write (it ends in '-reverse').
DEFER_CROSS_CHECKS = "defer_cross_checks"
DERIVED_PLAN = "derived_plan"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# Limits (docs/plan.md, "Limits"): far beyond any real plan, small enough that nothing downstream can overflow.
MAX_NAME_CHARS = 56  # plan name: '<name>-reverse' still fits a 64-character directory name
MAX_LABEL_CHARS = 100  # names of trees, services, checks
MAX_COMMAND_CHARS = 10_000  # shell commands, SQL, expected bodies
MAX_DNS_NAME_CHARS = 253
MAX_URL_CHARS = 2048
MAX_RECORDS = 100
MAX_SCHEMAS = 1000
MAX_EXCLUDES = 1000
MAX_CHECKS = 100
MAX_SERVICES = 50
MAX_TREES = 100
MAX_SSH_OPTIONS = 50


class Strict(BaseModel):
    # hide_input_in_errors: a ValidationError printed as is must never show a value (it may be a secret).
    # strict: a number is a number (no `true`, no '1e3'); allow_inf_nan: every number is finite.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True, strict=True, allow_inf_nan=False)


def _fail(kind: str, problem: str | None) -> None:
    if problem is not None:
        raise PydanticCustomError(kind, problem)


def _plain_text(value: str) -> str:
    _fail("control_character", text_problem(value))
    return value


def _multiline_text(value: str) -> str:
    _fail("control_character", text_problem(value, allow_newlines=True))
    return value


def _any_path(value: str) -> str:
    _fail("unsafe_path", path_problem(value, absolute=False))
    return value


def _ssh_file(value: str) -> str:
    _any_path(value)
    if "${" in value:
        # OpenSSH expands ${VARIABLE} in IdentityFile and UserKnownHostsFile: the file read would not be this one.
        raise PydanticCustomError("unsafe_path", "must not contain '${' (ssh would expand it as a variable)")
    return value


def _socket_path(value: str) -> str:
    _fail("unsafe_path", path_problem(value, max_bytes=MAX_SOCKET_BYTES))
    return value


_HOST_NAME = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?$")


# Directories anyone may write in: a run's own files never go there (a name there can be taken first, or replaced).
SHARED_DIRECTORIES = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock")
# Where a run keeps what it leaves on a host when the plan does not say (commands run as root / as the account).
ROOT_RUN_DIR = "/var/lib/migrate"
_PLAIN_PATH = re.compile(r"/[A-Za-z0-9_./-]*")


def _run_dir(value: str) -> str:
    _fail("unsafe_path", path_problem(value, max_bytes=MAX_SOCKET_BYTES - 48))
    if not value.startswith("/"):
        raise PydanticCustomError("unsafe_path", "must be an absolute path")
    if not _PLAIN_PATH.fullmatch(value) or ".." in value.split("/"):
        # It becomes part of ssh options (a control socket's path) and shell words: plain names only.
        raise PydanticCustomError("unsafe_path", "letters, digits and . _ - / only, no '..'")
    if any(value.rstrip("/") == shared or value.startswith(shared + "/") for shared in SHARED_DIRECTORIES):
        raise PydanticCustomError("unsafe_path", "must not be in a directory other accounts can write (e.g. /tmp)")
    return value.rstrip("/") or "/"


def _host_address(value: str) -> str:
    if len(value) > MAX_DNS_NAME_CHARS:
        raise PydanticCustomError("bad_host", f"too long: at most {MAX_DNS_NAME_CHARS} characters")
    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    if not _HOST_NAME.match(value):
        raise PydanticCustomError("bad_host", "must be a host name or an IP address (letters, digits, '.', '-')")
    return value


def _host_header(value: str) -> str:
    """A Host header: a name or address, optionally with ':port' ('[v6]:port' for an IPv6 address)."""
    host, port = value, ""
    if value.startswith("["):
        host, _, rest = value[1:].partition("]")
        if rest:
            port = rest.removeprefix(":") if rest.startswith(":") else "?"
    elif value.count(":") == 1:
        host, port = value.split(":")
    if port and not (port.isdigit() and 1 <= int(port) <= 65535):
        raise PydanticCustomError("bad_host", "must be a host name, optionally with ':port' (1-65535)")
    _host_address(host)
    return value


_DNS_NAME = re.compile(r"^(\*\.)?([A-Za-z0-9_]([A-Za-z0-9_-]{0,62})\.)*[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})\.?$")


def _dns_name(value: str) -> str:
    if len(value) > MAX_DNS_NAME_CHARS:
        raise PydanticCustomError("bad_dns_name", f"too long: at most {MAX_DNS_NAME_CHARS} characters")
    if not _DNS_NAME.match(value):
        raise PydanticCustomError("bad_dns_name", "must be a DNS name, e.g. www.example.com")
    return value


def _http_url(value: str) -> str:
    if len(value) > MAX_URL_CHARS:
        raise PydanticCustomError("bad_url", f"too long: at most {MAX_URL_CHARS} characters")
    found = control_character(value)
    if found is not None or " " in value:
        raise PydanticCustomError("bad_url", f"must be a URL without spaces or control characters ({found or 'space'})")
    try:
        parts = urlsplit(value)
        port = parts.port
    except ValueError as exc:
        raise PydanticCustomError("bad_url", f"not a valid URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise PydanticCustomError("bad_url", "must be an http:// or https:// URL")
    if not parts.hostname:
        raise PydanticCustomError("bad_url", "must name a host, e.g. http://203.0.113.20/healthz")
    if port == 0:
        raise PydanticCustomError("bad_url", "port must be 1-65535")
    return value


_BWLIMIT = re.compile(r"^[0-9]{1,12}(\.[0-9]{1,6})?([KkMmGgTtPp]([Ii]?[Bb])?|[Bb])?$")


def _bwlimit(value: str) -> str:
    if not _BWLIMIT.match(value):
        raise PydanticCustomError("bad_bwlimit", "must be a rate rsync understands, e.g. '50M' or '1500K' (per second)")
    return value


_USER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}$")


def _user_name(value: str) -> str:
    if not _USER.match(value):
        raise PydanticCustomError("bad_user", "must be a user name: letters, digits, '_', '.', '-', at most 32")
    return value


_OWNER = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,31}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,31})?$")


def _owner(value: str) -> str:
    if not _OWNER.match(value):
        raise PydanticCustomError("bad_owner", "must be USER or USER:GROUP (names or numeric ids)")
    return value


def _exclude(value: str) -> str:
    _fail("unsafe_pattern", text_problem(value))
    # rsync reads a leading '+ ' or '- ' as an include/exclude modifier and a lone '!' as "clear the list":
    # either would change which target files --delete removes.
    if value.startswith(("+ ", "- ")) or value.strip() == "!":
        raise PydanticCustomError(
            "unsafe_pattern", "must not start with '+ ' or '- ' or be '!' (rsync reads those as filter rules)"
        )
    return value


Label = Annotated[str, Field(min_length=1, max_length=MAX_LABEL_CHARS), AfterValidator(_plain_text)]
Command = Annotated[str, Field(min_length=1, max_length=MAX_COMMAND_CHARS), AfterValidator(_multiline_text)]
LongText = Annotated[str, Field(max_length=MAX_COMMAND_CHARS), AfterValidator(_multiline_text)]
FilePath = Annotated[str, AfterValidator(_any_path)]
SshFilePath = Annotated[str, AfterValidator(_ssh_file)]
SocketPath = Annotated[str, AfterValidator(_socket_path)]
HostAddress = Annotated[str, AfterValidator(_host_address)]
DnsName = Annotated[str, AfterValidator(_dns_name)]
HttpUrl = Annotated[str, AfterValidator(_http_url)]
UserName = Annotated[str, AfterValidator(_user_name)]
SshOption = Annotated[str, Field(min_length=1, max_length=1000), AfterValidator(_plain_text)]
ExcludePattern = Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(_exclude)]
SchemaName = Annotated[str, Field(min_length=1, max_length=64), AfterValidator(_plain_text)]


def _seconds(low: float, high: float, *, zero: bool = False, description: str, default: float) -> Any:
    """A duration in seconds: finite, above `low` (or equal to it with `zero`), at most `high`."""
    if zero:
        return Field(default=default, ge=low, le=high, description=f"{description} (seconds)")
    return Field(default=default, gt=low, le=high, description=f"{description} (seconds)")


def _checked_directory(value: str, info: ValidationInfo, *, datadir: bool) -> str:
    allowed = bool(info.data.get("allow_protected_path", False))
    _fail("unsafe_directory", directory_problem(value, datadir=datadir, allow_protected=allowed))
    return value


_ALLOW_PROTECTED = Field(
    default=False,
    description="allow a protected system directory here (docs/plan.md: protected directories); never '/', the top "
    "of a system tree, /proc, /sys or /dev",
)


class SecretRef(Strict):
    """Where a secret lives: exactly one of an environment variable or a file (first line, stripped)."""

    env: str | None = Field(
        default=None, max_length=255, description="name of the environment variable holding the secret"
    )
    file: FilePath | None = Field(default=None, description="path of a file holding the secret (first line)")

    @model_validator(mode="before")
    @classmethod
    def _a_reference_not_a_value(cls, data: Any) -> Any:
        # A plain string here is almost certainly the secret itself: refuse it without ever repeating it.
        if data is None:
            raise PydanticCustomError(
                "secret_missing", "a reference is needed here: {env: VARIABLE} or {file: /path/to/file}"
            )
        if not isinstance(data, dict | BaseModel):
            raise PydanticCustomError(
                "secret_not_reference",
                "a secret must be a reference, {env: VARIABLE} or {file: /path/to/file}, not a value in the plan",
            )
        return data

    @field_validator("env")
    @classmethod
    def _env_is_a_name(cls, value: str | None) -> str | None:
        if value is not None and not _ENV_NAME.match(value):
            raise PydanticCustomError(
                "secret_env_name", "must be the NAME of an environment variable (letters, digits, '_')"
            )
        return value

    @model_validator(mode="after")
    def _exactly_one(self) -> SecretRef:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of 'env' or 'file'")
        return self


class JumpHost(Strict):
    """A bastion the orchestrator's SSH connections to a host go through (ssh -J): its host key is verified
    against its own known_hosts, and the host's key against the host's, at every hop."""

    address: HostAddress = Field(description="the bastion's address, as the orchestrator reaches it")
    ssh_port: int = Field(default=22, ge=1, le=65535)
    user: UserName = "root"
    key: FilePath | None = Field(default=None, description="private key file for the bastion; omit for the agent")
    agent: bool = Field(default=False, description="use the SSH agent (SSH_AUTH_SOCK) for the bastion")
    known_hosts: FilePath = Field(
        default="~/.ssh/known_hosts", description="known_hosts file that verifies the bastion's host key"
    )
    connect_timeout: float = _seconds(0, 300, default=10.0, description="SSH connection timeout to the bastion")


class Host(Strict):
    """A server reached over SSH."""

    address: HostAddress = Field(description="address the orchestrator connects to over SSH")
    ssh_port: int = Field(default=22, ge=1, le=65535)
    user: UserName = "root"
    key: FilePath | None = Field(default=None, description="private key file; omit to use the SSH agent")
    agent: bool = Field(default=False, description="use the SSH agent (SSH_AUTH_SOCK) for authentication")
    known_hosts: FilePath = Field(
        default="~/.ssh/known_hosts", description="known_hosts file used to verify the host key (always verified)"
    )
    public_address: HostAddress | None = Field(
        default=None,
        description="address the DNS records point at for this host (defaults to 'address')",
    )
    connect_timeout: float = _seconds(0, 300, default=10.0, description="SSH connection timeout")
    become: Literal["sudo"] | None = Field(
        default=None,
        description="how a non-root `user` gains root for the migration's commands: 'sudo' (passwordless, sudo -n); "
        "also on the source → target hop (rsync's remote end, the seed's receiver)",
    )
    jump: JumpHost | None = Field(
        default=None,
        description="a bastion the orchestrator's connections to this host go through (the source → target hop "
        "of rsync and replication stays direct)",
    )
    run_dir: Annotated[str, AfterValidator(_run_dir)] | None = Field(
        default=None,
        description="a private directory of the account the migration's commands run as on this host: what a run "
        "leaves there (the guard, the commit's record, control sockets, pid and lock files) lives in it, created "
        "mode 0700 and checked to be that account's own before anything else. Never in /tmp or another directory "
        f"other accounts can write. Default: {ROOT_RUN_DIR} when the commands run as root, else ~USER/.migrate "
        "(/home/USER/.migrate)",
    )

    @property
    def dns_content(self) -> str:
        """What the DNS records point at for this host, in the form the provider stores it (read back as such)."""
        return dns_content_form(self.public_address or self.address)

    @property
    def private_dir(self) -> str:
        """The run's private directory on this host (see `run_dir`)."""
        if self.run_dir is not None:
            return self.run_dir
        if self.user == "root" or self.become == "sudo":
            return ROOT_RUN_DIR
        return f"/home/{self.user}/.migrate"


class FileTree(Strict):
    """A directory tree moved with rsync, source → target."""

    allow_protected_path: bool = _ALLOW_PROTECTED
    name: Label = Field(description="short name used in logs and reports, e.g. 'uploads'")
    source: str = Field(description="absolute directory on the source")
    target: str = Field(description="absolute directory on the target")
    exclude: list[ExcludePattern] = Field(
        default_factory=list, max_length=MAX_EXCLUDES, description="rsync exclude patterns"
    )
    owner: Annotated[str, AfterValidator(_owner)] | None = Field(
        default=None, description="chown on the target, e.g. 'www-data:www-data'"
    )

    @field_validator("source", "target")
    @classmethod
    def _safe_directory(cls, value: str, info: ValidationInfo) -> str:
        return _checked_directory(value, info, datadir=False)


class DatabaseEndpoint(Strict):
    """How one host's database is reached and driven."""

    allow_protected_path: bool = _ALLOW_PROTECTED
    socket: SocketPath | None = Field(default=None, description="unix socket on the host (reached through SSH)")
    host: HostAddress = Field(default="127.0.0.1", description="TCP address as seen from the host (through SSH)")
    port: int = Field(default=3306, ge=1, le=65535)
    datadir: str = Field(description="absolute data directory on the host")
    start: Command = Field(description="shell command on the host that starts the database and returns")
    stop: Command = Field(description="shell command on the host that stops the database cleanly and returns")

    @field_validator("datadir")
    @classmethod
    def _safe_datadir(cls, value: str, info: ValidationInfo) -> str:
        return _checked_directory(value, info, datadir=True)


class VerifyData(Strict):
    row_counts: bool = Field(
        default=True,
        description="the audit after the commit: every table's row count, source vs target (replicate mode: "
        "checksums of every table in replication.chunk_rows chunks, with either setting on)",
    )
    checksum: bool = Field(
        default=False,
        description="also compare CHECKSUM TABLE (reads whole tables; shutdown mode: the audit after the commit)",
    )
    files: bool = Field(default=True, description="rsync --dry-run --checksum of every tree must change nothing")


class PresyncRounds(Strict):
    max_rounds: int = Field(default=5, ge=1, le=50, description="most rsync rounds of the live datadir")
    converged_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=0,
        le=2**40,
        description="stop the rounds once a round moved at most this many bytes (the final pass will be short)",
    )


class Database(Strict):
    engine: EngineName = Field(default="mariadb", description="the database engine (orchestrator/database/engines.py)")
    user: Annotated[str, Field(min_length=1, max_length=80), AfterValidator(_plain_text)] = "root"
    password: SecretRef | None = Field(default=None, description="reference to the password; none for socket auth")
    source: DatabaseEndpoint
    target: DatabaseEndpoint
    schemas: list[SchemaName] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_SCHEMAS,
        description="schemas to verify; default: every schema except the system ones",
    )
    presync: PresyncRounds = Field(default_factory=PresyncRounds)
    verify: VerifyData = Field(default_factory=VerifyData)
    connect_timeout: float = _seconds(0, 300, default=10.0, description="SQL connection timeout")
    read_timeout: float = _seconds(0, 3600, default=60.0, description="longest wait for one SQL answer")


class Service(Strict):
    name: Label
    start: Command = Field(description="shell command that starts it and returns once it is up")
    stop: Command = Field(description="shell command that stops it")


class SourceFence(Strict):
    """How the live service on the source stops taking writes at cut-over, and takes them again on rollback."""

    enable: Command | None = Field(
        default=None, description="command on the source that makes the service refuse writes (maintenance mode)"
    )
    disable: Command | None = Field(default=None, description="command on the source that lifts the fence")


class Services(Strict):
    target: list[Service] = Field(
        default_factory=list, max_length=MAX_SERVICES, description="started on the target after its database"
    )
    source: list[Service] = Field(
        default_factory=list,
        max_length=MAX_SERVICES,
        description="the service on the source (stopped when finish.source is 'stop')",
    )
    fence: SourceFence = Field(
        default_factory=SourceFence,
        description="how the source refuses writes from the cut-over on ('enable') and takes them again on rollback "
        "('disable'); required when the plan moves files",
    )
    target_fence: SourceFence = Field(
        default_factory=SourceFence,
        description="how the TARGET refuses writes and takes them again: 'enable' runs before its services start "
        "(it serves reads, refuses writes), 'disable' once every DNS record points at it (the commit point); "
        "required by `migrate apply --reverse`",
    )
    stop_target_first: bool = Field(
        default=True, description="preflight stops the target's database and services (the seed's preparation)"
    )


CheckWhen = Literal["both", "before", "window"]


def _when() -> Any:
    return Field(
        default="both",
        description="where the check runs in the replicate mode, whose target serves (fenced) before the window: "
        "'both' (default: before the window and again inside it, right before DNS moves), 'before' (only before: for a "
        "costly check, e.g. one that reads a whole table), 'window' (only inside). The shutdown mode starts the target "
        "inside the window: every check runs there",
    )


class HttpCheck(Strict):
    kind: Literal["http"] = "http"
    name: Label | None = None
    when: CheckWhen = _when()
    url: HttpUrl = Field(description="http:// or https:// URL on the target, e.g. http://203.0.113.20/healthz")
    host_header: Annotated[str, AfterValidator(_host_header)] | None = Field(
        default=None, description="Host header, e.g. the service's public name"
    )
    expect_status: int = Field(default=200, ge=100, le=599, description="HTTP status the answer must have")
    expect_body: LongText | None = Field(default=None, description="substring the body must contain")
    timeout: float = _seconds(0, 300, default=5.0, description="per try")


class TcpCheck(Strict):
    kind: Literal["tcp"] = "tcp"
    name: Label | None = None
    when: CheckWhen = _when()
    host: HostAddress
    port: int = Field(ge=1, le=65535)
    timeout: float = _seconds(0, 300, default=5.0, description="per try")


class SqlCheck(Strict):
    kind: Literal["sql"] = "sql"
    name: Label | None = None
    when: CheckWhen = _when()
    query: Command
    expect: LongText | None = Field(default=None, description="expected first column of the first row, as text")


class CommandCheck(Strict):
    kind: Literal["command"] = "command"
    name: Label | None = None
    when: CheckWhen = _when()
    run: Command = Field(description="shell command; exit 0 means healthy")
    on: Literal["target", "source"] = "target"
    timeout: float = _seconds(0, 3600, default=30.0, description="per try")


HealthCheck = Annotated[HttpCheck | TcpCheck | SqlCheck | CommandCheck, Field(discriminator="kind")]


class HealthChecks(Strict):
    checks: list[HealthCheck] = Field(default_factory=list, max_length=MAX_CHECKS)
    attempts: int = Field(default=10, ge=1, le=1000, description="tries per check before it fails")
    interval: float = _seconds(0, 600, zero=True, default=1.0, description="between tries")


class Dns(Strict):
    provider: Literal["cloudflare"] = "cloudflare"
    api_token: SecretRef
    zone: DnsName = Field(description="zone name, e.g. example.com")
    records: list[DnsName] = Field(
        min_length=1, max_length=MAX_RECORDS, description="record names to point at the target"
    )
    type: Literal["A", "AAAA", "CNAME"] = "A"
    content: HostAddress | None = Field(default=None, description="new content; default: the target's public address")
    base_url: HttpUrl | None = Field(default=None, description="API base URL (default: Cloudflare's)")
    timeout: float = _seconds(0, 300, default=30.0, description="per API call")
    converge_timeout: float = _seconds(
        0,
        86400,
        default=600.0,
        description="with a front door on the source (the commit is made there): how long the DNS flip after the "
        "window keeps trying, with backoff, until every record points at the target; past it the run stays "
        "committed with DNS pending (exit 4) and `migrate apply` finishes it",
    )
    lower_ttl_to: int | None = Field(
        default=None,
        ge=30,
        le=86400,
        description="lower the records' TTL to this many seconds before the downtime and wait out the old TTL "
        "(step lower_ttl; the original TTL is put back after the commit and on rollback); unset: TTLs stay as they are",
    )
    lower_ttl_wait: float | None = Field(
        default=None,
        ge=0,
        le=86400,
        description="seconds to wait after lowering instead of the longest original TTL (seconds; 0 when the TTL was "
        "lowered by hand long before)",
    )


class Cutover(Strict):
    lock_wait_timeout: float = _seconds(
        0, 600, default=3.0, description="wait for FLUSH TABLES WITH READ LOCK per try before giving up"
    )
    lock_attempts: int = Field(default=5, ge=1, le=20, description="tries to get the lock, with backoff between them")
    lock_retry_backoff: float = _seconds(
        0, 60, zero=True, default=2.0, description="wait before the first retry (doubles)"
    )
    max_write_block: float = _seconds(
        0, 3600, default=120.0, description="longest writes may stay blocked before the target takes them"
    )
    mode: Literal["shutdown", "replicate", "auto"] = Field(
        default="auto",
        description="how the database moves: 'shutdown' stops the source database cleanly and copies its delta; "
        "'replicate' seeds the target with mariadb-backup, keeps it a GTID replica and switches in well under a "
        "second (needs the 'replication' section); 'auto' (the default) picks 'replicate' when the plan has a "
        "'replication' section and the servers allow it, else 'shutdown' (decided when the run starts, journaled, "
        "said by preflight)",
    )
    refuse_predicted_overrun: bool = Field(
        default=True,
        description="the shutdown mode predicts its window before blocking writes (the last datadir pre-sync round, "
        "the shutdown, the target's start) and does not begin it when the prediction exceeds max_write_block less "
        "the rollback's reserve: it says so and what would help; false: it begins anyway (the budget still rolls "
        "it back)",
    )
    postpone_flag: FilePath | None = Field(
        default=None,
        description="a file on the machine running migrate (relative to the plan): while it exists, the run waits "
        "before the downtime begins (pre-syncs done); delete it to go on",
    )


def static_mode(plan: Plan) -> str:
    """The cut-over mode known without asking the servers: the declared one, except that 'auto' without a
    `replication` section can only be 'shutdown' (the replicate mode needs the replication account)."""
    mode = plan.cutover.mode
    if mode == "auto" and (plan.replication is None or replicate_refusal(plan.database.engine) is not None):
        return "shutdown"
    return mode


class ReplicationEndpoint(Strict):
    """Where a database listens on TCP as seen from its own host: the SSH tunnel's far end."""

    host: HostAddress = Field(default="127.0.0.1", description="TCP address of the database, from its own host")
    port: int = Field(default=3306, ge=1, le=65535)


class Replication(Strict):
    """The replicate cut-over (`cutover.mode: replicate` or `auto`): a seed, a GTID replica through an SSH tunnel,
    a comparison before the window, and a switch inside it."""

    user: UserName = Field(description="replication account on the source (REPLICATION SLAVE; the same on the "
                           "target for the reverse path)")  # fmt: skip
    password: SecretRef = Field(description="reference to the replication account's password")
    source: ReplicationEndpoint | None = Field(
        default=None, description="the source database's TCP address on the source (default: database.source host/port)"
    )
    target: ReplicationEndpoint | None = Field(
        default=None, description="the target database's TCP address on the target (default: database.target host/port)"
    )
    max_lag: float = _seconds(
        0,
        3600,
        default=1.0,
        description="the window begins only once the replica reaches the source's position within this long",
    )
    lag_wait: float = _seconds(
        0,
        86400,
        default=600.0,
        description="longest wait for the replica's lag to fall under max_lag before the run "
        "stops (nothing changed on the source)",
    )
    seed_throttle: int | None = Field(
        default=None,
        ge=1,
        le=100000,
        description="mariadb-backup --throttle (read operations per second); none: no limit",
    )
    seed_nice: bool = Field(default=True, description="run mariadb-backup on the source with nice -n19 ionice -c3")
    datadir_owner: Annotated[str, AfterValidator(_owner)] | None = Field(
        default=None, description="chown of the seeded datadir on the target, e.g. 'mysql:mysql'"
    )
    compare: bool = Field(default=True, description="compare every table, source and replica, in chunks at one "
                          "consistent point before the window (a difference stops the run)")  # fmt: skip
    chunk_rows: int = Field(default=2000, ge=10, le=10_000_000, description="rows per compared chunk")
    compare_pause: float = Field(
        default=0.0,
        ge=0,
        le=100,
        description="after each chunk, pause this many times its duration (the live source's share)",
    )
    app_users: list[UserName] = Field(
        default_factory=list,
        max_length=100,
        description="the accounts the application writes with: preflight checks that each exists and none holds "
        "READ_ONLY ADMIN, SUPER or ALL PRIVILEGES, directly or through a role (they would write through the "
        "source's read_only)",
    )
    keep_reverse: float = _seconds(
        0,
        86400,
        zero=True,
        default=0.0,
        description="after the flip the old source replicates from the target; the run keeps that reverse path "
        "this long (`migrate rollback` goes back over it losing nothing; `migrate finish` ends it early), then "
        "replication is torn down on both sides; 0: torn down at once by finish",
    )


class Finish(Strict):
    source: Literal["fence", "stop"] = Field(
        default="fence", description="after success the source stays fenced, or its services are stopped"
    )
    drain_seconds: float = _seconds(
        0, 86400, zero=True, default=0.0, description="wait after the flip for traffic to leave the source"
    )


class Transfer(Strict):
    bwlimit: Annotated[str, AfterValidator(_bwlimit)] | None = Field(
        default=None, description="rsync --bwlimit for the live pre-syncs, e.g. '50M' (per second)"
    )
    nice: bool = Field(default=True, description="run rsync on the source with nice -n19 and ionice -c3")
    max_load: float | None = Field(
        default=None,
        ge=0,
        le=10_000,
        description="pause the live pre-syncs while the source's 1-minute load average is above this (SIGSTOP of "
        "rsync's process group on the source, SIGCONT once it is back under, or after max_pause); none = never",
    )
    max_latency_ms: float | None = Field(
        default=None,
        gt=0,
        le=60_000,
        description="pause the live pre-syncs and the seed while the live app's answer takes longer than this "
        "(milliseconds, one request to latency_url per check, made by migrate; a request that fails or times out "
        "counts as slow); none = never",
    )
    latency_url: HttpUrl | None = Field(
        default=None,
        description="the live app's URL the latency is measured on (http:// or https://, on the SOURCE); default: "
        "the first http health check's URL aimed at the source's address, with its Host header",
    )
    load_check_interval: float = _seconds(
        0, 600, default=2.0, description="how often the source's load (and the app's latency) is read"
    )
    max_pause: float = _seconds(
        0, 3600, default=30.0,
        description="longest one pause lasts before rsync runs again for a check interval (keep it well under "
        "rsync_timeout: the target's rsync gives up after that long without data)",
    )  # fmt: skip
    nocache: bool = Field(
        default=True,
        description="wrap the source's rsync in `nocache` when installed there, so reading the trees does not "
        "evict the live service's page cache",
    )
    whole_file: bool = Field(default=True, description="rsync --whole-file (faster on a fast network)")
    rsync_timeout: int = Field(default=300, ge=0, le=86400, description="rsync --timeout (seconds of no I/O; 0 = none)")
    # rsync runs ON the source and pushes to the target: the source itself must be able to ssh to the target.
    source_to_target_key: SshFilePath | None = Field(
        default=None, description="private key file ON THE SOURCE for ssh to the target; omit to forward the agent"
    )
    source_to_target_known_hosts: SshFilePath = Field(
        default="~/.ssh/known_hosts", description="known_hosts file ON THE SOURCE that verifies the target"
    )
    source_to_target_options: list[SshOption] = Field(
        default_factory=list,
        max_length=MAX_SSH_OPTIONS,
        description="extra ssh options for that hop, e.g. ['-o', 'BindAddress=10.0.0.5']",
    )


class Preflight(Strict):
    """The storage preflight: what it measures on both hosts, and what a finding does (docs/plan.md: storage
    preflight)."""

    storage: Literal["warn", "refuse"] = Field(
        default="warn",
        description="a target slower or less durable than the source: 'warn' reports it and goes on, 'refuse' stops "
        "the preflight",
    )
    max_fsync_ratio: float = Field(
        default=3.0, gt=1, le=1_000_000, description="target fsync p50 more than this many times the source's is slow"
    )
    min_fsync_ms: float = Field(
        default=1.0,
        ge=0,
        le=10_000,
        description="a target whose fsync p50 is under this is never called slow, whatever the ratio (milliseconds)",
    )
    fsync_writes: int = Field(default=200, ge=10, le=100_000, description="most 4 KiB synchronous writes per host")
    fsync_seconds: float = _seconds(0, 60, default=2.0, description="longest the fsync sample may take per host")


class Hooks(Strict):
    dir: FilePath = Field(default="hooks", description="directory of hook executables, relative to the plan")
    timeout: float = _seconds(0, 3600, default=60.0, description="longest a hook may run")
    pass_env: list[str] = Field(
        default_factory=list,
        max_length=100,
        description="variables from --env-file or secret references that hooks may still inherit (by name)",
    )


class Retry(Strict):
    attempts: int = Field(default=5, ge=1, le=100, description="tries of a transient failure")
    max_seconds: float = _seconds(0, 86400, default=120.0, description="give up retrying after this long")
    max_wait: float = _seconds(0, 3600, default=10.0, description="longest wait between tries")


_PROXY_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")


def _proxy_name(value: str) -> str:
    if not _PROXY_NAME.match(value):
        raise PydanticCustomError("bad_proxy_name", "must be an HAProxy name: 1-64 letters, digits, '_', '.', ':', '-'")
    return value


def _runtime_api_path(value: str) -> str:
    """An absolute path HAProxy's runtime API takes as one word of a command (a map file, its admin socket)."""
    _fail("unsafe_path", path_problem(value, max_bytes=MAX_SOCKET_BYTES))
    if any(ch.isspace() for ch in value) or "'" in value or '"' in value or "\\" in value:
        raise PydanticCustomError(
            "unsafe_path", "must not contain spaces, quotes or backslashes (HAProxy reads it as one word)"
        )
    return value


def _ip_address(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        raise PydanticCustomError(
            "bad_address", "must be an IP address (HAProxy's `set server addr` takes no host name)"
        ) from None
    return value


ProxyName = Annotated[str, AfterValidator(_proxy_name)]
RuntimeApiPath = Annotated[str, AfterValidator(_runtime_api_path)]


class ProxyAddress(Strict):
    """An address:port a front door sends requests to."""

    address: Annotated[str, AfterValidator(_ip_address)] = Field(description="IP address, e.g. 203.0.113.20")
    port: int = Field(ge=1, le=65535)


class FrontDoorProxy(Strict):
    """One host's front door: HAProxy in front of its app, driven through its admin socket (over SSH).

    While the window is open the source's front door holds requests (they wait, none is refused); at the commit
    point it is pointed at `forward_to` (the other host's front door) and released. The target's holds the
    requests of clients that follow the new DNS before its fence is lifted."""

    kind: Literal["haproxy"] = Field(default="haproxy", description="the only kind for now")
    admin_socket: RuntimeApiPath = Field(
        description="absolute path of HAProxy's admin socket on the host (`stats socket ... level admin`)"
    )
    frontend: ProxyName = Field(description="the frontend clients arrive at")
    backend: ProxyName = Field(description="the backend holding the server that sends requests to the app")
    server: ProxyName = Field(description="that server: repointed at forward_to at the commit point")
    hold_map: RuntimeApiPath = Field(
        description="absolute path of the map the frontdoor_hold Lua action reads (a line 'hold_until 0')"
    )
    app: ProxyAddress = Field(description="where the server points while this host serves: its own app")
    forward_to: ProxyAddress = Field(
        description="where this front door sends requests once the service lives on the other host: the other "
        "host's front door (its public address and the clients' port)"
    )
    drain_timeout: float = _seconds(
        0, 300, zero=True, default=5.0, description="longest wait for in-flight requests to finish once the hold begins"
    )
    hold: Literal["all", "writes"] = Field(
        default="all",
        description="what the source's door holds while the source database still serves reads (the replicate "
        "mode's window): 'all' every request; 'writes' every method but GET, HEAD and OPTIONS, which go on to the "
        "source (only when the app's reads never write to the database: it is read-only then). The shutdown mode "
        "holds everything (its database stops)",
    )
    commit_from: Literal["auto", "source", "orchestrator"] = Field(
        default="auto",
        description="where the commit at the door is driven from: 'source' runs it on the source host (two commands:"
        " the door's local socket through socat, the target's fence over the hosts' own SSH hop), 'orchestrator' from"
        " here (four round trips); 'auto' measures both before the window and takes the source when two round trips"
        " from here cost more than the source's own work. Without socat on the source it is always 'orchestrator'."
        " Driven from the source, the window's first command runs there too (the hold, the drain, the fence, then the"
        " uploads' final pass started and the database's stop, with 'auto' when its round trip from here costs more)",
    )
    forward_margin: float = _seconds(
        0,
        86400,
        zero=True,
        default=30.0,
        description="after the flip, forwarding is kept at least the records' TTL plus this margin",
    )
    wait_forwarding: bool = Field(
        default=False,
        description="finish waits until forwarding is no longer due (the flip + the records' TTL + forward_margin) "
        "and reports the requests that still arrived meanwhile, and after the TTL; false: finish reports at once "
        "and says until when the old address must keep forwarding",
    )


class Proxy(Strict):
    """The front doors (absent: the fence answers clients during the window, as without a proxy)."""

    source: FrontDoorProxy | None = Field(default=None, description="the source's front door")
    target: FrontDoorProxy | None = Field(default=None, description="the target's front door")

    @model_validator(mode="after")
    def _at_least_one(self) -> Proxy:
        if self.source is None and self.target is None:
            raise ValueError("give 'source', 'target' or both")
        return self


class ReverseOverrides(Strict):
    """What a reverse run (`migrate apply --reverse`: back from the target to the source after the DNS flip) cannot
    derive from the forward plan. Everything else is the forward plan with source and target swapped."""

    transfer: Transfer | None = Field(
        default=None,
        description="how the TARGET reaches the source over ssh (rsync runs on the target in a reverse run); "
        "default: the forward transfer section",
    )
    health: HealthChecks | None = Field(
        default=None,
        description="checks that prove the source serves again; default: the forward checks with the target's "
        "address replaced by the source's (http urls, tcp hosts) and command checks run on the other host",
    )


class Plan(Strict):
    name: str = Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        max_length=255,  # a directory name; a user's plan is held to MAX_NAME_CHARS below (and in the schema)
        json_schema_extra={"maxLength": MAX_NAME_CHARS},
        description=f"the plan's name, typed to confirm; names the state directory (at most {MAX_NAME_CHARS} "
        "characters: letters, digits, '.', '_', '-')",
    )
    description: Annotated[str, Field(max_length=1000), AfterValidator(_multiline_text)] | None = None
    source: Host
    target: Host
    # Set by `reversed()` only: the forward plan's name (not part of the schema, never read from a file).
    _reverse_of: str | None = PrivateAttr(default=None)
    files: list[FileTree] = Field(default_factory=list, max_length=MAX_TREES)
    database: Database
    services: Services = Field(default_factory=Services)
    health: HealthChecks = Field(default_factory=HealthChecks)
    dns: Dns
    cutover: Cutover = Field(default_factory=Cutover)
    finish: Finish = Field(default_factory=Finish)
    transfer: Transfer = Field(default_factory=Transfer)
    preflight: Preflight = Field(default_factory=Preflight)
    hooks: Hooks = Field(default_factory=Hooks)
    retry: Retry = Field(default_factory=Retry)
    replication: Replication | None = Field(
        default=None, description="the replicate cut-over's settings (cutover.mode replicate or auto)"
    )
    proxy: Proxy | None = Field(
        default=None,
        description="HAProxy front doors: requests held during the window and forwarded to the target after the flip",
    )
    reverse: ReverseOverrides | None = Field(
        default=None, description="overrides for the reverse run (`migrate apply --reverse`)"
    )

    @field_validator("name")
    @classmethod
    def _name_leaves_room_for_the_reverse_run(cls, value: str, info: ValidationInfo) -> str:
        derived = isinstance(info.context, dict) and info.context.get(DERIVED_PLAN)
        if len(value) > MAX_NAME_CHARS and not derived:
            raise PydanticCustomError(
                "name_too_long", f"at most {MAX_NAME_CHARS} characters (the reverse run's directory adds '-reverse')"
            )
        return value

    @model_validator(mode="after")
    def _no_clashes(self, info: ValidationInfo) -> Plan:
        if isinstance(info.context, dict) and info.context.get(DEFER_CROSS_CHECKS):
            return self
        problems = cross_field_problems(self)
        if problems:
            where, message = problems[0]
            dotted = ".".join(f"[{part}]" if isinstance(part, int) else part for part in where).replace(".[", "[")
            raise ValueError(f"{dotted}: {message}")
        return self

    @property
    def dns_content(self) -> str:
        return self.dns.content or self.target.dns_content

    def reverse_problem(self) -> str | None:
        """Why this plan cannot be moved back with `migrate apply --reverse`, or None when it can."""
        if self.services.target_fence.enable is None:
            return (
                "the plan declares no services.target_fence.enable: a reverse run must stop the target (the live "
                "side after the flip) from taking writes before its final copy, or the writes it takes meanwhile "
                "would be lost"
            )
        return None

    def reversed(self) -> Plan:
        """The plan that moves the service back: the target becomes the source and the source the target.

        Every pair swaps (hosts, file trees, database endpoints, services, fences); DNS points back at the source;
        transfer and health come from `reverse` when given, else from the forward plan with the hosts swapped.
        """
        data = self.model_dump(mode="python")
        new_source = data["target"]
        if self.dns.content is not None and self.dns.content != self.target.dns_content:
            # The records point at dns.content now: that is the reversed source's public address.
            new_source = {**new_source, "public_address": self.dns.content}
        data["name"] = f"{self.name}-reverse"
        data["source"], data["target"] = new_source, data["source"]
        data["files"] = [{**tree, "source": tree["target"], "target": tree["source"]} for tree in data["files"]]
        database = data["database"]
        database["source"], database["target"] = database["target"], database["source"]
        services = data["services"]
        services["source"], services["target"] = services["target"], services["source"]
        services["fence"], services["target_fence"] = services["target_fence"], services["fence"]
        data["dns"]["content"] = self.source.dns_content
        # The way back goes through the reverse replica (the old source, a replica of the target since the forward
        # run's finish) when the forward run replicated; `run/compose.resolve_mode` falls back to the shutdown mode
        # when that replica is not there or not healthy when the reverse run starts.
        replicated = self.replication is not None and self.cutover.mode != "shutdown"
        data["cutover"]["mode"] = "replicate" if replicated else "shutdown"
        if data.get("replication") is not None:
            replication = data["replication"]
            replication["source"], replication["target"] = replication["target"], replication["source"]
        if data.get("proxy") is not None:
            data["proxy"] = {"source": data["proxy"]["target"], "target": data["proxy"]["source"]}
        overrides = self.reverse
        if overrides is not None and overrides.transfer is not None:
            data["transfer"] = overrides.transfer.model_dump(mode="python")
        if overrides is not None and overrides.health is not None:
            data["health"] = overrides.health.model_dump(mode="python")
        else:
            data["health"] = _health_swapped(self.health, self._address_swaps()).model_dump(mode="python")
        data["reverse"] = None
        back = Plan.model_validate(data, context={DERIVED_PLAN: True})
        back._reverse_of = self.name
        return back

    @property
    def reverse_of(self) -> str | None:
        """The forward plan's name when this plan is its reversal (`reversed()`), else None."""
        return self._reverse_of

    def latency_probe(self) -> tuple[str, str | None] | None:
        """(URL, Host header) the live app's latency is measured on: `transfer.latency_url`, else the first http
        health check aimed at the source's address; None when there is neither."""
        if self.transfer.latency_url is not None:
            return self.transfer.latency_url, None
        for check in self.health.checks:
            if isinstance(check, HttpCheck):
                return _swap_url_host(check.url, self._address_swaps()), check.host_header
        return None

    def aimed_at_source(self, url: str) -> str:
        """A health check's URL aimed at the source's matching address instead of the target's."""
        return _swap_url_host(url, self._address_swaps())

    def _address_swaps(self) -> dict[str, str]:
        """Target address → the source's matching address (lower case, as urlsplit gives host names)."""
        swaps = {self.target.address.lower(): self.source.address}
        if self.target.public_address:
            swaps[self.target.public_address.lower()] = self.source.dns_content
        return swaps


def _swap_url_host(url: str, swaps: dict[str, str]) -> str:
    parts = urlsplit(url)
    host = parts.hostname
    if host is None or host not in swaps:
        return url
    new_host = swaps[host]
    shown = f"[{new_host}]" if ":" in new_host else new_host
    userinfo, at, _ = parts.netloc.rpartition("@")
    port = f":{parts.port}" if parts.port is not None else ""
    return urlunsplit(parts._replace(netloc=f"{userinfo}{at}{shown}{port}"))


def _health_swapped(health: HealthChecks, swaps: dict[str, str]) -> HealthChecks:
    checks: list[HttpCheck | TcpCheck | SqlCheck | CommandCheck] = []
    for check in health.checks:
        if isinstance(check, HttpCheck):
            checks.append(check.model_copy(update={"url": _swap_url_host(check.url, swaps)}))
        elif isinstance(check, TcpCheck):
            checks.append(check.model_copy(update={"host": swaps.get(check.host.lower(), check.host)}))
        elif isinstance(check, CommandCheck):
            checks.append(check.model_copy(update={"on": "source" if check.on == "target" else "target"}))
        else:
            checks.append(check)
    return health.model_copy(update={"checks": checks})


# The checks that involve several fields of a plan live beside the model they read (the path checks they use stay
# in checks.py, which imports nothing of the model).
def _host_key(address: str, port: int) -> tuple[str, int]:
    try:
        return (str(ipaddress.ip_address(address.strip("[]"))), port)
    except ValueError:
        return (address.strip().rstrip(".").lower(), port)


def record_type_problem(record_type: str, content: str) -> str | None:
    """Why `content` cannot be the content of a `record_type` record (Cloudflare refuses it at the flip), or None."""
    try:
        address = ipaddress.ip_address(content)
    except ValueError:
        address = None
    if record_type == "A" and not isinstance(address, ipaddress.IPv4Address):
        return f"an A record holds an IPv4 address, and the records would get {content!r}"
    if record_type == "AAAA" and not isinstance(address, ipaddress.IPv6Address):
        return f"an AAAA record holds an IPv6 address, and the records would get {content!r}"
    if record_type == "CNAME" and address is not None:
        return f"a CNAME record holds a host name, and the records would get the address {content!r}"
    return None


def cross_field_problems(plan: Plan) -> list[tuple[Location, str]]:
    """Problems that involve several fields, each with the location of the field to blame."""
    problems: list[tuple[Location, str]] = []

    if _host_key(plan.source.address, plan.source.ssh_port) == _host_key(plan.target.address, plan.target.ssh_port):
        problems.append((("target", "address"), "source and target are the same host (same address and ssh_port)"))

    target_datadir = plan.database.target.datadir
    seen_targets: dict[str, int] = {}
    for index, tree in enumerate(plan.files):
        if tree.target in seen_targets:
            other = plan.files[seen_targets[tree.target]].name
            problems.append(
                (("files", index, "target"), f"same target as tree '{other}': two trees would overwrite each other")
            )
        else:
            seen_targets[tree.target] = index
        if tree.target == target_datadir:
            problems.append((("files", index, "target"), "a tree may not be synced into the target's datadir"))
        elif inside(tree.target, target_datadir) or inside(target_datadir, tree.target):
            problems.append(
                (("files", index, "target"), "a tree may not overlap the target's datadir (one inside the other)")
            )

    content = plan.dns.content or plan.target.public_address or plan.target.address
    wrong = record_type_problem(plan.dns.type, content)
    if wrong is not None:
        problems.append((("dns", "content") if plan.dns.content else ("dns", "type"), wrong))

    seen_records: set[str] = set()
    for index, record in enumerate(plan.dns.records):
        key = record.lower().rstrip(".")
        if key in seen_records:
            problems.append((("dns", "records", index), f"'{record}' is listed twice"))
        seen_records.add(key)

    names = [tree.name for tree in plan.files]
    for index, name in enumerate(names):
        if name in names[:index]:
            problems.append((("files", index, "name"), f"another tree is already named '{name}'"))

    problems += fence_problems(plan)
    if plan.transfer.max_latency_ms is not None and plan.latency_probe() is None:
        problems.append(
            (
                ("transfer", "max_latency_ms"),
                "needs a URL to measure: transfer.latency_url, or an http health check (aimed at the source)",
            )
        )
    refusal = replicate_refusal(plan.database.engine)
    if plan.cutover.mode == "replicate" and refusal is not None:
        problems.append((("cutover", "mode"), refusal))  # one line: the section would not help
    elif plan.cutover.mode == "replicate" and plan.replication is None:
        problems.append((("cutover", "mode"), "'replicate' needs a replication section (user, password)"))
    return problems


def fence_problems(plan: Plan) -> list[tuple[Location, str]]:
    """A fence that cannot be lifted, or files moved with nothing stopping uploads on the source."""
    problems: list[tuple[Location, str]] = []
    fence, target_fence = plan.services.fence, plan.services.target_fence
    if fence.enable and not fence.disable:
        problems.append(
            (
                ("services", "fence", "disable"),
                "required with services.fence.enable: a rollback runs it so the source takes writes again "
                "(without it the source would stay fenced while the run says it serves)",
            )
        )
    if target_fence.enable and not target_fence.disable:
        problems.append(
            (
                ("services", "target_fence", "disable"),
                "required with services.target_fence.enable: the DNS flip runs it so the target takes writes "
                "(without it the target would refuse every write after the migration)",
            )
        )
    if plan.files and not fence.enable:
        problems.append(
            (
                ("files",),
                "moving files needs services.fence.enable (how the source refuses writes): without a fence the "
                "source keeps accepting uploads after the final file sync, and those would be lost when DNS moves",
            )
        )
    return problems
