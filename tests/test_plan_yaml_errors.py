"""A YAML error without a position is still one line that names the problem and never repeats a value."""

from __future__ import annotations

from ruamel.yaml.constructor import DuplicateKeyError

from orchestrator.plan.loader import _yaml_error


def test_a_duplicate_key_without_a_mark_is_named_without_its_values() -> None:
    error = DuplicateKeyError(
        "while constructing a mapping", None, 'found duplicate key "password" with value "s3cret" (original: "x")', None
    )
    assert str(_yaml_error("plan.yaml", error, "")) == "plan.yaml: duplicate key 'password'"
