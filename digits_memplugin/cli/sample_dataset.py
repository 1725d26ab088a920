"""`digits-memplugin sample-dataset [FOLDER]`: a small real dataset to try the app with, written where the server
looks for datasets.

The images are scikit-learn's bundled handwritten digits (UCI optdigits: 1797 scans of 8 x 8 pixels, 16 grey
levels, shipped inside the package, so nothing is downloaded), scaled to 20 x 20 and centred in 28 x 28 as MNIST's
digits are, so that the standard LeNet trains on them unchanged. They are written as two LMDBs of Caffe Datums,
the format DIGITS and the New model page expect: ``digits_train_lmdb`` and ``digits_val_lmdb`` (a fixed 80/20 split).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

TRAIN_NAME = "digits_train_lmdb"
VAL_NAME = "digits_val_lmdb"
SIDE = 28
"""MNIST's image side, which the standard LeNet expects."""
DIGIT_SIDE = 20
"""MNIST's digits fill a 20 x 20 box centred in the image."""
VAL_FRACTION = 0.2
SEED = 0


def add_parser(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sample-dataset",
        help="write a small dataset of handwritten digits (train and validation LMDBs) to try the app with",
        description=(
            "Write scikit-learn's bundled handwritten digits (1797 images, scaled to 28 x 28 like MNIST) as two "
            f"LMDBs of Caffe Datums, {TRAIN_NAME} and {VAL_NAME}, into FOLDER: the dataset folder the server reads "
            "(serve's <data-dir>/datasets). Then choose them on the New model page with the LeNet network."
        ),
    )
    parser.add_argument(
        "folder", type=Path, nargs="?", default=Path("var") / "datasets", metavar="FOLDER",
        help="dataset folder to write into (default: ./%(default)s, the datasets folder of `serve`'s default data folder)",
    )
    parser.add_argument("--force", action="store_true", help="replace the two LMDBs if they exist")
    parser.set_defaults(run=run)


def digit_images() -> tuple[Any, Any]:
    """The digits as uint8 images of SIDE x SIDE (0-255) with their labels, in a fixed shuffled order."""
    import numpy as np

    from . import CommandError

    try:
        from scipy.ndimage import zoom
        from sklearn.datasets import load_digits
    except ImportError:
        raise CommandError(
            "the sample digits come with scikit-learn, which is not installed: "
            "pip install 'digits-memplugin[sample]' (or scikit-learn) and run the command again"
        ) from None
    digits = load_digits()
    scaled = zoom(digits.images.astype(np.float32) * (255.0 / 16.0), (1, DIGIT_SIDE / 8, DIGIT_SIDE / 8), order=1)
    images = np.zeros((len(scaled), SIDE, SIDE), dtype=np.uint8)
    offset = (SIDE - DIGIT_SIDE) // 2
    images[:, offset:offset + DIGIT_SIDE, offset:offset + DIGIT_SIDE] = np.clip(np.rint(scaled), 0, 255)
    order = np.random.default_rng(SEED).permutation(len(images))
    return images[order], digits.target[order].astype(int)


def write_lmdb(path: Path, images: Any, labels: Any) -> None:
    """Images as an LMDB of Caffe Datums (1 x SIDE x SIDE bytes, with their label), keyed by index in order."""
    import lmdb

    from ..core.proto import caffe_pb2

    size = sum(image.nbytes for image in images)
    env = lmdb.open(str(path), map_size=max(1 << 20, 4 * size), subdir=True)
    try:
        with env.begin(write=True) as txn:
            for index, (image, label) in enumerate(zip(images, labels)):
                datum = caffe_pb2.Datum(
                    channels=1, height=SIDE, width=SIDE, data=image.tobytes(), label=int(label)
                )
                txn.put(f"{index:08d}".encode(), datum.SerializeToString())
    finally:
        env.close()


def run(args: argparse.Namespace) -> int:
    import shutil

    from . import CommandError

    folder: Path = args.folder
    targets = [folder / TRAIN_NAME, folder / VAL_NAME]
    existing = [path for path in targets if path.exists() or path.is_symlink()]
    if existing and not args.force:
        raise CommandError(f"{existing[0]} exists; give --force to replace it")
    images, labels = digit_images()
    split = len(images) - round(len(images) * VAL_FRACTION)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for path in existing:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        write_lmdb(targets[0], images[:split], labels[:split])
        write_lmdb(targets[1], images[split:], labels[split:])
    except OSError as error:
        raise CommandError(f"cannot write into {folder}: {error.strerror or error}") from None
    print(f"wrote {targets[0]} ({split} images of 1x{SIDE}x{SIDE}) and {targets[1]} ({len(images) - split} images)")
    print(f"on the New model page: training data {TRAIN_NAME}, validation data {VAL_NAME}, network LeNet")
    print(
        "on the command line: digits-memplugin networks --write . lenet && digits-memplugin train lenet.prototxt "
        f"lenet_solver.prototxt --classes 10 --dataset-root {folder} --data train={TRAIN_NAME} --data test={VAL_NAME}"
    )
    return 0
