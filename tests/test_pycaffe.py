"""pycaffe is real: it imports, builds nets in CPU mode, reads HDF5 and LMDB data, and learns."""

from __future__ import annotations

from pathlib import Path

import caffe
import h5py
import lmdb
import numpy as np
import pytest
from caffe.proto import caffe_pb2

pytestmark = pytest.mark.slow

CLASSES = 2
SIDE = 8


def toy_images(count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two classes of 1x8x8 images a small LeNet tells apart: bright top half vs bright bottom half, plus noise."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, size=count)
    images = rng.normal(0.0, 0.3, size=(count, 1, SIDE, SIDE)).astype(np.float32)
    for image, label in zip(images, labels):
        half = slice(0, SIDE // 2) if label == 0 else slice(SIDE // 2, SIDE)
        image[0, half, :] += 1.0
    return images, labels.astype(np.float32)


LENET_BODY = """
layer { name: "conv1" type: "Convolution" bottom: "data" top: "conv1"
        convolution_param { num_output: 8 kernel_size: 3 weight_filler { type: "xavier" } } }
layer { name: "pool1" type: "Pooling" bottom: "conv1" top: "pool1"
        pooling_param { pool: MAX kernel_size: 2 stride: 2 } }
layer { name: "ip1" type: "InnerProduct" bottom: "pool1" top: "ip1"
        inner_product_param { num_output: 16 weight_filler { type: "xavier" } } }
layer { name: "relu1" type: "ReLU" bottom: "ip1" top: "ip1" }
layer { name: "ip2" type: "InnerProduct" bottom: "ip1" top: "ip2"
        inner_product_param { num_output: 2 weight_filler { type: "xavier" } } }
layer { name: "loss" type: "SoftmaxWithLoss" bottom: "ip2" bottom: "label" top: "loss" }
"""


def train(tmp_path: Path, data_layer: str, iterations: int) -> list[float]:
    net = tmp_path / "net.prototxt"
    net.write_text(data_layer + LENET_BODY)
    solver = tmp_path / "solver.prototxt"
    solver.write_text(
        f'net: "{net}"\nbase_lr: 0.05\nmomentum: 0.9\nlr_policy: "fixed"\nmax_iter: {iterations}\n'
        f'display: 0\nsnapshot: 0\nsolver_mode: CPU\nrandom_seed: 7\nsnapshot_prefix: "{tmp_path}/snap"\n'
    )
    caffe.set_mode_cpu()
    solver_obj = caffe.get_solver(str(solver))
    losses = []
    for _ in range(iterations):
        solver_obj.step(1)
        losses.append(float(solver_obj.net.blobs["loss"].data))
    return losses


def test_caffe_imports_with_its_layer_registry() -> None:
    layers = set(caffe.layer_type_list())
    assert {"Convolution", "Pooling", "InnerProduct", "Data", "HDF5Data", "Python"} <= layers
    assert caffe_pb2.NetParameter().DESCRIPTOR.full_name == "caffe.NetParameter"


def test_lenet_style_net_learns_from_hdf5(tmp_path: Path) -> None:
    images, labels = toy_images(256, seed=1)
    with h5py.File(tmp_path / "train.h5", "w") as h5:
        h5["data"] = images
        h5["label"] = labels
    (tmp_path / "train.txt").write_text(f"{tmp_path / 'train.h5'}\n")
    data = f"""
layer {{ name: "data" type: "HDF5Data" top: "data" top: "label"
        hdf5_data_param {{ source: "{tmp_path / 'train.txt'}" batch_size: 32 }} }}
"""
    losses = train(tmp_path, data, iterations=60)
    first, last = losses[0], float(np.mean(losses[-5:]))
    assert first > 0.5  # chance level for two classes is ln 2 = 0.69
    assert last < first / 3, (first, last)


def test_lenet_style_net_learns_from_lmdb(tmp_path: Path) -> None:
    """DIGITS datasets are LMDB: the build has USE_LMDB on."""
    images, labels = toy_images(256, seed=2)
    quantized = np.clip(images * 64 + 64, 0, 255).astype(np.uint8)
    env = lmdb.open(str(tmp_path / "train_lmdb"), map_size=1 << 26)
    with env.begin(write=True) as txn:
        for index, (image, label) in enumerate(zip(quantized, labels)):
            datum = caffe_pb2.Datum(channels=1, height=SIDE, width=SIDE, data=image.tobytes(), label=int(label))
            txn.put(f"{index:08d}".encode(), datum.SerializeToString())
    env.close()
    data = f"""
layer {{ name: "data" type: "Data" top: "data" top: "label"
        transform_param {{ scale: 0.015625 }}
        data_param {{ source: "{tmp_path / 'train_lmdb'}" backend: LMDB batch_size: 32 }} }}
"""
    losses = train(tmp_path, data, iterations=60)
    first, last = losses[0], float(np.mean(losses[-5:]))
    assert last < first / 3, (first, last)
