"""Every net of the shared zoo is read with the schema it was written for and estimated, with its flavour named:
BVLC's nets stay "bvlc", SSD's deploy net is "ssd", NVIDIA's fork's (DIGITS' Caffe) are "nvcaffe" (core/flavour.py)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from zoo_cases import (
    CASES,
    DETECTNET,
    DETECTNET_PATH,
    DETECTNET_TYPED_SHAPES,
    NVCAFFE_CASES,
    ZOO,
    FlavouredCase,
    generic_data_shapes,
)

from digits_memplugin.core.errors import NetError, PrototxtSyntaxError
from digits_memplugin.core.estimate import EstimateRequest, estimate
from digits_memplugin.core.flavour import NVCAFFE, NVCAFFE_UNVERIFIED, definition_flavour, flavour_of
from digits_memplugin.core.layers.base import ENGINE_CUDNN
from digits_memplugin.core.prototxt import parse_net, parse_solver

ZOO_FILES = sorted(ZOO.glob("*/*.prototxt"))
COVERED = {file for case in NVCAFFE_CASES for file in case.files.values()} | {DETECTNET_PATH}
"""Files a case of their own estimates: as a solver's nets (SSD's test.prototxt is a test net: alone it has no data
layer), or with the shapes of its Python layers (DetectNet)."""
NVCAFFE_FILES = {"nvcaffe_resnet18/train_val.prototxt", "ssd300_coco_nvcaffe/train.prototxt",
                 "ssd300_coco_nvcaffe/test.prototxt", "ssd300_coco_nvcaffe/solver.prototxt", DETECTNET_PATH}


def relative(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


REFUSED = {"caffe_lenet/lenet_consolidated_solver.prototxt"}
"""Read by the schema but refused for Caffe's own reason: a V1-format net inside a solver (upgrade.check_inline_net)."""


@pytest.mark.parametrize("path", ZOO_FILES, ids=relative)
def test_every_zoo_file_parses_with_its_flavour(path: Path) -> None:
    text = path.read_text()
    if relative(path) in REFUSED:
        with pytest.raises(NetError) as caught:
            parse_solver(text, path.name)
        assert not isinstance(caught.value, PrototxtSyntaxError)
        return
    message = parse_solver(text, path.name) if "solver" in path.name else parse_net(text, path.name)
    assert flavour_of(message) == ("nvcaffe" if relative(path) in NVCAFFE_FILES else "bvlc")


@pytest.mark.parametrize("path", [p for p in ZOO_FILES if "solver" not in p.name and relative(p) not in COVERED],
                         ids=relative)
def test_every_zoo_net_estimates_alone_with_its_flavour(path: Path) -> None:
    text = path.read_text()
    case = next((case for case in CASES if case.net == relative(path) and not case.deploy), None)
    # A net the zoo cases train with their solver is estimated with it (the autoencoder's stages come from it).
    solver = case.texts()[1] if case is not None else None
    shapes = case.data_shapes if case is not None else generic_data_shapes(text)
    document = estimate(EstimateRequest(net=text, solver=solver, net_source=path.name, data_shapes=shapes, classes=10,
                                        batch=1 if case is not None else None))
    assert document["flavour"] == definition_flavour([parse_net(text)]) and document["total_bytes"] > 0


def estimate_case(case: FlavouredCase, **kwargs: object) -> dict:
    net, solver = case.texts()
    return estimate(
        EstimateRequest(net=net, solver=solver, data_shapes=case.data_shapes, classes=case.classes, **kwargs),  # type: ignore[arg-type]
        load=case.load,
    )


@pytest.mark.parametrize("case", NVCAFFE_CASES, ids=lambda case: case.name)
def test_the_zoo_s_nvcaffe_cases_estimate_at_their_own_batch(case: FlavouredCase) -> None:
    document = estimate_case(case, engine=ENGINE_CUDNN, free_bytes=16 << 30)
    assert document["flavour"] == case.flavour
    assert document["total_bytes"] > 0 and document["plan"] is not None
    assert (NVCAFFE_UNVERIFIED in document["assumptions"]) == (case.flavour == NVCAFFE)


def test_ssd300_builds_its_train_and_test_nets_from_the_solver() -> None:
    ssd = next(case for case in NVCAFFE_CASES if case.name == "ssd300_coco_nvcaffe")
    document = estimate_case(ssd)
    assert document["batch_size"] == 32 and document["test_batch_size"] == 8
    types = {layer["type"] for layer in document["layers"]}
    assert {"AnnotatedData", "PriorBox", "Permute", "Normalize", "MultiBoxLoss", "DetectionOutput",
            "DetectionEvaluate"} <= types


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_the_bvlc_cases_stay_bvlc(case: object) -> None:
    net, solver = case.texts()  # type: ignore[attr-defined]
    document = estimate(EstimateRequest(net=net, solver=solver, data_shapes=case.data_shapes,  # type: ignore[attr-defined]
                                        classes=case.classes, batch=1))  # type: ignore[attr-defined]
    assert document["flavour"] == "bvlc"


@pytest.mark.skipif(not (ZOO / DETECTNET_PATH).is_file(), reason=f"DetectNet is not in the shared zoo ({DETECTNET_PATH})")
def test_detectnet_estimates_at_digits_defaults() -> None:
    """DIGITS' DetectNet on KITTI: 3 x 384 x 1248 images, its own batch (10, validation 6), DIGITS' stages, from
    the image shape alone: the same figures as with the six shapes it once needed typed by hand."""
    document = estimate_case(DETECTNET, engine=ENGINE_CUDNN, free_bytes=12 << 30)
    assert DETECTNET.data_shapes == {"data": (3, 384, 1248)}
    assert document["flavour"] == NVCAFFE
    assert document["batch_size"] == 10 and document["test_batch_size"] == 6
    layers = {layer["name"]: layer for layer in document["layers"]}
    assert layers["train_transform"]["type"] == "DetectNetTransformation" and "bbox_loss" in layers
    assert {"cluster", "cluster_gt", "score", "mAP"} <= set(layers)
    assert any(note.startswith("no shape given for 'label'") for note in document["assumptions"])
    typed = estimate_case(dataclasses.replace(DETECTNET, data_shapes=DETECTNET_TYPED_SHAPES), engine=ENGINE_CUDNN,
                          free_bytes=12 << 30)
    assert typed["total_bytes"] == document["total_bytes"] and typed["plan"] == document["plan"]
