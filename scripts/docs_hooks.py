"""MkDocs hooks for the documentation site (mkdocs.yml: `hooks:`).

- The plan reference (`plan-reference.md`) is generated at build time from the plan's JSON Schema, the one that
  `migrate schema` prints, so it cannot drift from the pydantic model: one section per object of the plan, one row
  per field with its type, default, bounds and description.
- The home page is the README (`index.md`, generated), so the two never drift apart.
- The nav is tolerant: a page in docs/ that mkdocs.yml does not list is appended under "More" instead of being left
  out of the site, so a branch that adds docs/<topic>.md gets it on the site before the nav names it.

`python scripts/docs_hooks.py` prints the plan reference (to look at it without building the site).
"""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import Any

REFERENCE_PAGE = "plan-reference.md"
HOME_PAGE = "index.md"
MORE_SECTION = "More"
_BOUNDS = (
    ("minimum", "≥ {}"),
    ("exclusiveMinimum", "> {}"),
    ("maximum", "≤ {}"),
    ("exclusiveMaximum", "< {}"),
    ("minLength", "at least {} characters"),
    ("maxLength", "at most {} characters"),
    ("minItems", "at least {} items"),
    ("maxItems", "at most {} items"),
)


def _text(value: str) -> str:
    # A table cell: no raw HTML (a description says `<plan dir>`), no cell breaks, no stray emphasis.
    return html.escape(" ".join(value.split()), quote=False).replace("|", "\\|").replace("*", "\\*")


def _cell_code(value: str) -> str:
    # Inside a code span only the table's cell separator needs escaping.
    return value.replace("|", "\\|")


def _anchor(name: str) -> str:
    return name.lower()


def _type(spec: dict[str, Any]) -> str:
    if "$ref" in spec:
        name = spec["$ref"].rsplit("/", 1)[-1]
        return f"[{name}](#{_anchor(name)})"
    if "anyOf" in spec:
        return " or ".join(_type(option) for option in spec["anyOf"])
    if "enum" in spec:
        return " \\| ".join(f"`{json.dumps(value)}`" for value in spec["enum"])
    if "const" in spec:
        return f"`{json.dumps(spec['const'])}`"
    kind = spec.get("type")
    if kind == "array":
        return f"list of {_type(spec.get('items', {}))}"
    if kind == "object" and isinstance(spec.get("additionalProperties"), dict):
        return f"map of string to {_type(spec['additionalProperties'])}"
    if kind == "null":
        return "null"
    return str(kind or "any")


def _bounds(spec: dict[str, Any]) -> list[str]:
    found = [_text(template.format(spec[key])) for key, template in _BOUNDS if key in spec]
    if "pattern" in spec:
        found.append("matches `" + _cell_code(spec["pattern"]) + "`")
    for option in spec.get("anyOf", []):
        found += _bounds(option)
    return found


def _default(spec: dict[str, Any], required: bool) -> str:
    if required:
        return "**required**"
    if "default" not in spec:
        return "optional"  # a section made from its own defaults
    value = spec["default"]
    if value is None:
        return "none"
    if value in ({}, []):
        return "empty"
    return "`" + _cell_code(json.dumps(value)) + "`"


def _rows(definition: dict[str, Any]) -> list[str]:
    required = set(definition.get("required", []))
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    for name, spec in definition.get("properties", {}).items():
        meaning = _text(spec.get("description", ""))
        bounds = _bounds(spec)
        if bounds:
            meaning = f"{meaning} ({', '.join(bounds)})" if meaning else ", ".join(bounds)
        rows.append(f"| `{name}` | {_type(spec)} | {_default(spec, name in required)} | {meaning} |")
    return rows


def _refs(spec: Any) -> list[str]:
    """The definitions a schema fragment names, in the order it names them."""
    if isinstance(spec, dict):
        found = [spec["$ref"].rsplit("/", 1)[-1]] if "$ref" in spec else []
        for value in spec.values():
            found += _refs(value)
        return found
    if isinstance(spec, list):
        return [name for item in spec for name in _refs(item)]
    return []


def plan_reference(schema: dict[str, Any]) -> str:
    """The plan reference as Markdown: the plan's top-level fields, then each object in the order the plan reaches
    it (breadth first), each once."""
    definitions: dict[str, Any] = schema.get("$defs", {})
    lines = [
        "# Plan reference",
        "",
        "Every field of a plan file, generated from the plan's JSON Schema when the site is built (`migrate schema` "
        "prints the same schema, for editors). Unknown keys are errors; a secret is a reference, `{env: NAME}` or "
        "`{file: path}`, never a value. How a plan is read and its safety rules: [Writing a plan](plan.md).",
        "",
        "## Plan",
        "",
        *_rows(schema),
    ]
    queue = _refs(schema.get("properties", {}))
    seen: set[str] = set()
    while queue:
        name = queue.pop(0)
        if name in seen or name not in definitions:
            continue
        seen.add(name)
        definition = definitions[name]
        lines += ["", f"## {name}", ""]
        if definition.get("description"):
            lines += [_text(definition["description"]), ""]
        if definition.get("properties"):
            lines += _rows(definition)
        else:
            lines.append(f"Type: {_type(definition)}.")
        queue += _refs(definition.get("properties", {}))
    return "\n".join(lines) + "\n"


def reference_markdown() -> str:
    from orchestrator.plan.loader import plan_json_schema

    return plan_reference(plan_json_schema())


# ------------------------------------------------------------------------------------------------ MkDocs hooks
def _listed(nav: Any) -> set[str]:
    if isinstance(nav, str):
        return {nav}
    if isinstance(nav, dict):
        return {page for value in nav.values() for page in _listed(value)}
    if isinstance(nav, list):
        return {page for item in nav for page in _listed(item)}
    return set()


def on_config(config: Any) -> Any:
    nav = config.get("nav")
    if not nav:
        return config
    docs = Path(config["docs_dir"])
    listed = _listed(nav)
    unlisted = sorted(
        str(path.relative_to(docs))
        for path in docs.rglob("*.md")
        if str(path.relative_to(docs)) not in listed and path.name not in (REFERENCE_PAGE, HOME_PAGE)
    )
    if unlisted:
        nav.append({MORE_SECTION: unlisted})
    return config


def home_markdown(readme: str) -> str:
    """The site's home page: the README, its links made relative to docs/ (where the site's pages live)."""
    return readme.replace("](docs/", "](").replace("| Plan reference |", f"| [Plan reference]({REFERENCE_PAGE}) |")


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    readme = Path(config["config_file_path"]).parent / "README.md"
    files.append(File.generated(config, HOME_PAGE, content=home_markdown(readme.read_text(encoding="utf-8"))))
    files.append(File.generated(config, REFERENCE_PAGE, content=reference_markdown()))
    return files


if __name__ == "__main__":
    print(reference_markdown(), end="")
