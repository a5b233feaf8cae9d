"""The layers in ``app/__init__.py`` hold: each module imports only its own layer and those beneath it."""

from __future__ import annotations

import ast
from pathlib import Path

import app

REPO = Path(__file__).resolve().parents[1]

#: lowest first; a module may import its own layer and any layer before it
LAYERS = ["foundation", "adapters", "observability", "core", "wiring", "entry"]


def layer_of(module: str) -> str | None:
    if module in ("app.errors", "app.faults"):
        return "foundation"
    if module in ("app.config", "app.services"):
        return "wiring"
    for prefix, layer in (("app.adapters", "adapters"), ("app.observability", "observability"),
                          ("app.core", "core"), ("app.web", "entry"), ("app.cli", "entry"),
                          ("actors", "entry"), ("scheduler", "entry")):
        if module == prefix or module.startswith(prefix + "."):
            return layer
    return None


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def sources() -> list[Path]:
    return [p for top in ("app", "actors", "scheduler") for p in sorted((REPO / top).rglob("*.py"))
            if "versions" not in p.parts]


def violations() -> set[tuple[str, str]]:
    found = set()
    for path in sources():
        here = module_name(path)
        mine = layer_of(here)
        if mine is None:
            continue
        for name in imported(path):
            theirs = layer_of(name)
            if theirs is not None and LAYERS.index(theirs) > LAYERS.index(mine):
                found.add((here, name))
    return found


def test_every_module_has_a_layer():
    unplaced = [module_name(p) for p in sources() if layer_of(module_name(p)) is None and module_name(p) != "app"]
    assert unplaced == []


def test_no_module_imports_a_layer_above_its_own():
    assert sorted(violations()) == []


def test_the_map_in_app_init_names_every_layer():
    doc = app.__doc__ or ""
    for folder in ("app/adapters", "app/observability", "app/core", "app/web", "app/cli", "actors", "scheduler"):
        assert folder in doc


def test_the_checker_sees_an_upward_import(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from app.core import states\nimport app.web\n")
    assert {"app.core", "app.core.states", "app.web"} <= imported(bad)
    assert LAYERS.index(layer_of("app.core.states")) > LAYERS.index(layer_of("app.adapters.storage"))
