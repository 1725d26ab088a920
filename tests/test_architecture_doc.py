"""docs/architecture.md matches the code: every module of the package is named in its table, and every module imports
only the third-party packages its row allows (the standard library always)."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "digits_memplugin"
DOC = REPO / "docs" / "architecture.md"
NOT_DOCUMENTED = {"__init__.py", "__main__.py", "_version.py"}
PACKAGES = {
    # The names the table's last column uses, and the top-level modules each stands for.
    "Flask": {"flask", "werkzeug"},
    "Flask-WTF": {"flask_wtf", "wtforms"},
    "Flask-SocketIO": {"flask_socketio", "socketio"},
    "protobuf": {"google"},
    "pynvml": {"pynvml"},
    "gevent": {"gevent"},
    "lmdb": {"lmdb"},
    "h5py": {"h5py"},
    "numpy": {"numpy"},
    "scikit-learn": {"sklearn", "scipy"},
    "pycaffe": {"caffe"},
    "websocket-client": {"websocket"},
}


def rows() -> list[tuple[set[Path], str, str]]:
    """(the modules a row names, its text, its "may import" column) for each row of the module table."""
    found = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `digits_memplugin/"):
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        names = re.findall(r"`([^`]+)`", cells[0])
        first = REPO / names[0]
        modules: set[Path] = set()
        if names[0].endswith("/"):
            modules = {path for path in first.glob("*.py") if path.name not in NOT_DOCUMENTED}
        else:
            modules = {first} | {first.parent / name for name in names[1:] if name.endswith(".py")}
        found.append((modules, line, cells[2]))
    return found


def third_party(path: Path) -> set[str]:
    """Top-level modules outside the standard library and the package that `path` imports, anywhere in it."""
    imported = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            imported.add(node.module.split(".")[0])
    return imported - set(sys.stdlib_module_names) - {"digits_memplugin", "__future__"}


def test_every_module_is_in_the_table_and_every_file_named_exists() -> None:
    table = rows()
    named = set().union(*(modules for modules, _, _ in table))
    missing_files = sorted(str(path.relative_to(REPO)) for path in named if not path.exists())
    assert not missing_files, f"the table names files that do not exist: {missing_files}"
    for modules, line, _ in table:
        if "/`" in line.split("|")[1]:  # a package's row names each of its modules
            directory = next(iter(modules)).parent if modules else None
            unnamed = sorted(path.name for path in modules if f"`{path.name}`" not in line)
            assert not unnamed, f"{directory}: modules missing from its row: {unnamed}"
    packages_in_rows = {path.parent for modules, line, _ in table for path in modules if "/`" in line.split("|")[1]}
    every = {
        path for path in PACKAGE.rglob("*.py")
        if path.name not in NOT_DOCUMENTED and not {"templates", "static"} & set(path.parts)
    }
    unlisted = sorted(str(path.relative_to(REPO)) for path in every - named if path.parent not in packages_in_rows)
    assert not unlisted, f"modules missing from docs/architecture.md: {unlisted}"


def test_every_module_imports_only_what_its_row_allows() -> None:
    wrong = []
    for modules, _, allowed_text in rows():
        allowed = set().union(*(mods for name, mods in PACKAGES.items() if re.search(rf"\b{re.escape(name)}\b", allowed_text)))
        if "the child pycaffe" in allowed_text:
            allowed |= PACKAGES["pycaffe"]
        for path in sorted(modules):
            extra = third_party(path) - allowed
            if extra:
                wrong.append(f"{path.relative_to(REPO)} imports {sorted(extra)}, its row allows {allowed_text!r}")
    assert not wrong, "\n".join(wrong)
