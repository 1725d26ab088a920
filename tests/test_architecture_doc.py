"""docs/architecture.md matches the code: every folder of the package has its row, every module is named in its
folder's row, and every module imports only what its row allows: the project's folders and modules it names (its
own folder and the package root always), and the third-party packages it names (the standard library always)."""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "digits_memplugin"
DOC = REPO / "docs" / "architecture.md"
ROOT_MODULES = {"__init__.py", "__main__.py", "_version.py"}
"""The package root's own modules: the lazy re-exports, `python -m`, the version. Not a folder of the table."""
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
    "the child pycaffe": {"caffe"},
    "websocket-client": {"websocket"},
}


@dataclass(frozen=True)
class Row:
    folder: Path
    text: str
    project: frozenset[Path]
    """Folders (a directory) and single modules (a .py file) the row's modules may import."""
    third_party: frozenset[str]


def rows() -> list[Row]:
    found = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `digits_memplugin/"):
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]]
        assert len(cells) == 4, f"a row of the folder table has {len(cells)} cells, not 4: {line[:80]}"
        folder = REPO / re.findall(r"`([^`]+)`", cells[0])[0]
        project = frozenset(PACKAGE / name for name in re.findall(r"`([^`]+)`", cells[2]))
        third = frozenset().union(*(mods for name, mods in PACKAGES.items() if re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", cells[3])))
        found.append(Row(folder, cells[1], project, third))
    return found


def folders() -> set[Path]:
    """Every folder of the package that holds modules."""
    return {path.parent for path in PACKAGE.rglob("*.py")} - {PACKAGE} | {PACKAGE / "networks"}


def modules_of(folder: Path) -> list[Path]:
    return sorted(path for path in folder.glob("*.py") if path.name != "__init__.py" or folder == PACKAGE)


def imports(path: Path) -> tuple[set[str], set[Path]]:
    """(top-level third-party modules, the project's folders or modules) that `path` imports, anywhere in it."""
    third: set[str] = set()
    project: set[Path] = set()
    package = path.parent
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "digits_memplugin":
                    project.add(_target(REPO.joinpath(*alias.name.split("."))))
                else:
                    third.add(alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.parent
                base = anchor.joinpath(*node.module.split(".")) if node.module else anchor
            elif node.module and node.module.split(".")[0] == "digits_memplugin":
                base = REPO.joinpath(*node.module.split("."))
            else:
                third.add((node.module or "").split(".")[0])
                continue
            for alias in node.names:  # `from .. import x` may name a module of the package
                named = base / alias.name
                project.add(_target(named if named.is_dir() or named.with_suffix(".py").exists() else base))
    return third - set(sys.stdlib_module_names) - {"__future__"}, project


def _target(path: Path) -> Path:
    """What an import reaches: a module file, or a package's folder (its __init__)."""
    return path if path.is_dir() else path.with_suffix(".py")


def test_every_folder_has_its_row_and_every_module_is_named_in_it() -> None:
    table = {row.folder: row for row in rows()}
    assert len(table) == len(rows()), "a folder has two rows"
    missing = sorted(str(folder.relative_to(REPO)) for folder in folders() - set(table))
    assert not missing, f"folders missing from docs/architecture.md: {missing}"
    gone = sorted(str(folder.relative_to(REPO)) for folder in set(table) - folders())
    assert not gone, f"the table names folders that do not exist: {gone}"
    unnamed = [
        f"{folder.relative_to(REPO)}: {path.name}"
        for folder, row in table.items() for path in modules_of(folder)
        if f"`{path.name}`" not in row.text
    ]
    assert not unnamed, f"modules missing from their folder's row: {unnamed}"
    named = {
        f"{row.folder.relative_to(REPO)}: {name}" for row in table.values()
        for name in re.findall(r"`(\w+\.py)`", row.text) if not (row.folder / name).exists()
    }
    assert not named, f"rows name modules their folder does not hold: {sorted(named)}"


def test_every_module_imports_only_what_its_folders_row_allows() -> None:
    wrong = []
    for row in rows():
        names_missing = sorted(str(path.relative_to(REPO)) for path in row.project if not path.exists())
        assert not names_missing, f"{row.folder.relative_to(REPO)}'s row allows what does not exist: {names_missing}"
        for path in [*modules_of(row.folder), row.folder / "__init__.py"]:
            if not path.exists():
                continue
            third, project = imports(path)
            extra = third - row.third_party
            if extra:
                wrong.append(f"{path.relative_to(REPO)} imports {sorted(extra)}; its row allows {sorted(row.third_party)}")
            for target in sorted(project):
                own = target.parent if target.suffix == ".py" else target
                if own == row.folder or target in (PACKAGE, PACKAGE / "_version.py", PACKAGE / "__init__.py"):
                    continue
                if target in row.project or own in row.project:
                    continue
                wrong.append(f"{path.relative_to(REPO)} imports {target.relative_to(PACKAGE)}, which its row does not allow")
    assert not wrong, "\n".join(wrong)


def test_the_rule_catches_an_import_its_row_does_not_allow(tmp_path: Path) -> None:
    """The checker itself: a core module importing the jobs is found (a rule that cannot fail guards nothing)."""
    module = PACKAGE / "core" / "memory.py"
    third, project = imports(module)
    assert PACKAGE / "jobs" / "manager.py" not in project
    probe = tmp_path / "probe.py"
    probe.write_text("from digits_memplugin.jobs.manager import JobManager\nimport flask\n", encoding="utf-8")
    third, project = imports(probe)
    assert third == {"flask"} and project == {PACKAGE / "jobs" / "manager.py"}
    core = next(row for row in rows() if row.folder == PACKAGE / "core")
    assert PACKAGE / "jobs" not in core.project and "flask" not in core.third_party
