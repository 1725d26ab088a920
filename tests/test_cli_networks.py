"""`digits-memplugin networks`: where the bundled networks and their solvers are, copies of them, and each
bundled solver usable with its net as it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from digits_memplugin.networks import STANDARD_NETWORKS

SCRIPT = Path(sys.executable).parent / "digits-memplugin"


def run(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *map(str, args)], capture_output=True, text=True, timeout=120, check=False, cwd=cwd)


def test_the_list_gives_each_network_its_dataset_and_the_paths_of_its_files() -> None:
    result = run("networks")
    assert result.returncode == 0, result.stderr
    paths = [Path(line.split(":", 1)[1].strip()) for line in result.stdout.splitlines()
             if line.startswith(("  net:", "  solver:"))]
    assert len(paths) == 2 * len(STANDARD_NETWORKS)
    assert all(path.is_absolute() and path.is_file() for path in paths)
    assert {path.name for path in paths} == {"lenet.prototxt", "lenet_solver.prototxt", "alexnet.prototxt",
                                            "alexnet_solver.prototxt"}
    assert "lenet: LeNet." in result.stdout and "  dataset: 28 x 28 grey-scale images (1,28,28)" in result.stdout


def test_write_copies_the_files_and_says_how_to_train_them(tmp_path: Path) -> None:
    result = run("networks", "--write", tmp_path / "nets", "lenet")
    assert result.returncode == 0, result.stderr
    lenet = next(n for n in STANDARD_NETWORKS if n.key == "lenet")
    assert sorted(p.name for p in (tmp_path / "nets").iterdir()) == ["lenet.prototxt", "lenet_solver.prototxt"]
    assert (tmp_path / "nets" / "lenet.prototxt").read_text() == lenet.path.read_text()
    assert (tmp_path / "nets" / "lenet_solver.prototxt").read_text() == lenet.solver_path.read_text()
    assert (
        f"  train: digits-memplugin train {tmp_path / 'nets' / 'lenet.prototxt'} "
        f"{tmp_path / 'nets' / 'lenet_solver.prototxt'} --classes 10 --data train=TRAIN --data test=VAL"
    ) in result.stdout


def test_write_refuses_to_overwrite_without_force_and_never_writes_through_a_link(tmp_path: Path) -> None:
    (tmp_path / "lenet.prototxt").write_text("mine")
    refused = run("networks", "--write", tmp_path, "lenet")
    assert refused.returncode == 2
    assert refused.stderr.strip() == (
        f"digits-memplugin networks: error: {tmp_path / 'lenet.prototxt'} exists; give --force to replace it"
    )
    assert (tmp_path / "lenet.prototxt").read_text() == "mine" and not (tmp_path / "lenet_solver.prototxt").exists()
    target = tmp_path / "target.txt"
    target.write_text("keep")
    (tmp_path / "lenet_solver.prototxt").symlink_to(target)
    assert run("networks", "--write", tmp_path, "lenet", "--force").returncode == 0
    assert target.read_text() == "keep" and not (tmp_path / "lenet_solver.prototxt").is_symlink()


def test_an_unknown_name_is_refused_with_the_known_ones(tmp_path: Path) -> None:
    result = run("networks", "--write", tmp_path, "googlenet")
    assert result.returncode == 2
    assert result.stderr.strip() == "digits-memplugin networks: error: no standard network 'googlenet' (known: lenet, alexnet)"
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("network", STANDARD_NETWORKS, ids=lambda n: n.key)
def test_each_bundled_solver_estimates_with_its_net(network: object) -> None:
    from digits_memplugin.networks import StandardNetwork

    assert isinstance(network, StandardNetwork)
    shape = ",".join(map(str, network.item_shape))
    result = run("estimate", network.path, "--solver", network.solver_path, "--data-shape", f"data={shape}",
                 "--classes", str(network.classes), "--no-pycaffe")
    assert result.returncode == 0, result.stderr
    # The solver's stages choose the nets' data layers: train-data for training, val-data (batch 32) for tests.
    assert result.stdout.splitlines()[0].endswith("solver SGD, batch " + {"lenet": "64", "alexnet": "128"}[network.key]
                                                  + ", test batch 32")


def test_it_is_listed_in_the_help() -> None:
    assert "networks" in run("--help").stdout
