"""The standard networks the package ships, as DIGITS offers its own on the "New model" page.

Each is a train/val prototxt in the DIGITS style (data layers ``train-data`` and ``val-data`` chosen by the stages
``train`` and ``val``; a classifier without ``num_output``, which gets the dataset's number of classes), with a
note of the dataset it expects, so that the form can fill in the item shape and class count the estimate needs.
The definitions were written for this package; they read no file outside it. Each comes with a solver to start
from on the command line (`digits-memplugin networks` lists them and writes copies).
"""

from __future__ import annotations

import dataclasses
from functools import cache
from importlib import resources
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class StandardNetwork:
    key: str
    """What the form and the JSON API call it (``lenet``)."""
    title: str
    filename: str
    description: str
    item_shape: tuple[int, ...]
    """One dataset item as stored (channels, height, width): the estimate's data shape for the top ``data``."""
    classes: int
    """The class count of the dataset it was written for; DIGITS takes the real one from the dataset."""
    dataset: str
    """The dataset it expects, in words."""
    solver_filename: str
    """A solver to start from (with DIGITS' stages), for the command line: the form has its own solver fields."""

    @property
    def text(self) -> str:
        """The prototxt, read from the installed package once."""
        return _read(self.filename)

    @property
    def solver_text(self) -> str:
        return _read(self.solver_filename)

    @property
    def path(self) -> Path:
        """Where the installed package keeps the prototxt (a file: the package is installed unzipped)."""
        return _path(self.filename)

    @property
    def solver_path(self) -> Path:
        return _path(self.solver_filename)


def _path(filename: str) -> Path:
    return Path(str(resources.files(__name__).joinpath(filename)))


@cache
def _read(filename: str) -> str:
    return resources.files(__name__).joinpath(filename).read_text(encoding="utf-8")


STANDARD_NETWORKS: tuple[StandardNetwork, ...] = (
    StandardNetwork(
        key="lenet",
        title="LeNet",
        filename="lenet.prototxt",
        description="Two convolutions and two fully connected layers: small, for 28 x 28 grey-scale digits.",
        item_shape=(1, 28, 28),
        classes=10,
        dataset="28 x 28 grey-scale images (1,28,28) such as MNIST, 10 classes",
        solver_filename="lenet_solver.prototxt",
    ),
    StandardNetwork(
        key="alexnet",
        title="AlexNet-sized",
        filename="alexnet.prototxt",
        description="Five convolutions, three fully connected layers, ~62 M parameters: 227 x 227 crops of colour images.",
        item_shape=(3, 256, 256),
        classes=1000,
        dataset="colour images stored at 256 x 256 (3,256,256), cropped to 227 x 227; 1000 classes for ImageNet",
        solver_filename="alexnet_solver.prototxt",
    ),
)


def standard_network(key: str) -> StandardNetwork:
    """The shipped network called `key`; KeyError naming the known ones otherwise."""
    for network in STANDARD_NETWORKS:
        if network.key == key:
            return network
    raise KeyError(f"no standard network {key!r} (known: {', '.join(n.key for n in STANDARD_NETWORKS)})")
