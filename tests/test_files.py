"""files.confined_loader: a solver may name net files inside its own folder, and nothing else."""

from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import pytest

from digits_memplugin.core.errors import NetError
from digits_memplugin.core.estimate import EstimateRequest, estimate
from digits_memplugin.core.training import training_definition
from digits_memplugin.estimate.files import confined_loader, open_regular

NET = 'name: "tiny"\nlayer { name: "in" type: "Input" top: "data" input_param { shape { dim: 1 dim: 3 } } }\n'


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """jobs/job1/{solver's folder with nets}, and a secret beside the job folder."""
    job = tmp_path / "jobs" / "job1"
    (job / "nets").mkdir(parents=True)
    (job / "train_val.prototxt").write_text(NET)
    (job / "nets" / "deep.prototxt").write_text(NET.replace("tiny", "deep"))
    (tmp_path / "jobs" / "secret.prototxt").write_text(NET.replace("tiny", "secret"))
    (tmp_path / "jobs" / "job1-other").mkdir()
    (tmp_path / "jobs" / "job1-other" / "net.prototxt").write_text(NET)
    return job


def test_reads_a_file_in_the_folder_and_names_it_relative_to_it(tree: Path) -> None:
    load = confined_loader(tree)
    assert load("train_val.prototxt") == (NET, "train_val.prototxt")
    assert load("nets/deep.prototxt")[1] == "nets/deep.prototxt"
    assert load("./nets/../train_val.prototxt") == (NET, "train_val.prototxt")


def test_an_absolute_path_inside_the_folder_is_read(tree: Path) -> None:
    assert confined_loader(tree)(str(tree / "nets" / "deep.prototxt"))[1] == "nets/deep.prototxt"


def test_base_dir_given_as_str_and_through_a_symlink(tree: Path, tmp_path: Path) -> None:
    (tmp_path / "link-to-job").symlink_to(tree, target_is_directory=True)
    assert confined_loader(str(tmp_path / "link-to-job"))("train_val.prototxt")[0] == NET


@pytest.mark.parametrize(
    "path",
    [
        "../secret.prototxt",
        "nets/../../secret.prototxt",
        "../job1-other/net.prototxt",  # a sibling whose name starts with the folder's name
        "../../../../../../../../etc/passwd",
        "/etc/passwd",
        "..",
    ],
)
def test_paths_that_escape_the_folder_are_refused(tree: Path, path: str) -> None:
    with pytest.raises(NetError) as raised:
        confined_loader(tree)(path)
    assert "outside the solver's folder" in str(raised.value)
    assert repr(path) in str(raised.value)


def test_absolute_path_outside_given_as_absolute(tree: Path) -> None:
    with pytest.raises(NetError, match="outside the solver's folder"):
        confined_loader(tree)(str(tree.parent / "secret.prototxt"))


def test_a_symlink_pointing_outside_is_refused_without_naming_its_target(tree: Path) -> None:
    (tree / "escape.prototxt").symlink_to(tree.parent / "secret.prototxt")
    (tree / "escape_dir").symlink_to(tree.parent, target_is_directory=True)
    load = confined_loader(tree)
    for path in ("escape.prototxt", "escape_dir/secret.prototxt", "escape_dir/job1-other/net.prototxt"):
        with pytest.raises(NetError, match="outside the solver's folder") as raised:
            load(path)
        assert "secret" not in str(raised.value).replace(path, "")


def test_a_symlink_pointing_inside_is_followed(tree: Path) -> None:
    (tree / "alias.prototxt").symlink_to("nets/deep.prototxt")
    (tree / "alias_dir").symlink_to(tree / "nets", target_is_directory=True)
    load = confined_loader(tree)
    assert load("alias.prototxt") == (NET.replace("tiny", "deep"), "nets/deep.prototxt")
    assert load("alias_dir/deep.prototxt")[1] == "nets/deep.prototxt"


def test_a_dangling_symlink_and_a_missing_file(tree: Path) -> None:
    (tree / "dangling.prototxt").symlink_to("nowhere.prototxt")
    (tree / "dangling_out.prototxt").symlink_to("/nonexistent/x.prototxt")
    load = confined_loader(tree)
    with pytest.raises(NetError, match="does not exist"):
        load("dangling.prototxt")
    with pytest.raises(NetError, match="does not exist"):
        load("missing.prototxt")
    with pytest.raises(NetError, match="outside"):
        load("dangling_out.prototxt")


def test_a_file_used_as_a_folder_is_refused_plainly(tree: Path) -> None:
    with pytest.raises(NetError, match=re.escape("cannot read 'train_val.prototxt/x': not a directory")):
        confined_loader(tree)("train_val.prototxt/x")


def test_a_symlink_loop_is_refused(tree: Path) -> None:
    (tree / "loop_a").symlink_to("loop_b")
    (tree / "loop_b").symlink_to("loop_a")
    with pytest.raises(NetError):
        confined_loader(tree)("loop_a")


def test_non_regular_files_are_refused_without_blocking(tree: Path) -> None:
    os.mkfifo(tree / "fifo.prototxt")
    load = confined_loader(tree)
    result: list[BaseException | tuple[str, str]] = []

    def read() -> None:
        try:
            result.append(load("fifo.prototxt"))
        except NetError as error:
            result.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "reading a FIFO must not wait for a writer"
    assert isinstance(result[0], NetError) and "not a regular file" in str(result[0])
    for path in ("nets", ".", "nets/"):
        with pytest.raises(NetError, match="not a regular file"):
            load(path)


def test_oversized_files_are_refused_naming_the_path_and_the_limit(tree: Path) -> None:
    (tree / "big.prototxt").write_text("#" * 101)
    (tree / "fits.prototxt").write_text("#" * 100)
    load = confined_loader(tree, max_bytes=100)
    assert load("fits.prototxt")[0] == "#" * 100
    with pytest.raises(NetError) as raised:
        load("big.prototxt")
    assert "'big.prototxt'" in str(raised.value) and "101 bytes" in str(raised.value)
    assert "the limit is 100" in str(raised.value)


def test_non_utf8_files_are_refused_with_their_line(tree: Path) -> None:
    (tree / "latin1.prototxt").write_bytes(b'name: "ok"\nname: "caf\xe9"\n')
    with pytest.raises(NetError, match=r"'latin1.prototxt' is not UTF-8 text \(line 2, byte 21\)"):
        confined_loader(tree)("latin1.prototxt")


@pytest.mark.parametrize("path", ["", "a\x00b"])
def test_empty_and_nul_paths_are_refused(tree: Path, path: str) -> None:
    with pytest.raises(NetError):
        confined_loader(tree)(path)


def test_a_missing_base_folder_is_a_net_error(tmp_path: Path) -> None:
    with pytest.raises(NetError, match="not available"):
        confined_loader(tmp_path / "gone")("net.prototxt")
    (tmp_path / "file").write_text("x")
    with pytest.raises(NetError, match="not a folder"):
        confined_loader(tmp_path / "file")("net.prototxt")


@pytest.mark.parametrize("max_bytes", [0, -1, True, 1.5])
def test_max_bytes_must_be_a_positive_int(tmp_path: Path, max_bytes: object) -> None:
    with pytest.raises(ValueError):
        confined_loader(tmp_path, max_bytes=max_bytes)  # type: ignore[arg-type]


def test_unreadable_file_is_a_net_error(tree: Path) -> None:
    if os.geteuid() == 0:
        pytest.skip("root reads files whatever their mode")
    (tree / "locked.prototxt").write_text(NET)
    (tree / "locked.prototxt").chmod(0)
    with pytest.raises(NetError, match="permission denied"):
        confined_loader(tree)("locked.prototxt")


def test_a_symlink_swapped_in_after_the_check_is_not_followed(tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race: the path resolves inside, then a component is replaced by a symlink to outside before the open."""
    real_realpath = os.path.realpath

    def realpath_then_swap(path: str | os.PathLike[str], **kwargs: bool) -> str:
        resolved = real_realpath(path, **kwargs)
        nets = tree / "nets"
        if str(path).endswith("deep.prototxt") and not nets.is_symlink():
            (tree / "nets").rename(tree / "nets.moved")
            (tree / "nets").symlink_to(tree.parent, target_is_directory=True)
            (tree.parent / "deep.prototxt").write_text("secret")
        return resolved

    monkeypatch.setattr(os.path, "realpath", realpath_then_swap)
    with pytest.raises(NetError, match="changed while it was read"):
        confined_loader(tree)("nets/deep.prototxt")


# ---------------------------------------------------------------------------------- through training_definition


def solver_text(**fields: str) -> str:
    body = "".join(f'{name}: "{value}"\n' for name, value in fields.items())
    return body + "base_lr: 0.01\n"


def test_training_definition_reads_net_files_through_the_loader(tree: Path) -> None:
    definition = training_definition(solver_text=solver_text(net="train_val.prototxt"), load=confined_loader(tree))
    assert definition.train.param.name == "tiny"
    assert definition.train.source == "train_val.prototxt"


def test_training_definition_refuses_a_net_path_that_escapes(tree: Path) -> None:
    with pytest.raises(NetError, match="outside the solver's folder"):
        training_definition(solver_text=solver_text(net="../secret.prototxt"), load=confined_loader(tree))


def test_estimate_refuses_a_solver_whose_net_escapes(tree: Path) -> None:
    request = EstimateRequest(solver=solver_text(net="../secret.prototxt"))
    with pytest.raises(NetError, match=re.escape("'../secret.prototxt' is outside the solver's folder")):
        estimate(request, load=confined_loader(tree))
    document = estimate(EstimateRequest(solver=solver_text(net="train_val.prototxt")), load=confined_loader(tree))
    assert document["total_bytes"] > 0


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"net": "../secret.prototxt"}, "net"),
        ({"train_net": "../secret.prototxt"}, "train_net"),
        ({"train_net": "train_val.prototxt", "test_net": "/etc/passwd"}, "test_net"),
    ],
)
def test_loader_errors_name_the_solver_field(tree: Path, fields: dict[str, str], field: str) -> None:
    text = solver_text(**fields) + ("test_iter: 1\ntest_interval: 10\n" if "test_net" in fields else "")
    with pytest.raises(NetError) as raised:
        training_definition(solver_text=text, solver_source="solver.prototxt", load=confined_loader(tree))
    assert raised.value.field == field
    assert raised.value.source == "solver.prototxt"


# ---------------------------------------------------------------------------------- files that must not be opened


def opened(watch: object, name: str) -> list[str]:
    events = watch.events()  # type: ignore[attr-defined]
    return [event for event in events if event.startswith("open") and event.endswith(f"/{name}")]


def test_the_loader_never_opens_a_fifo(tree: Path) -> None:
    """Opening a FIFO, even without blocking, is an open the writer's side sees; a device's open acts on the
    device. The loader takes the file with O_PATH, which opens nothing, and reads only a regular file."""
    from test_hardening_paths import Watch

    os.mkfifo(tree / "fifo.prototxt")
    watch = Watch(tree)
    try:
        with pytest.raises(NetError, match="not a regular file"):
            confined_loader(tree)("fifo.prototxt")
        assert opened(watch, "fifo.prototxt") == []
        assert confined_loader(tree)("train_val.prototxt")[0] == NET
        assert opened(watch, "train_val.prototxt")  # the watch does see the opens it should
    finally:
        watch.close()


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """(a dataset root, a folder outside it), each with a file; links and a FIFO in the root."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "in.bin").write_bytes(b"inside")
    (outside / "secret.bin").write_bytes(b"secret")
    (root / "link_in.bin").symlink_to(root / "in.bin")
    (root / "link_out.bin").symlink_to(outside / "secret.bin")
    os.mkfifo(root / "fifo.bin")
    (root / "folder").mkdir()
    return root, outside


def read_all(fd: int) -> bytes:
    with os.fdopen(fd, "rb") as file:
        return file.read()


def test_open_regular_reads_regular_files_inside_the_roots_links_resolved(roots: tuple[Path, Path]) -> None:
    root, _ = roots
    assert read_all(open_regular(root / "in.bin", roots=[root])) == b"inside"
    assert read_all(open_regular(root / "link_in.bin", roots=[root])) == b"inside"
    assert read_all(open_regular(root / "in.bin")) == b"inside"  # no roots: any regular file


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("link_out.bin", "outside the dataset folders"),
        ("fifo.bin", "not a regular file (a FIFO)"),
        ("folder", "not a regular file (a folder)"),
        ("missing.bin", "does not exist"),
    ],
)
def test_open_regular_refuses_without_opening_naming_the_path_as_given(
    roots: tuple[Path, Path], name: str, says: str
) -> None:
    from test_hardening_paths import Watch

    root, outside = roots
    watches = [Watch(root), Watch(outside)]
    try:
        with pytest.raises(NetError) as raised:
            open_regular(root / name, name=f"data/{name}", roots=[root], layer="l", field="f")
        error = raised.value
        assert says in error.message and f"data/{name}" in error.message, error
        assert (error.layer, error.field) == ("l", "f")
        assert str(outside) not in str(error)
        assert opened(watches[0], name) == [] and opened(watches[1], "secret.bin") == []
    finally:
        for watch in watches:
            watch.close()


def test_open_regular_refuses_a_device_without_opening_it() -> None:
    with pytest.raises(NetError, match="not a regular file"):
        open_regular("/dev/zero")


def test_open_regular_refuses_a_file_whose_real_place_is_outside_once_open(
    roots: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race: the path resolves inside, then a folder on it becomes a link out before the open. Where the
    kernel says the opened handle is decides, not the name checked."""
    root, outside = roots
    (root / "sub").mkdir()
    (root / "sub" / "secret.bin").write_bytes(b"inside")
    real_realpath = os.path.realpath

    def realpath_then_swap(path: str | os.PathLike[str], **kwargs: bool) -> str:
        resolved = real_realpath(path, **kwargs)
        if str(path).endswith("secret.bin") and not (root / "sub").is_symlink():
            (root / "sub").rename(root / "sub.moved")
            (root / "sub").symlink_to(outside, target_is_directory=True)
        return resolved

    monkeypatch.setattr(os.path, "realpath", realpath_then_swap)
    with pytest.raises(NetError, match="outside the dataset folders"):
        open_regular(root / "sub" / "secret.bin", roots=[root])
