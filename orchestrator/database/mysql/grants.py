"""Who holds a global privilege, read from `SHOW GRANTS` the way the server spells it, roles included.

MariaDB 10.11 spells the privilege that writes through `read_only` as `READ_ONLY ADMIN` (its documentation and
older code say `READ ONLY ADMIN`); `SUPER` (which holds it before 11.0.1) and `ALL PRIVILEGES` on `*.*` hold it too.
An account may hold it through a role: one granted to it (its default role, or one it can `SET ROLE` to), or a role
granted to that role, to any depth. `SHOW GRANTS FOR account` names the roles granted to it (`GRANT `r` TO ...`);
`SHOW GRANTS FOR role` names the role's own privileges and the roles granted to it. Each is walked once.

The parse is kept apart from the connection (`held(show_grants, ...)` takes a function answering SHOW GRANTS), so
it is tested offline on the server's own lines.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from orchestrator.database.protocol import Session

# A global grant: the privileges before ` ON *.* TO ` are plain words (column lists only appear on table grants).
_GLOBAL = re.compile(r"^GRANT (?P<privs>[A-Za-z_ ,]+) ON \*\.\* TO (?P<grantee>.+)$")
# A role granted: `GRANT `role` TO grantee` (the role's name quoted with backticks, `` for a backtick in it).
_ROLE = re.compile(r"^GRANT (?P<role>`(?:[^`]|``)+`) TO (?P<grantee>.+)$")
_DEFAULT_ROLE = re.compile(r"^SET DEFAULT ROLE (?P<role>`(?:[^`]|``)+`) FOR ")
# The leading `name`@`host` (or `role`, or 'name'@'host' as MySQL quotes) of a grantee clause.
_GRANTEE = re.compile(r"^(?P<name>`(?:[^`]|``)*`|'(?:[^']|'')*')(?:@(?P<host>`(?:[^`]|``)*`|'(?:[^']|'')*'))?")

ALL = "ALL PRIVILEGES"


def _unquote(text: str) -> str:
    quote = text[0]
    return text[1:-1].replace(quote * 2, quote)


def _key(privilege: str) -> str:
    """One spelling for comparing: 'READ_ONLY ADMIN', 'READ ONLY ADMIN' and 'read_only admin' are one privilege."""
    return " ".join(privilege.replace("_", " ").upper().split())


def grantee_of(clause: str) -> tuple[str, str | None] | None:
    """(name, host) of the grantee a grant line ends with; host None for a role."""
    match = _GRANTEE.match(clause.strip())
    if match is None:
        return None
    host = match.group("host")
    return _unquote(match.group("name")), (_unquote(host) if host is not None else None)


@dataclass(frozen=True)
class Grants:
    """What one SHOW GRANTS says of its grantee itself: global privileges (as spelled), roles granted, default role."""

    privileges: tuple[str, ...]
    roles: tuple[str, ...]
    default_role: str | None


def parse_grants(lines: Iterable[str], name: str, host: str | None) -> Grants:
    """The lines of `SHOW GRANTS FOR name@host` (or FOR a role, host None) that are about that grantee: a role's
    listing also repeats the grants of the roles granted to it, which are walked as roles of their own."""
    privileges: list[str] = []
    roles: list[str] = []
    default_role: str | None = None
    for line in lines:
        line = line.strip()
        if (match := _DEFAULT_ROLE.match(line)) is not None:
            default_role = _unquote(match.group("role"))
            continue
        match = _ROLE.match(line) or _GLOBAL.match(line)
        if match is None or grantee_of(match.group("grantee")) != (name, host):
            continue
        if "role" in match.groupdict():
            roles.append(_unquote(match.group("role")))
        else:
            privileges += [p.strip() for p in match.group("privs").split(",") if p.strip()]
    return Grants(tuple(privileges), tuple(roles), default_role)


@dataclass(frozen=True)
class Held:
    """`account` holds `privilege` (as the server spells it), directly or through `via` (roles, outermost first)."""

    account: str  # 'name'@'host'
    privilege: str
    via: tuple[str, ...] = ()
    default_role: bool = False  # the first role of `via` is the account's default role (active at every login)

    def text(self) -> str:
        if not self.via:
            return f"{self.account} holds {self.privilege}"
        path = " → ".join(self.via)
        how = "its default role" if self.default_role else "a role it may SET ROLE to"
        return f"{self.account} holds {self.privilege} through role {path} ({how})"


ShowGrants = Callable[[str, str | None], list[str]]


def held(show_grants: ShowGrants, name: str, host: str, wanted: Iterable[str]) -> list[Held]:
    """Every way the account name@host holds one of `wanted` globally (ALL PRIVILEGES holds them all), through its
    own grants or any role it can reach; `show_grants(name, host)` answers SHOW GRANTS' lines (host None: a role)."""
    keys = {_key(w) for w in wanted}
    account = f"'{name}'@'{host}'"
    found: list[Held] = []
    own = parse_grants(show_grants(name, host), name, host)
    queue: list[tuple[str, tuple[str, ...]]] = [(role, (role,)) for role in own.roles]
    seen: set[str] = set(own.roles)

    def _note(privileges: Iterable[str], via: tuple[str, ...]) -> None:
        for privilege in privileges:
            key = _key(privilege)
            if key in keys or key in (ALL, "ALL"):
                shown = privilege if key in keys else f"{privilege} (which includes {', '.join(sorted(wanted))})"
                found.append(Held(account, shown, via, bool(via) and via[0] == own.default_role))

    _note(own.privileges, ())
    while queue:
        role, via = queue.pop(0)
        grants = parse_grants(show_grants(role, None), role, None)
        _note(grants.privileges, via)
        for inner in grants.roles:
            if inner not in seen:  # the server refuses cycles; a role met twice is walked once
                seen.add(inner)
                queue.append((inner, (*via, inner)))
    return found


def accounts_named(conn: Session, name: str) -> list[tuple[str, str]]:
    """The accounts (name, host) called `name` on the server (roles excluded)."""
    with conn.cursor() as cur:
        cur.execute("SELECT User, Host FROM mysql.user WHERE User = %s AND is_role = 'N' ORDER BY Host", (name,))
        return [(str(user), str(host)) for user, host in cur.fetchall()]


def show_grants_on(conn: Session) -> ShowGrants:
    """SHOW GRANTS through `conn` (the lines may carry a password hash: they are parsed, never logged)."""

    def _show(name: str, host: str | None) -> list[str]:
        with conn.cursor() as cur:
            if host is None:
                cur.execute("SHOW GRANTS FOR %s", (name,))
            else:
                cur.execute("SHOW GRANTS FOR %s@%s", (name, host))
            return [str(row[0]) for row in cur.fetchall()]

    return _show
