"""The package's layers import one way (issue 20).

From the bottom up; a module may import its own unit and units of its own or a lower
layer, never a higher one, and the four roles never import one another::

  5  cli/, joblib, progress, demo, __init__    entry points, integrations, the facade
  4  client/ | worker/ | manager/ | monitor/   the roles: none imports another
  3  scheduler/, security/                     the daemon (and the CapacityAdapter contract);
                                               keys, ZAP and CURVE for every role
  2  config                                    ClusterConfig
  1  protocol/, objstore/                      the wire (incl. refs: pickled references)
                                               and the store (incl. payload.Fetched)
  0  _version, exceptions, _compat, sizes      facts and helpers every process needs

What client and worker share lives below both (``protocol/refs.py``, ``objstore``,
``_compat``, ``sizes``). Every ``import`` counts, at module level or inside a function or
``if TYPE_CHECKING``; modules named as strings (the zygote's ``WARM_MODULES``, the
facade's lazy table) are not imports. A new module must be given a layer here.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = "scaler_executor"
PACKAGE_DIR = Path(__file__).resolve().parents[2] / PACKAGE

LAYERS = {
    "_version": 0,
    "exceptions": 0,
    "_compat": 0,
    "sizes": 0,
    "worker_command": 2,
    "_locks": 0,
    "protocol": 1,
    "objstore": 1,
    "config": 2,
    "scheduler": 3,
    "security": 3,  # below the roles that connect; its daemon gate uses scheduler.loop's log limiter
    "client": 4,
    "worker": 4,
    "manager": 4,
    "monitor": 4,  # read-only watchers (Monitor); reads scheduler.stats' snapshot types
    "cli": 5,
    "joblib": 5,
    "progress": 5,
    "demo": 5,
    "__init__": 5,  # the package itself: the facade (``from scaler_executor import X``)
}
ROLES = frozenset({"client", "worker", "manager", "monitor"})


def _module_name(path: Path, package_dir: Path) -> str:
    parts = list(path.relative_to(package_dir.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _exists(module: str, package_dir: Path) -> bool:
    """Is ``module`` (dotted, in the package) a module or package on disk (C extensions too)?"""
    base = package_dir.parent.joinpath(*module.split("."))
    return (
        base.is_dir()
        or base.with_suffix(".py").exists()
        or any(base.parent.glob(base.name + ".*.so"))
    )


def _unit(module: str) -> str:
    """'scaler_executor.worker.zygote' -> 'worker'; 'scaler_executor' -> '__init__'."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imported(node: ast.Import | ast.ImportFrom, package: str, package_dir: Path) -> list[str]:
    """The modules one import statement of a module of ``package`` imports."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:  # relative: from the file's package, up level - 1
        base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
        module = ".".join(base + ([node.module] if node.module else []))
    else:
        module = node.module or ""
    # ``from scaler_executor import _compat`` imports the submodule, not the facade
    subs = (f"{module}.{alias.name}" for alias in node.names)
    return [sub if _exists(sub, package_dir) else module for sub in subs]


def imports(path: Path, package_dir: Path) -> list[tuple[int, str]]:
    """(line, module) for every import of a package module in the file, at any depth."""
    name = _module_name(path, package_dir)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found += [(node.lineno, module) for module in _imported(node, package, package_dir)]
    ours = [(line, m) for line, m in found if m == PACKAGE or m.startswith(PACKAGE + ".")]
    return sorted(set(ours))  # once per module, not per imported name


def violations(package_dir: Path = PACKAGE_DIR) -> list[str]:
    problems = []
    for path in sorted(package_dir.rglob("*.py")):
        where = path.relative_to(package_dir.parent)
        importer = _unit(_module_name(path, package_dir))
        if importer not in LAYERS:
            problems.append(f"{where}: unit {importer!r} has no layer in {__name__}.LAYERS")
            continue
        for line, module in imports(path, package_dir):
            imported = _unit(module)
            if imported == importer:
                continue
            if imported not in LAYERS:
                problems.append(
                    f"{where}:{line}: imports {module}, whose unit {imported!r} has no layer"
                )
            elif LAYERS[imported] > LAYERS[importer]:
                problems.append(
                    f"{where}:{line}: imports {module}: {importer} (layer {LAYERS[importer]}) "
                    f"must not import {imported} (layer {LAYERS[imported]}, above it)"
                )
            elif importer in ROLES and imported in ROLES:
                problems.append(
                    f"{where}:{line}: imports {module}: {importer} and {imported} must not import "
                    f"each other (share code through a lower layer)"
                )
    return problems


def test_layers_import_one_way() -> None:
    problems = violations()
    assert not problems, "imports against the layering (see this test's docstring):\n" + "\n".join(
        problems
    )


def test_every_file_of_the_package_is_checked() -> None:
    """The walk sees the package, its subpackages and function-level imports."""
    checked = {str(p.relative_to(PACKAGE_DIR)) for p in PACKAGE_DIR.rglob("*.py")}
    assert {"__init__.py", "worker/zygote.py", "client/agent.py", "scheduler/loop.py"} <= checked
    lines = imports(PACKAGE_DIR / "client" / "pickling.py", PACKAGE_DIR)
    assert any(m == "scaler_executor.objstore.payload" for _, m in lines)  # inside load_value


@pytest.mark.parametrize(
    ("path", "source", "expected"),
    [
        (
            "worker/x.py",
            "def f():\n    import scaler_executor.client.executor\n",
            "worker/x.py:2: imports scaler_executor.client.executor",
        ),
        (
            "client/x.py",
            "from ..worker import processor\n",
            "client/x.py:1: imports scaler_executor.worker.processor",
        ),
        (
            "config.py",
            "from scaler_executor.worker.memory import parse_size\n",
            "config.py:1: imports scaler_executor.worker.memory",
        ),
        (
            "scheduler/x.py",
            "if True:\n    from scaler_executor import manager\n",
            "scheduler/x.py:2: imports scaler_executor.manager",
        ),
        ("protocol/x.py", "import scaler_executor\n", "protocol/x.py:1: imports scaler_executor:"),
        ("brand_new.py", "", "brand_new.py: unit 'brand_new' has no layer"),
    ],
)
def test_the_check_finds_each_kind_of_wrong_import(
    tmp_path: Path, path: str, source: str, expected: str
) -> None:
    package_dir = tmp_path / PACKAGE
    for sub in ("client", "worker", "manager", "scheduler", "protocol"):
        (package_dir / sub).mkdir(parents=True)
        (package_dir / sub / "__init__.py").write_text("")
        (package_dir / sub / "processor.py").write_text("")
    (package_dir / "__init__.py").write_text("")
    (package_dir / path).write_text(source)
    problems = violations(package_dir)
    assert len(problems) == 1 and problems[0].startswith(f"{PACKAGE}/{expected}"), problems


# ----------------------------------------------------------------------------- no cycles
#
# An embedded executor imports the client on a thread of its own while the user's thread
# goes on (client/start.py); both may import the same modules at once. Python's import
# locks are per module: two threads never deadlock and never see a module half-run as
# long as the modules executed at import time import one another without a cycle, and
# no module takes names from a package whose ``__init__`` may still be running (its own
# ancestor: it is in ``sys.modules`` from the start of its ``__init__``). The facade
# ``scaler_executor`` is exempt from the second rule: its names are a lazy table.


def _executed_imports(path: Path, package_dir: Path) -> set[str]:
    """The package modules a file imports while it is imported: module level, not inside a
    function or class body or ``if TYPE_CHECKING:``."""
    name = _module_name(path, package_dir)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def walk(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                walk(node.orelse)
            elif isinstance(node, (ast.If, ast.With, ast.For, ast.While)):
                walk(node.body)
                walk(getattr(node, "orelse", []))
            elif isinstance(node, ast.Try):
                walk(node.body)
                walk(node.orelse)
                walk(node.finalbody)
                for handler in node.handlers:
                    walk(handler.body)
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                found.update(_imported(node, package, package_dir))

    walk(ast.parse(path.read_text(), str(path)).body)
    return {m for m in found if m == PACKAGE or m.startswith(PACKAGE + ".")}


def import_cycles(package_dir: Path = PACKAGE_DIR) -> list[str]:
    """Cycles among the modules' import-time imports, and imports of a module's own
    ancestor package (see above); one line each."""
    graph: dict[str, set[str]] = {}
    problems = []
    for path in sorted(package_dir.rglob("*.py")):
        name = _module_name(path, package_dir)
        edges = graph.setdefault(name, set())
        for module in _executed_imports(path, package_dir):
            if name.startswith(module + ".") and module != PACKAGE:
                problems.append(
                    f"{name} imports names from {module}, its own package, whose __init__ may be running"
                )
            parts = module.split(".")
            for i in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
                dep = ".".join(parts[:i])
                if dep != name and not name.startswith(
                    dep + "."
                ):  # an ancestor is under way already
                    edges.add(dep)
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for dep in sorted(graph.get(node, ())):
            if state.get(dep) == 1:
                problems.append(" -> ".join([*path[path.index(dep) :], dep]))
            elif dep not in state and dep in graph:
                visit(dep, [*path, dep])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    return problems


def test_modules_import_one_another_without_cycles() -> None:
    problems = import_cycles()
    assert not problems, "import-time cycles (see the comment above this test):\n" + "\n".join(
        problems
    )


def test_the_cycle_check_finds_a_cycle_and_an_ancestor_import(tmp_path: Path) -> None:
    package_dir = tmp_path / PACKAGE
    (package_dir / "client").mkdir(parents=True)
    (package_dir / "__init__.py").write_text("")
    (package_dir / "client" / "__init__.py").write_text("X = 1\n")
    (package_dir / "client" / "a.py").write_text("from scaler_executor.client import b\n")
    (package_dir / "client" / "b.py").write_text("def f():\n    import scaler_executor.client.c\n")
    assert import_cycles(package_dir) == []  # a function's import runs later: no cycle
    (package_dir / "client" / "c.py").write_text("from scaler_executor.client import X\n")
    (package_dir / "client" / "b.py").write_text(
        "if True:\n    from scaler_executor.client.a import f\n"
    )
    assert import_cycles(package_dir) == [
        "scaler_executor.client.c imports names from scaler_executor.client, its own package, whose __init__ may be running",
        "scaler_executor.client.a -> scaler_executor.client.b -> scaler_executor.client.a",
    ]
