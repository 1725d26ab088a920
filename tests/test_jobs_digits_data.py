"""A DIGITS dataset in a net's data layers (jobs/definition/digits_data.py), on its own: which layers read which
part of the dataset, and the layers rewritten for its format. The form's mapping of the same is in test_pages_jobs."""

from __future__ import annotations

import pytest

from digits_memplugin.core.prototxt import parse_net
from digits_memplugin.jobs.definition import digits_data
from digits_memplugin.jobs.definition.digits_data import DataLayerError
from digits_memplugin.networks import standard_network

LENET = standard_network("lenet")
ROWS = [
    {"name": "train-data", "type": "Data", "phase": "TRAIN"},
    {"name": "loss", "type": "SoftmaxWithLoss", "phase": "TRAIN"},
    {"name": "val-data", "type": "Data", "phase": "TEST"},
    {"name": "shared", "type": "HDF5Data", "phase": "TRAIN"},
    {"name": "shared", "type": "HDF5Data", "phase": "TEST"},
]


def test_data_layers_are_found_with_the_nets_they_are_in() -> None:
    assert digits_data.data_layer_phases(ROWS) == {
        "train-data": {"TRAIN"}, "val-data": {"TEST"}, "shared": {"TRAIN", "TEST"}
    }


def test_each_data_layer_reads_the_part_of_its_net() -> None:
    phases = {"train-data": {"TRAIN"}, "val-data": {"TEST"}}
    assert digits_data.dataset_parts(phases, validation=True, two_sets=True) == {
        "train-data": digits_data.TRAIN, "val-data": digits_data.VAL
    }
    assert digits_data.dataset_parts(phases, validation=False, two_sets=True) == {"train-data": digits_data.TRAIN}


def test_a_layer_in_both_nets_reads_one_dataset_only() -> None:
    phases = digits_data.data_layer_phases(ROWS)
    with pytest.raises(DataLayerError) as refused:
        digits_data.dataset_parts(phases, validation=True, two_sets=True)
    assert refused.value.part == digits_data.VAL and "“shared”" in refused.value.message
    assert digits_data.dataset_parts(phases, validation=True, two_sets=False)["shared"] == digits_data.TRAIN


def test_a_net_without_training_data_is_refused_for_the_training_set() -> None:
    with pytest.raises(DataLayerError) as refused:
        digits_data.dataset_parts({"val-data": {"TEST"}}, validation=True, two_sets=True)
    assert refused.value.part == digits_data.TRAIN


def test_the_data_layers_read_the_datasets_format() -> None:
    names = {"train-data", "val-data"}
    lmdb = {layer.name: layer for layer in parse_net(
        digits_data.net_for_format(LENET.text, LENET.filename, names, digits_data.LMDB)).layer}
    assert lmdb["train-data"].data_param.backend == lmdb["val-data"].data_param.backend == 1  # LMDB
    hdf5 = {layer.name: layer for layer in parse_net(
        digits_data.net_for_format(LENET.text, LENET.filename, {"train-data"}, digits_data.HDF5)).layer}
    assert hdf5["train-data"].type == "HDF5Data" and hdf5["train-data"].hdf5_data_param.batch_size == 64
    assert hdf5["val-data"].type == "Data"  # a layer not named is left as it is
    unchanged = LENET.text.replace("data_param {", "data_param {\n    backend: LMDB")
    assert digits_data.net_for_format(unchanged, LENET.filename, names, digits_data.LMDB) == unchanged


def test_an_hdf5_layer_cannot_read_lmdb() -> None:
    hdf5 = digits_data.net_for_format(LENET.text, LENET.filename, {"train-data"}, digits_data.HDF5)
    with pytest.raises(DataLayerError) as refused:
        digits_data.net_for_format(hdf5, LENET.filename, {"train-data"}, digits_data.LMDB)
    assert refused.value.part == digits_data.FORMAT and "choose HDF5" in refused.value.message
