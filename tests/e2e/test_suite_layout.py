"""The suite's layout, read from its sources (no Envoy runs): test files
share code through helper modules and fixtures through the plugins in
plugins/, never by importing each other; the only HTTP server class is
harness.Upstream (a test answers through its responder); and a fixture has
one definition, wherever a test finds it."""

from __future__ import annotations

import ast
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTS = sorted(HERE.glob("test_*.py"))
PLUGINS = sorted((HERE / "plugins").glob("*.py"))
HELPERS = sorted(p for p in HERE.glob("*.py") if not p.name.startswith("test_") and p.name != "conftest.py")


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def imported_modules(module: ast.Module) -> list[str]:
    """Every module an import statement names (at any depth: imports inside
    functions count)."""
    names = []
    for node in ast.walk(module):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
    return names


def handler_classes(module: ast.Module) -> list[str]:
    """Classes deriving from http.server's BaseHTTPRequestHandler."""
    found = []
    for node in ast.walk(module):
        if isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if name == "BaseHTTPRequestHandler":
                    found.append(node.name)
    return found


def fixtures(module: ast.Module) -> list[str]:
    """The names of the fixtures a module defines (at its top level)."""
    names = []
    for node in module.body:
        if isinstance(node, ast.FunctionDef):
            for d in node.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                if (isinstance(target, ast.Attribute) and target.attr == "fixture") or getattr(target, "id", "") == "fixture":
                    names.append(node.name)
    return names


def test_the_suite_has_its_parts():
    assert len(TESTS) > 40 and HERE / "harness.py" in HELPERS and len(PLUGINS) > 3
    assert "test_suite_layout.py" in {p.name for p in TESTS}


def test_no_test_file_imports_another():
    """What test files share lives in a helper module or a plugin."""
    test_modules = {p.stem for p in TESTS}
    wrong = {}
    for path in TESTS:
        named = [m for m in imported_modules(tree(path)) if m.split(".")[0] in test_modules]
        if named:
            wrong[path.name] = named
    assert not wrong, wrong


def test_no_test_file_writes_its_own_http_handler():
    """A test's upstream answers through harness.Upstream(responder)."""
    wrong = {p.name: handler_classes(tree(p)) for p in TESTS}
    assert not {name: classes for name, classes in wrong.items() if classes}


def test_the_one_http_handler_is_the_harness_upstreams():
    found = {p.name: handler_classes(tree(p)) for p in HELPERS + PLUGINS + TESTS}
    assert {name: classes for name, classes in found.items() if classes} == {"harness.py": ["Handler"]}


def test_no_fixture_is_defined_twice():
    """A fixture defined in two places would be two different things under
    one name, whichever a test happens to see."""
    where: dict[str, list[str]] = {}
    for path in PLUGINS + TESTS + [HERE / "conftest.py"]:
        for name in fixtures(tree(path)):
            where.setdefault(name, []).append(str(path.relative_to(HERE)))
    twice = {name: places for name, places in where.items() if len(places) > 1}
    assert not twice, twice


def test_the_plugins_are_loaded():
    conftest = tree(HERE / "conftest.py")
    loaded = next(
        ast.literal_eval(node.value)
        for node in conftest.body
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "pytest_plugins" for t in node.targets)
    )
    modules = {f"plugins.{p.stem}" for p in PLUGINS if p.name != "__init__.py"}
    assert set(loaded) == modules, (loaded, modules)
