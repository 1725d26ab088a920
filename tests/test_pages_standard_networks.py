"""The standard networks the "New model" page offers: DIGITS-style definitions that Caffe really trains.

Each is built by pycaffe and trained for one step (a child process, as the accuracy tests do), so a typo in a
shipped prototxt cannot hide behind the estimator's own reading of it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from digits_memplugin.core.estimate import EstimateRequest, estimate
from digits_memplugin.core.memory import MemoryOptions
from digits_memplugin.core.prototxt import parse_net
from digits_memplugin.core.training import fill_num_classes, training_definition
from digits_memplugin.measure.runner import measure
from digits_memplugin.networks import STANDARD_NETWORKS, StandardNetwork, standard_network

MiB = 1024 * 1024
ALEXNET = standard_network("alexnet")


@pytest.fixture(params=STANDARD_NETWORKS, ids=lambda network: network.key)
def network(request: pytest.FixtureRequest) -> StandardNetwork:
    return request.param  # type: ignore[no-any-return]


def test_lenet_and_an_alexnet_sized_net_are_shipped() -> None:
    assert {n.key for n in STANDARD_NETWORKS} >= {"lenet", "alexnet"}
    with pytest.raises(KeyError, match="known: lenet, alexnet"):
        standard_network("vgg")


def test_networks_follow_digits_conventions(network: StandardNetwork) -> None:
    param = parse_net(network.text, network.filename)
    data = {layer.name: layer for layer in param.layer if layer.type == "Data"}
    assert sorted(data) == ["train-data", "val-data"]
    assert [rule.stage for rule in data["train-data"].include] == [["train"]]
    assert [rule.stage for rule in data["val-data"].include] == [["val"]]
    assert all(list(layer.top) == ["data", "label"] for layer in data.values())
    classifiers = [
        layer for layer in param.layer
        if layer.type == "InnerProduct" and not layer.inner_product_param.HasField("num_output")
    ]
    assert len(classifiers) == 1, "one classifier whose num_output DIGITS fills in with the class count"
    assert ",".join(map(str, network.item_shape)) in network.dataset


def test_alexnet_sized_is_alexnet_sized() -> None:
    document = estimate(EstimateRequest(net=ALEXNET.text, data_shapes={"data": ALEXNET.item_shape}, classes=1000))
    params = document["categories"]["params"] // 4
    assert 55_000_000 < params < 65_000_000  # AlexNet has about 61 million
    assert document["batch_size"] == 128


@pytest.mark.slow
@pytest.mark.parametrize(("key", "batch", "classes"), [("lenet", 16, 10), ("alexnet", 2, 5)])
def test_pycaffe_trains_them_and_the_estimate_holds(key: str, batch: int, classes: int, tmp_path: Path) -> None:
    network = standard_network(key)
    definition = training_definition(network.text, None, net_source=network.filename)
    fill_num_classes(definition, classes)
    shapes = {"data": network.item_shape}
    report, _, _ = definition.memory(MemoryOptions(solver_type="SGD"), batch=batch, data_shapes=shapes)
    measured = measure(definition, tmp_path, shapes, batch=batch)
    # Shapes agree with Caffe's own log, net by net; memory within the estimator's bound (1% or 1 MiB).
    assert measured.memory_required_for_data == report.memory_required_for_data
    assert abs(report.steady_bytes - measured.allocated) <= max(0.01 * measured.allocated, MiB)
