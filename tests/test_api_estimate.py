"""POST <prefix>/api/estimate: the estimate document, validation errors as {"errors": ...}, device memory."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import ZOO
from flask.testing import FlaskClient

from digits_memplugin import create_app
from digits_memplugin.core.estimate import EstimateRequest, estimate

LENET = (ZOO / "caffe_lenet" / "lenet_train_test.prototxt").read_text()
LENET_SOLVER = (ZOO / "caffe_lenet" / "lenet_solver.prototxt").read_text()
SHAPES = {"data": [1, 28, 28]}


def post(client: FlaskClient, body: Any) -> Any:
    return client.post("/memplugin/api/estimate", json=body)


def test_document_has_the_issue_shape(client: FlaskClient) -> None:
    response = post(client, {"net": LENET, "solver": LENET_SOLVER, "data_shapes": SHAPES, "batch": 32})
    assert response.status_code == 200
    doc = response.get_json()
    assert isinstance(doc["total_bytes"], int) and doc["total_bytes"] > 0
    assert doc["batch_size"] == 32
    assert doc["engine"] == "cpu"
    assert set(doc["categories"]) >= {
        "activations", "activation_diffs", "params", "param_diffs", "solver_history", "layer_buffers",
        "data_prefetch", "workspace", "context",
    }
    # the categories describe the steady state; the total is the peak, here the steady state too
    assert sum(doc["categories"].values()) == doc["steady_bytes"] == doc["total_bytes"]
    assert 0 < doc["construction_bytes"] < doc["steady_bytes"]
    assert all(
        isinstance(layer["name"], str) and isinstance(layer["type"], str) and layer["phase"] in ("TRAIN", "TEST")
        and isinstance(layer["bytes"], int)
        for layer in doc["layers"]
    )
    assert doc["max_batch_size"] is None and doc["plan"] is None


def test_api_and_core_agree(client: FlaskClient) -> None:
    body = {"net": LENET, "data_shapes": SHAPES, "batch": 8, "engine": "gpu-cudnn", "free_bytes": 2 * 1024**3}
    via_api = post(client, body).get_json()
    direct = estimate(EstimateRequest(**{**body, "data_shapes": {"data": (1, 28, 28)}}))
    assert via_api == direct


def test_plan_with_free_bytes(client: FlaskClient) -> None:
    doc = post(client, {"net": LENET, "data_shapes": SHAPES, "batch": 1024, "free_bytes": 60 * 1024**2}).get_json()
    assert 0 < doc["max_batch_size"] < 1024
    plan = doc["plan"]
    assert plan["fits"] and plan["batch_size"] <= doc["max_batch_size"]
    assert plan["batch_size"] * plan["iter_size"] >= 1024


def test_free_memory_from_a_device(data_dir: Any) -> None:
    app = create_app(
        {"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading", "MEMPLUGIN_SIMULATE_GPUS": "2x4GiB"}
    )
    client = app.test_client()
    devices = client.get("/memplugin/api/devices").get_json()["devices"]
    gpu = next(device for device in devices if device["kind"] == "gpu")
    doc = post(client, {"net": LENET, "data_shapes": SHAPES, "engine": "gpu", "device": gpu["key"]}).get_json()
    assert doc["device"] == gpu["key"]
    assert doc["free_bytes"] == gpu["memory_free"]
    assert doc["max_batch_size"] > 64
    unknown = post(client, {"net": LENET, "data_shapes": SHAPES, "device": "GPU-nope"})
    assert unknown.status_code == 400 and "GPU-nope" in unknown.get_json()["errors"]["device"]
    both = post(client, {"net": LENET, "data_shapes": SHAPES, "device": gpu["key"], "free_bytes": 1})
    assert both.status_code == 400 and "device" in both.get_json()["errors"]


@pytest.mark.parametrize(
    ("body", "field", "fragment"),
    [
        ({}, "net", "give the net"),
        ({"net": LENET, "batch": "8"}, "batch", "must be int"),
        ({"net": LENET, "batch": True}, "batch", "must be int"),
        ({"net": LENET, "engine": "tpu", "data_shapes": SHAPES}, "engine", "engine must be one of"),
        ({"net": LENET, "batch": 0, "data_shapes": SHAPES}, "batch", "positive"),
        ({"net": LENET, "free_bytes": -1, "data_shapes": SHAPES}, "free_bytes", "non-negative"),
        ({"net": LENET, "safety_margin": 1.5, "data_shapes": SHAPES}, "safety_margin", "[0, 1)"),
        ({"net": LENET, "data_shapes": {"data": [1, -28, 28]}}, "data_shapes.data", "positive integers"),
        ({"net": LENET, "data_shapes": {"data": "1,28,28"}}, "data_shapes.data", "positive integers"),
        ({"net": LENET, "bach": 8}, "bach", "unknown field"),
    ],
)
def test_validation_errors_name_the_field(client: FlaskClient, body: dict[str, Any], field: str, fragment: str) -> None:
    response = post(client, body)
    assert response.status_code == 400
    errors = response.get_json()["errors"]
    assert field in errors, errors
    message = errors[field] if isinstance(errors[field], str) else errors[field]["message"]
    assert fragment in message


def test_prototxt_errors_carry_line_column_and_layer(client: FlaskClient) -> None:
    broken = LENET.replace('type: "Pooling"', 'type: "Pooling" frobnicate: 3', 1)
    errors = post(client, {"net": broken, "data_shapes": SHAPES}).get_json()["errors"]
    assert errors["net"]["line"] == broken[: broken.index("frobnicate")].count("\n") + 1
    assert errors["net"]["column"] is not None
    assert "frobnicate" in errors["net"]["message"]

    too_big_kernel = LENET.replace("kernel_size: 5", "kernel_size: 50", 1)
    errors = post(client, {"net": too_big_kernel, "data_shapes": SHAPES}).get_json()["errors"]
    assert errors["net"]["layer"] == "conv1"
    assert errors["net"]["field"] == "convolution_param.kernel_size"
    assert errors["net"]["line"] == too_big_kernel[: too_big_kernel.index('name: "conv1"')].count("\n")

    missing_shape = post(client, {"net": LENET}).get_json()["errors"]
    assert missing_shape["net"]["layer"] == "mnist"
    assert "item shape" in missing_shape["net"]["message"]


def test_solver_errors_are_reported_under_solver(client: FlaskClient) -> None:
    errors = post(client, {"net": LENET, "solver": "base_lr: [", "data_shapes": SHAPES}).get_json()["errors"]
    assert "solver" in errors
    assert errors["solver"]["source"] == "solver.prototxt"


@pytest.mark.parametrize("body", [b"not json", b"[1, 2]", b'"text"'])
def test_non_object_bodies(client: FlaskClient, body: bytes) -> None:
    response = client.post("/memplugin/api/estimate", data=body, content_type="application/json")
    assert response.status_code == 400
    assert response.mimetype == "application/json"


def test_oversized_request_is_413_json(data_dir: Any) -> None:
    app = create_app(
        {"MEMPLUGIN_DATA_DIR": data_dir, "MEMPLUGIN_ASYNC_MODE": "threading", "MEMPLUGIN_MAX_REQUEST_BYTES": 4096}
    )
    response = app.test_client().post("/memplugin/api/estimate", json={"net": LENET * 4})
    assert response.status_code == 413
    assert "limit is 4096" in response.get_json()["error"]


def test_get_is_not_allowed(client: FlaskClient) -> None:
    response = client.get("/memplugin/api/estimate")
    assert response.status_code == 405
    assert response.mimetype == "application/json"
