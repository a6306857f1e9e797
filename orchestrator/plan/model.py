"""The declarative plan a user writes, as pydantic models.

Every model forbids unknown keys (a typo must never be silently ignored) and carries defaults for everything a
newcomer should not have to think about. Secrets are never values in the plan: they are `SecretRef`s that name an
environment variable or a file, resolved only when a step needs them.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator
from pydantic_core import PydanticCustomError

from orchestrator.plan.checks import cross_field_problems, directory_problem

# Validation context key: the loader runs the cross-field checks itself, to blame the exact field of the plan.
DEFER_CROSS_CHECKS = "defer_cross_checks"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


class Strict(BaseModel):
    # hide_input_in_errors: a ValidationError printed as is must never show a value (it may be a secret).
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)


def _checked_directory(value: str) -> str:
    problem = directory_problem(value)
    if problem is not None:
        raise PydanticCustomError("unsafe_directory", problem)
    return value


class SecretRef(Strict):
    """Where a secret lives: exactly one of an environment variable or a file (first line, stripped)."""

    env: str | None = Field(default=None, description="name of the environment variable holding the secret")
    file: str | None = Field(default=None, description="path of a file holding the secret (first line)")

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


class Host(Strict):
    """A server reached over SSH."""

    address: str = Field(description="address the orchestrator connects to over SSH")
    ssh_port: int = Field(default=22, ge=1, le=65535)
    user: str = "root"
    key: str | None = Field(default=None, description="private key file; omit to use the SSH agent")
    agent: bool = Field(default=False, description="use the SSH agent (SSH_AUTH_SOCK) for authentication")
    known_hosts: str = Field(
        default="~/.ssh/known_hosts", description="known_hosts file used to verify the host key (always verified)"
    )
    public_address: str | None = Field(
        default=None,
        description="address the DNS records point at for this host (defaults to 'address')",
    )
    connect_timeout: float = Field(default=10.0, gt=0)

    @property
    def dns_content(self) -> str:
        return self.public_address or self.address


class FileTree(Strict):
    """A directory tree moved with rsync, source → target."""

    name: str = Field(description="short name used in logs and reports, e.g. 'uploads'")
    source: str = Field(description="absolute directory on the source")
    target: str = Field(description="absolute directory on the target")
    exclude: list[str] = Field(default_factory=list, description="rsync exclude patterns")
    owner: str | None = Field(default=None, description="chown on the target, e.g. 'www-data:www-data'")

    @field_validator("source", "target")
    @classmethod
    def _safe_directory(cls, value: str) -> str:
        return _checked_directory(value)


class DatabaseEndpoint(Strict):
    """How one host's database is reached and driven."""

    socket: str | None = Field(default=None, description="unix socket on the host (reached through SSH)")
    host: str = Field(default="127.0.0.1", description="TCP address as seen from the host (reached through SSH)")
    port: int = Field(default=3306, ge=1, le=65535)
    datadir: str = Field(description="absolute data directory on the host")
    start: str = Field(description="shell command on the host that starts the database and returns")
    stop: str = Field(description="shell command on the host that stops the database cleanly and returns")

    @field_validator("datadir")
    @classmethod
    def _safe_datadir(cls, value: str) -> str:
        return _checked_directory(value)


class VerifyData(Strict):
    row_counts: bool = Field(default=True, description="compare every table's row count, source vs target")
    checksum: bool = Field(default=False, description="also compare CHECKSUM TABLE (reads whole tables)")
    files: bool = Field(default=True, description="rsync --dry-run --checksum of every tree must change nothing")


class PresyncRounds(Strict):
    max_rounds: int = Field(default=5, ge=1, le=50, description="most rsync rounds of the live datadir")
    converged_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=0,
        description="stop the rounds once a round moved at most this many bytes (the final pass will be short)",
    )


class Database(Strict):
    engine: Literal["mariadb", "mysql"] = "mariadb"
    user: str = "root"
    password: SecretRef | None = Field(default=None, description="reference to the password; none for socket auth")
    source: DatabaseEndpoint
    target: DatabaseEndpoint
    schemas: list[str] | None = Field(
        default=None, description="schemas to verify; default: every schema except the system ones"
    )
    presync: PresyncRounds = Field(default_factory=PresyncRounds)
    verify: VerifyData = Field(default_factory=VerifyData)
    connect_timeout: float = Field(default=10.0, gt=0)
    read_timeout: float = Field(default=60.0, gt=0)


class Service(Strict):
    name: str
    start: str = Field(description="shell command that starts it and returns once it is up")
    stop: str = Field(description="shell command that stops it")


class SourceFence(Strict):
    """How the live service on the source stops taking writes at cut-over, and takes them again on rollback."""

    enable: str | None = Field(
        default=None, description="command on the source that makes the service refuse writes (maintenance mode)"
    )
    disable: str | None = Field(default=None, description="command on the source that lifts the fence")


class Services(Strict):
    target: list[Service] = Field(default_factory=list, description="started on the target after its database")
    source: list[Service] = Field(
        default_factory=list, description="the service on the source (stopped when finish.source is 'stop')"
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


class HttpCheck(Strict):
    kind: Literal["http"] = "http"
    name: str | None = None
    url: str = Field(description="URL on the target, e.g. http://203.0.113.20/healthz")
    host_header: str | None = Field(default=None, description="Host header, e.g. the service's public name")
    expect_status: int = 200
    expect_body: str | None = Field(default=None, description="substring the body must contain")
    timeout: float = Field(default=5.0, gt=0)


class TcpCheck(Strict):
    kind: Literal["tcp"] = "tcp"
    name: str | None = None
    host: str
    port: int = Field(ge=1, le=65535)
    timeout: float = Field(default=5.0, gt=0)


class SqlCheck(Strict):
    kind: Literal["sql"] = "sql"
    name: str | None = None
    query: str
    expect: str | None = Field(default=None, description="expected first column of the first row, as text")


class CommandCheck(Strict):
    kind: Literal["command"] = "command"
    name: str | None = None
    run: str = Field(description="shell command; exit 0 means healthy")
    on: Literal["target", "source"] = "target"
    timeout: float = Field(default=30.0, gt=0)


HealthCheck = Annotated[HttpCheck | TcpCheck | SqlCheck | CommandCheck, Field(discriminator="kind")]


class HealthChecks(Strict):
    checks: list[HealthCheck] = Field(default_factory=list)
    attempts: int = Field(default=10, ge=1, description="tries per check before it fails")
    interval: float = Field(default=1.0, ge=0, description="seconds between tries")


class Dns(Strict):
    provider: Literal["cloudflare"] = "cloudflare"
    api_token: SecretRef
    zone: str = Field(description="zone name, e.g. example.com")
    records: list[str] = Field(min_length=1, description="record names to point at the target")
    type: Literal["A", "AAAA", "CNAME"] = "A"
    content: str | None = Field(default=None, description="new content; default: the target's public address")
    base_url: str | None = Field(default=None, description="API base URL (default: Cloudflare's)")
    timeout: float = Field(default=30.0, gt=0)


class Cutover(Strict):
    lock_wait_timeout: float = Field(
        default=3.0, gt=0, description="seconds to wait for FLUSH TABLES WITH READ LOCK before giving up"
    )
    lock_attempts: int = Field(default=5, ge=1, description="tries to get the lock, with backoff between them")
    lock_retry_backoff: float = Field(default=2.0, ge=0, description="seconds before the first retry (doubles)")
    max_write_block: float = Field(
        default=120.0, gt=0, description="most seconds writes may stay blocked before the target takes them"
    )
    mode: Literal["shutdown"] = Field(
        default="shutdown",
        description="final database pass: 'shutdown' stops the source database cleanly and copies its delta",
    )
    postpone_flag: str | None = Field(
        default=None,
        description="a file on the machine running migrate (relative to the plan): while it exists, the run waits "
        "before the downtime begins (pre-syncs done); delete it to go on",
    )


class Finish(Strict):
    source: Literal["fence", "stop"] = Field(
        default="fence", description="after success the source stays fenced, or its services are stopped"
    )
    drain_seconds: float = Field(
        default=0.0, ge=0, description="seconds to wait after the flip for traffic to leave the source"
    )


class Transfer(Strict):
    bwlimit: str | None = Field(default=None, description="rsync --bwlimit for the live pre-syncs, e.g. '50M'")
    nice: bool = Field(default=True, description="run rsync on the source with nice -n19 and ionice -c3")
    whole_file: bool = Field(default=True, description="rsync --whole-file (faster on a fast network)")
    rsync_timeout: int = Field(default=300, ge=0, description="rsync --timeout (seconds of no I/O)")
    # rsync runs ON the source and pushes to the target: the source itself must be able to ssh to the target.
    source_to_target_key: str | None = Field(
        default=None, description="private key file ON THE SOURCE for ssh to the target; omit to forward the agent"
    )
    source_to_target_known_hosts: str = Field(
        default="~/.ssh/known_hosts", description="known_hosts file ON THE SOURCE that verifies the target"
    )
    source_to_target_options: list[str] = Field(
        default_factory=list, description="extra ssh options for that hop, e.g. ['-o', 'BindAddress=10.0.0.5']"
    )


class Hooks(Strict):
    dir: str = Field(default="hooks", description="directory of hook executables, relative to the plan")
    timeout: float = Field(default=60.0, gt=0, description="seconds a hook may run")
    pass_env: list[str] = Field(
        default_factory=list,
        description="variables from --env-file or secret references that hooks may still inherit (by name)",
    )


class Retry(Strict):
    attempts: int = Field(default=5, ge=1, description="tries of a transient failure")
    max_seconds: float = Field(default=120.0, gt=0, description="give up retrying after this many seconds")
    max_wait: float = Field(default=10.0, gt=0, description="longest wait between tries")


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
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="the plan's name, typed to confirm")
    description: str | None = None
    source: Host
    target: Host
    files: list[FileTree] = Field(default_factory=list)
    database: Database
    services: Services = Field(default_factory=Services)
    health: HealthChecks = Field(default_factory=HealthChecks)
    dns: Dns
    cutover: Cutover = Field(default_factory=Cutover)
    finish: Finish = Field(default_factory=Finish)
    transfer: Transfer = Field(default_factory=Transfer)
    hooks: Hooks = Field(default_factory=Hooks)
    retry: Retry = Field(default_factory=Retry)
    reverse: ReverseOverrides | None = Field(
        default=None, description="overrides for the reverse run (`migrate apply --reverse`)"
    )

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
        overrides = self.reverse
        if overrides is not None and overrides.transfer is not None:
            data["transfer"] = overrides.transfer.model_dump(mode="python")
        if overrides is not None and overrides.health is not None:
            data["health"] = overrides.health.model_dump(mode="python")
        else:
            data["health"] = _health_swapped(self.health, self._address_swaps()).model_dump(mode="python")
        data["reverse"] = None
        return Plan.model_validate(data)

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
