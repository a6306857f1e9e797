"""The documentation site's generated pages: the plan reference names every field a plan can hold, the home page is
the README with links that work on the site, and a page the nav forgot is still on the site."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from pydantic import BaseModel

from orchestrator.plan.loader import plan_json_schema
from orchestrator.plan.model import Plan

ROOT = Path(__file__).resolve().parent.parent


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "scripts" / "docs_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _models(model: type[BaseModel], seen: dict[str, type[BaseModel]]) -> dict[str, type[BaseModel]]:
    """Every pydantic model a plan is made of, by its schema name."""
    for field in model.model_fields.values():
        for candidate in re.findall(r"[A-Za-z_][A-Za-z0-9_]*", repr(field.annotation)):
            found = getattr(__import__("orchestrator.plan.model", fromlist=[candidate]), candidate, None)
            if isinstance(found, type) and issubclass(found, BaseModel) and found.__name__ not in seen:
                seen[found.__name__] = found
                _models(found, seen)
    return seen


def test_the_plan_reference_has_a_row_for_every_field_of_every_section_of_a_plan() -> None:
    page = _hooks().plan_reference(plan_json_schema())
    sections = dict(re.findall(r"^## (\w+)\n(.*?)(?=^## |\Z)", page, flags=re.M | re.S))
    models = _models(Plan, {"Plan": Plan})
    assert {"Plan", "Host", "Cutover", "Database", "Replication", "Proxy"} <= set(models)
    for name, model in models.items():
        assert name in sections, f"no section for {name}"
        for field_name, field in model.model_fields.items():
            key = field.alias or field_name
            assert f"| `{key}` |" in sections[name], f"{name}.{key} missing from the plan reference"


def test_the_plan_reference_says_defaults_bounds_and_meanings_as_the_schema_does() -> None:
    page = _hooks().plan_reference(plan_json_schema())
    mode = next(line for line in page.splitlines() if line.startswith("| `mode` |"))
    assert '`"shutdown"` \\| `"replicate"` \\| `"auto"`' in mode
    assert '| `"auto"` |' in mode
    assert "how the database moves" in mode
    budget = next(line for line in page.splitlines() if line.startswith("| `max_write_block` |"))
    assert "| `120.0` |" in budget and "&gt; 0" in budget and "≤ 3600" in budget
    assert "| `source` | [Host](#host) | **required** |" in page
    assert "<plan dir>" not in page, "raw angle brackets would be read as HTML and vanish"


def test_the_home_page_is_the_readme_with_links_relative_to_the_docs() -> None:
    hooks = _hooks()
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    home = hooks.home_markdown(readme)
    assert "](docs/" not in home
    assert "[Benchmarks](benchmarks.md)" in home
    assert "[Plan reference](plan-reference.md)" in home
    for target in re.findall(r"\]\(docs/([^)#]+)", readme):
        assert (ROOT / "docs" / target).exists(), f"README links to docs/{target}, which does not exist"


def test_a_page_the_nav_does_not_list_is_added_under_more(tmp_path: Path) -> None:
    hooks = _hooks()
    (tmp_path / "guide.md").write_text("# Guide\n")
    (tmp_path / "fleet.md").write_text("# Fleet\n")
    config = {"docs_dir": str(tmp_path), "nav": [{"Home": "index.md"}, {"Guide": ["guide.md"]}]}
    hooks.on_config(config)
    assert config["nav"][-1] == {"More": ["fleet.md"]}


def test_the_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines: the detail belongs in docs/"
