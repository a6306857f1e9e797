"""Privileges that write through read_only, read from SHOW GRANTS as MariaDB 10.11 prints them (the lines below
were printed by the lab's MariaDB 10.11.19), through roles granted, default and nested."""

from __future__ import annotations

import pytest

from orchestrator.database.mysql.grants import Held, grantee_of, held, parse_grants

WANTED = ("READ_ONLY ADMIN", "SUPER")

# SHOW GRANTS FOR each grantee, as the server answered (a password hash shortened).
SHOWN: dict[tuple[str, str | None], list[str]] = {
    ("ro1", "%"): ["GRANT READ_ONLY ADMIN ON *.* TO `ro1`@`%` IDENTIFIED BY PASSWORD '*B690'"],
    ("ro2", "%"): [
        "GRANT `r_outer` TO `ro2`@`%`",
        "GRANT USAGE ON *.* TO `ro2`@`%`",
        "SET DEFAULT ROLE `r_outer` FOR `ro2`@`%`",
    ],
    ("r_inner", None): ["GRANT READ_ONLY ADMIN ON *.* TO `r_inner`"],
    # A role's listing repeats the grants of the roles granted to it (here r_inner's).
    ("r_outer", None): [
        "GRANT `r_inner` TO `r_outer`",
        "GRANT USAGE ON *.* TO `r_outer`",
        "GRANT SELECT ON `coursereview`.* TO `r_outer`",
        "GRANT READ_ONLY ADMIN ON *.* TO `r_inner`",
    ],
    ("su", "localhost"): ["GRANT SUPER ON *.* TO `su`@`localhost`"],
    ("al", "%"): ["GRANT ALL PRIVILEGES ON *.* TO `al`@`%`"],
    ("weird role", None): ["GRANT SELECT, SUPER ON *.* TO `weird role`"],
    ("ro3", "%"): ["GRANT `weird role` TO `ro3`@`%`", "GRANT USAGE ON *.* TO `ro3`@`%`"],
    ("app", "%"): [
        "GRANT USAGE ON *.* TO `app`@`%` IDENTIFIED BY PASSWORD '*AB0F'",
        "GRANT SELECT, INSERT, UPDATE, DELETE ON `coursereview`.* TO `app`@`%`",
        # A database-level grant of a privilege named like the one sought is not a global one.
        "GRANT ALL PRIVILEGES ON `other`.* TO `app`@`%`",
    ],
}


def show(name: str, host: str | None) -> list[str]:
    return SHOWN[(name, host)]


@pytest.mark.parametrize(
    ("account", "expected"),
    [
        (("ro1", "%"), [Held("'ro1'@'%'", "READ_ONLY ADMIN")]),
        (("ro2", "%"), [Held("'ro2'@'%'", "READ_ONLY ADMIN", ("r_outer", "r_inner"), default_role=True)]),
        (("su", "localhost"), [Held("'su'@'localhost'", "SUPER")]),
        (("al", "%"), [Held("'al'@'%'", "ALL PRIVILEGES (which includes READ_ONLY ADMIN, SUPER)")]),
        (("ro3", "%"), [Held("'ro3'@'%'", "SUPER", ("weird role",))]),
        (("app", "%"), []),
    ],
)
def test_held_reads_the_servers_spelling_and_walks_roles(account: tuple[str, str], expected: list[Held]) -> None:
    assert held(show, *account, WANTED) == expected


def test_the_old_spelling_and_the_new_are_one_privilege() -> None:
    lines = ["GRANT READ ONLY ADMIN ON *.* TO 'x'@'h'"]  # as older servers and MySQL-style quoting write it
    assert held(lambda _n, _h: lines, "x", "h", WANTED) == [Held("'x'@'h'", "READ ONLY ADMIN")]


def test_the_text_names_the_account_the_privilege_and_the_roles() -> None:
    (found,) = held(show, "ro2", "%", WANTED)
    assert found.text() == "'ro2'@'%' holds READ_ONLY ADMIN through role r_outer → r_inner (its default role)"
    (found,) = held(show, "ro3", "%", WANTED)
    assert found.text() == "'ro3'@'%' holds SUPER through role weird role (a role it may SET ROLE to)"


def test_a_role_granted_twice_is_walked_once() -> None:
    lines = {
        ("u", "%"): ["GRANT `a` TO `u`@`%`", "GRANT `b` TO `u`@`%`"],
        ("a", None): ["GRANT `c` TO `a`"],
        ("b", None): ["GRANT `c` TO `b`"],
        ("c", None): ["GRANT SUPER ON *.* TO `c`"],
    }
    asked: list[str] = []

    def _show(name: str, host: str | None) -> list[str]:
        asked.append(name)
        return lines[(name, host)]

    assert [f.via for f in held(_show, "u", "%", WANTED)] == [("a", "c")]
    assert sorted(asked) == ["a", "b", "c", "u"]


def test_grantees_with_quotes_and_backticks() -> None:
    assert grantee_of("`we``ird`@`%` WITH ADMIN OPTION") == ("we`ird", "%")
    assert grantee_of("'it''s'@'localhost'") == ("it's", "localhost")
    assert grantee_of("`role name`") == ("role name", None)
    grants = parse_grants(["GRANT `a ON b` TO `u`@`%`", "SET DEFAULT ROLE `a ON b` FOR `u`@`%`"], "u", "%")
    assert grants.roles == ("a ON b",) and grants.default_role == "a ON b"
