"""The estimate path opens no file and imports no code (issue 18, items 1 and 2).

An estimate (POST /api/estimate, the New model form's JSON twin `models.json`, the CLI `estimate`) may hand a net to a
pycaffe child for the layer types the estimator has no rule for. Caffe's layers open what their parameters name:
HDF5Output truncates `file_name`, DetectionOutput deletes `output_directory` and reads its label map, a data
transformer reads `mean_file`, a Python layer imports `python_param.module` and calls it. The evidence here is what
the kernel saw (an inotify watch on a folder outside, holding files those layers would open) and the files
themselves (content and mtime), not only the status code; a Python module that writes a marker file when imported
must never be imported.

The child itself is confined as a second wall: its own empty folder, no file it may create, truncate or change, no
socket. That is tested by handing the child hostile nets directly, past the parent's sanitising.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from test_hardening_paths import Watch

from digits_memplugin.core.errors import NetError, ShapeError
from digits_memplugin.core.net import build_net
from digits_memplugin.core.prototxt import parse_net
from digits_memplugin.networks import standard_network

pytestmark = pytest.mark.slow

SCRIPT = Path(sys.executable).parent / "digits-memplugin"
OLD = 1_000_000_000  # an mtime in 2001: any write or truncation moves it

PATH_FIELD_NAMES = {"source", "file_name", "mean_file", "root_folder", "label_map_file", "name_size_file",
                    "output_directory", "save_file", "video_file", "module"}
"""Fields of Caffe's messages that name a file, a folder or a module to import."""


# ============================================================================ what is outside


@pytest.fixture
def outside(tmp_path: Path) -> Iterator[Path]:
    """Files a hostile net names: an HDF5 file to truncate, a folder to delete, a label map, name sizes and a mean
    file to read. Every file has an old mtime."""
    folder = tmp_path / "outside"
    (folder / "keep").mkdir(parents=True)
    (folder / "victim.h5").write_bytes(b"precious, not an HDF5 file")
    (folder / "keep" / "file.txt").write_text("precious too")
    (folder / "labelmap.prototxt").write_text('item { name: "none_of_the_above" label: 0 }\n')
    (folder / "sizes.txt").write_text("image 10 10\n")
    (folder / "mean.binaryproto").write_bytes(b"")
    for path in [*folder.rglob("*"), folder]:
        os.utime(path, (OLD, OLD))
    yield folder


def snapshot(folder: Path) -> dict[str, tuple[bytes | None, int]]:
    """Every entry under `folder` with its content (None for a folder) and mtime."""
    return {
        str(path.relative_to(folder)): (None if path.is_dir() else path.read_bytes(), path.stat().st_mtime_ns)
        for path in sorted(folder.rglob("*"))
    }


@pytest.fixture
def watched(outside: Path) -> Iterator[Any]:
    """The outside folder under an inotify watch; at the end nothing there may have been opened or changed."""
    before = snapshot(outside)
    watch = Watch(outside)
    yield watch
    try:
        assert watch.events() == []
    finally:
        watch.close()
    assert snapshot(outside) == before


@pytest.fixture
def marker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A module `memplugin_marker` on PYTHONPATH (the pycaffe child inherits it) that, when imported, writes the
    returned path; it must not exist at the end of a test."""
    folder = tmp_path / "modules"
    folder.mkdir()
    path = tmp_path / "imported"
    (folder / "memplugin_marker.py").write_text(
        f"from pathlib import Path\nPath({str(path)!r}).write_text('imported')\n"
        "class Layer:\n    pass\n"
    )
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")])))
    return path


# ============================================================================ the nets


def hdf5_output_net(file_name: Path) -> str:
    return f"""
name: "writes"
layer {{ name: "data" type: "Input" top: "data" top: "label"
  input_param {{ shape {{ dim: 2 dim: 3 dim: 4 dim: 4 }} shape {{ dim: 2 dim: 1 }} }} }}
layer {{ name: "out" type: "HDF5Output" bottom: "data" bottom: "label"
  hdf5_output_param {{ file_name: "{file_name}" }} }}
"""


def detection_output_net(outside: Path) -> str:
    """DetectionOutput has no rule: pycaffe shapes it. Its LayerSetUp deletes and re-creates `output_directory`,
    reads `label_map_file` and `name_size_file`, and (with visualize) a data transformer reads `mean_file`."""
    return f"""
name: "detects"
layer {{ name: "in" type: "Input" top: "loc" top: "conf" top: "prior"
  input_param {{ shape {{ dim: 1 dim: 8 }} shape {{ dim: 1 dim: 4 }} shape {{ dim: 1 dim: 2 dim: 8 }} }} }}
layer {{ name: "det" type: "DetectionOutput" bottom: "loc" bottom: "conf" bottom: "prior" top: "det"
  transform_param {{ mean_file: "{outside / 'mean.binaryproto'}" }}
  detection_output_param {{ num_classes: 2 keep_top_k: 10 nms_param {{ nms_threshold: 0.45 }} visualize: true
    save_file: "{outside / 'saved.txt'}"
    save_output_param {{ output_directory: "{outside / 'keep'}" label_map_file: "{outside / 'labelmap.prototxt'}"
      name_size_file: "{outside / 'sizes.txt'}" output_format: "VOC" }} }} }}
layer {{ name: "out" type: "HDF5Output" bottom: "loc" bottom: "conf"
  hdf5_output_param {{ file_name: "{outside / 'victim.h5'}" }} }}
"""


def python_net(module: str = "memplugin_marker", layer: str = "Layer") -> str:
    return f"""
name: "imports"
layer {{ name: "data" type: "Input" top: "data" input_param {{ shape {{ dim: 2 dim: 3 }} }} }}
layer {{ name: "py" type: "Python" bottom: "data" top: "py" python_param {{ module: "{module}" layer: "{layer}" }} }}
layer {{ name: "ip" type: "InnerProduct" bottom: "py" top: "ip" inner_product_param {{ num_output: 5 }} }}
"""


PYTHON_MODULES = [pytest.param("memplugin_marker", "Layer", id="marker"), pytest.param("sys", "exit", id="sys.exit")]


def layer_bytes(document: dict[str, Any], name: str) -> int:
    return sum(layer["bytes"] for layer in document["layers"] if layer["name"] == name)


# ============================================================================ POST /api/estimate


def estimate(client: FlaskClient, body: dict[str, Any]) -> Any:
    response = client.post("/memplugin/api/estimate", json=body)
    assert response.status_code < 500, response.get_data(as_text=True)
    assert response.is_json
    assert "Traceback" not in response.get_data(as_text=True)
    return response


@pytest.mark.parametrize("target", ["victim.h5", "new.h5"])
def test_api_hdf5_output_is_estimated_without_opening_its_file(
    client: FlaskClient, outside: Path, watched: Watch, target: str
) -> None:
    response = estimate(client, {"net": hdf5_output_net(outside / target)})
    assert response.status_code == 200, response.get_json()
    document = response.get_json()
    # Its Forward copies both bottoms into host blobs of their shapes: 2*3*4*4 + 2*1 floats.
    assert layer_bytes(document, "out") >= (96 + 2) * 4
    assert not any("pycaffe" in line for line in document.get("assumptions", []))
    assert not (outside / "new.h5").exists()


def test_api_detection_output_reaches_pycaffe_without_its_paths(
    client: FlaskClient, outside: Path, watched: Watch
) -> None:
    response = estimate(client, {"net": detection_output_net(outside)})
    assert response.status_code == 200, response.get_json()
    # DetectionOutput has a rule now (layers/ssd.py): its paths reach neither the rule nor pycaffe.
    assert not any("pycaffe" in line for line in response.get_json()["assumptions"])
    assert not (outside / "saved.txt").exists()  # the folder's content, mtimes included, is checked at the end


@pytest.mark.parametrize(("module", "layer"), PYTHON_MODULES)
def test_api_python_layer_with_bottoms_is_never_imported(
    client: FlaskClient, marker: Path, module: str, layer: str
) -> None:
    missing = estimate(client, {"net": python_net(module, layer)})
    assert missing.status_code == 400
    error = missing.get_json()["errors"]["net"]
    assert (error["layer"], error["layer_type"], error["field"]) == ("py", "Python", "top")
    assert "never imports" in error["message"] and "'py'" in error["message"]
    assert "LayerParameter" not in error["message"]
    given = estimate(client, {"net": python_net(module, layer), "data_shapes": {"py": [2, 6]}})
    assert given.status_code == 200, given.get_json()
    # The InnerProduct after it has 5 x 6 weights: the given shape was used.
    assert layer_bytes(given.get_json(), "ip") > 0
    assert not marker.exists()


# ============================================================================ the form's JSON twin


FORM = {"model_name": "m", "network": "custom", "item_shape": [1, 28, 28], "classes": 10, "device": "cpu",
        "train_source": "no_such_train_db", "val_source": "no_such_val_db", "max_iter": 2}
"""The datasets do not exist: the form estimates the net first, then refuses the job."""


def lenet_with(extra: str) -> str:
    return standard_network("lenet").text + extra


def test_models_json_hdf5_output_and_detection_output_open_nothing(
    client: FlaskClient, outside: Path, watched: Watch
) -> None:
    extra = (f'layer {{ name: "out" type: "HDF5Output" bottom: "scores" bottom: "label" '
             f'hdf5_output_param {{ file_name: "{outside / "victim.h5"}" }} }}\n')
    response = client.post("/memplugin/models.json", json={**FORM, "custom_network": lenet_with(extra)})
    assert response.status_code == 400, response.get_json()
    assert "custom_network" not in response.get_json()["errors"]  # the net was estimated; the datasets are missing
    assert "train_source" in response.get_json()["errors"] or "val_source" in response.get_json()["errors"]


def test_models_json_python_layer_is_never_imported(client: FlaskClient, marker: Path) -> None:
    extra = ('layer { name: "py" type: "Python" bottom: "scores" top: "py" '
             'python_param { module: "memplugin_marker" layer: "Layer" } }\n')
    response = client.post("/memplugin/models.json", json={**FORM, "custom_network": lenet_with(extra)})
    assert response.status_code == 400
    error = response.get_json()["errors"]["custom_network"]
    assert error["layer"] == "py" and "never imports" in error["message"]
    assert not marker.exists()


# ============================================================================ the CLI


def cli(tmp_path: Path, net: str, *args: str) -> subprocess.CompletedProcess[str]:
    (tmp_path / "net.prototxt").write_text(net)
    return subprocess.run(
        [SCRIPT, "estimate", str(tmp_path / "net.prototxt"), "--json", *args],
        check=False, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=dict(os.environ),
    )


def test_cli_hdf5_output_and_detection_output_open_nothing(tmp_path: Path, outside: Path, watched: Watch) -> None:
    result = cli(tmp_path, hdf5_output_net(outside / "victim.h5"))
    assert result.returncode == 0, result.stderr
    assert layer_bytes(json.loads(result.stdout), "out") >= (96 + 2) * 4
    result = cli(tmp_path, detection_output_net(outside))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(("module", "layer"), PYTHON_MODULES)
def test_cli_python_layer_with_bottoms_is_never_imported(
    tmp_path: Path, marker: Path, module: str, layer: str
) -> None:
    missing = cli(tmp_path, python_net(module, layer))
    assert missing.returncode == 2
    assert "layer 'py' (Python): top:" in missing.stderr and "never imports" in missing.stderr
    assert "Traceback" not in missing.stderr
    given = cli(tmp_path, python_net(module, layer), "--data-shape", "py=2,6")
    assert given.returncode == 0, given.stderr
    assert not marker.exists()


# ============================================================================ the core: what the oracle receives


def path_fields(message: Any, prefix: str = "") -> list[str]:
    """Every path-bearing string field set anywhere in `message`."""
    found = []
    for field, value in message.ListFields():
        name = f"{prefix}{field.name}"
        if field.message_type is not None:
            values = value if field.label == field.LABEL_REPEATED else [value]
            for index, item in enumerate(values):
                found += path_fields(item, f"{name}[{index}]." if field.label == field.LABEL_REPEATED else f"{name}.")
        elif field.name in PATH_FIELD_NAMES and value:
            found.append(name)
    return found


class RecordingOracle:
    """Stands in for pycaffe: records each net it is given and answers from real Caffe's arithmetic for the one
    rule-less layer type used here (PixelShuffle with upscale_factor 1 keeps the shape)."""

    def __init__(self) -> None:
        self.nets: list[Any] = []

    def __call__(self, net_param: Any, phase: str) -> dict[str, tuple[list[Any], list[Any]]]:
        self.nets.append(net_param)
        shapes: dict[str, tuple[int, ...]] = {}
        answer: dict[str, tuple[list[Any], list[Any]]] = {}
        for layer in net_param.layer:
            if layer.type == "Input":
                for top, shape in zip(layer.top, layer.input_param.shape):
                    shapes[top] = tuple(shape.dim)
            elif layer.type == "PixelShuffle":
                shapes[layer.top[0]] = shapes[layer.bottom[0]]
                answer[layer.name] = ([shapes[layer.bottom[0]]], [])
            else:
                for top in layer.top:
                    shapes[top] = (1,)
        return answer


HOSTILE_AROUND_A_FORK_LAYER = """
name: "mixed"
layer { name: "data" type: "Data" top: "data" top: "label" data_param { source: "/outside/lmdb" batch_size: 2 }
  transform_param { mean_file: "/outside/mean.binaryproto" } }
layer { name: "py" type: "Python" bottom: "data" top: "py" python_param { module: "memplugin_marker" layer: "L" } }
layer { name: "out" type: "HDF5Output" bottom: "py" bottom: "label" hdf5_output_param { file_name: "/outside/x.h5" } }
layer { name: "gain" type: "InfogainLoss" bottom: "py" bottom: "label" top: "gain"
  infogain_loss_param { source: "/outside/h.binaryproto" } }
layer { name: "shuffle" type: "PixelShuffle" bottom: "py" top: "shuffled" pixelshuffle_param { upscale_factor: 1 }
  hdf5_data_param { source: "/outside/list.txt" } image_data_param { root_folder: "/outside/" } }
layer { name: "later" type: "HDF5Data" top: "later" hdf5_data_param { source: "/outside/list2.txt" batch_size: 2 } }
layer { name: "shuffle2" type: "PixelShuffle" bottom: "later" top: "shuffled2" pixelshuffle_param { upscale_factor: 1 } }
layer { name: "ip" type: "InnerProduct" bottom: "shuffled" top: "ip" inner_product_param { num_output: 3 } }
"""


def test_the_oracle_gets_no_path_no_python_layer_and_no_layer_that_opens_a_file() -> None:
    oracle = RecordingOracle()
    shapes = {"data": (3, 4, 4), "py": (2, 3, 4, 4), "later": (5,)}
    net = build_net(parse_net(HOSTILE_AROUND_A_FORK_LAYER), "TRAIN", data_shapes=shapes, oracle=oracle)
    assert net.blob("shuffled").shape == (2, 3, 4, 4)
    assert net.blob("shuffled2").shape == (2, 5)
    assert net.blob("py").shape == (2, 3, 4, 4)
    assert [layer.name for layer in net.layers if layer.from_oracle] == ["shuffle", "shuffle2"]
    assert oracle.nets, "the fork layers were shaped by the oracle"
    for sent in oracle.nets:
        assert {layer.type for layer in sent.layer} <= {"Input", "PixelShuffle", "InnerProduct"}, sent
        assert path_fields(sent) == [], sent


def test_a_fork_data_layer_never_opens_its_dataset_nor_reaches_pycaffe() -> None:
    oracle = RecordingOracle()
    text = ('layer { name: "boxes" type: "AnnotatedData" top: "data" data_param { source: "/outside/lmdb" '
            'batch_size: 2 } }\n')
    # AnnotatedData has a rule now (layers/ssd.py): it asks the caller for the item shape and never opens the source.
    with pytest.raises(NetError) as error:
        build_net(parse_net(text), "TRAIN", oracle=oracle)
    assert (error.value.layer, error.value.layer_type, error.value.field) == ("boxes", "AnnotatedData", "top")
    assert build_net(parse_net(text), "TRAIN", oracle=oracle, data_shapes={"data": (3, 8, 8)}).blob("data").shape == (
        2, 3, 8, 8)
    assert oracle.nets == []


def test_a_python_layer_with_bottoms_takes_its_shapes_from_the_caller() -> None:
    oracle = RecordingOracle()
    net = build_net(parse_net(python_net()), "TEST", data_shapes={"py": (2, 6)}, oracle=oracle)
    assert net.blob("py").shape == (2, 6)
    assert net.params[0].shape == (5, 6)
    assert oracle.nets == []
    # The batch follows a planner's batch, as for a Python data layer.
    assert build_net(parse_net(python_net()), "TEST", data_shapes={"py": (2, 6)}, batch_override=7).blob("py").shape[0] == 7
    # The wildcard that gives every data layer's first top does not reach a layer with bottoms.
    with pytest.raises(ShapeError) as error:
        build_net(parse_net(python_net()), "TEST", data_shapes={"*": (2, 6)}, oracle=oracle)
    assert (error.value.layer, error.value.layer_type, error.value.field) == ("py", "Python", "top")
    assert "memplugin_marker.Layer" in error.value.message and "never imports" in error.value.message
    assert oracle.nets == []


NOT_PATHS = {"name", "type", "bottom", "top", "param.name", "include.stage", "include.not_stage", "exclude.stage",
             "exclude.not_stage", "python_param.param_str", "window_data_param.crop_mode",
             "inception_param.inception_column.column_name"}
"""String fields of a LayerParameter that name no file (filler types aside)."""


def string_fields(descriptor: Any, prefix: str = "", depth: int = 0) -> list[str]:
    found = []
    for field in descriptor.fields:
        if field.message_type is not None:
            if depth < 3 and field.message_type.name not in ("LayerParameter", "NetParameter"):
                found += string_fields(field.message_type, f"{prefix}{field.name}.", depth + 1)
        elif field.type == field.TYPE_STRING:
            found.append(f"{prefix}{field.name}")
    return found


def test_every_path_bearing_field_of_this_caffe_is_sanitized() -> None:
    """A string field added to caffe.proto must be classed: a path (cleared before pycaffe) or not."""
    from digits_memplugin.core.proto import caffe_pb2
    from digits_memplugin.core.sanitize import PATH_FIELDS

    unclassed = [
        name for name in string_fields(caffe_pb2.LayerParameter.DESCRIPTOR)
        if name not in NOT_PATHS and not name.endswith("filler.type")
        and not any(name == path or name.startswith(f"{path}.") for path in PATH_FIELDS)
    ]
    assert unclassed == []
    assert {path.rsplit(".", 1)[-1] for path in PATH_FIELDS} >= PATH_FIELD_NAMES - {"output_directory"}


# ============================================================================ the pycaffe child, confined


def child(tmp_path: Path, net: str, phase: str = "TEST") -> subprocess.CompletedProcess[str]:
    """The oracle's child run directly on `net`, past every check the parent makes."""
    (tmp_path / "hostile.prototxt").write_text(net)
    work = tmp_path / "cwd"
    work.mkdir(exist_ok=True)
    return subprocess.run(
        [sys.executable, "-m", "digits_memplugin.estimate.pycaffe_shapes", str(tmp_path / "hostile.prototxt"), phase],
        check=False, capture_output=True, text=True, timeout=120, cwd=work,
        env={**os.environ, "GLOG_logtostderr": "1"},
    )


def test_the_child_cannot_truncate_or_create_a_file(tmp_path: Path, outside: Path, watched: Watch) -> None:
    hostile = hdf5_output_net(outside / "victim.h5")
    result = child(tmp_path, hostile)
    assert result.returncode != 0
    assert "Failed to open HDF5 file" in result.stderr
    result = child(tmp_path, hdf5_output_net(outside / "new.h5"))
    assert result.returncode != 0
    assert not (outside / "new.h5").exists()
    assert list((tmp_path / "cwd").iterdir()) == []


def test_the_child_cannot_delete_a_folder(tmp_path: Path, outside: Path) -> None:
    before = snapshot(outside)
    net = detection_output_net(outside).replace(
        f'label_map_file: "{outside / "labelmap.prototxt"}" name_size_file: "{outside / "sizes.txt"}"', ""
    ).replace(f'transform_param {{ mean_file: "{outside / "mean.binaryproto"}" }}', "")
    result = child(tmp_path, net.split('layer { name: "out"')[0])
    assert result.returncode != 0, result.stderr
    assert "filesystem" in result.stderr and "Permission denied" in result.stderr, result.stderr
    assert snapshot(outside) == before
    assert (outside / "keep" / "file.txt").read_text() == "precious too"


CONFINED_ATTEMPTS = """
import errno, json, os, socket, sys
from digits_memplugin.estimate.sandbox import confine
outside = sys.argv[1]
confine()
tried = {}
def attempt(name, action):
    try:
        action()
    except OSError as error:
        tried[name] = errno.errorcode.get(error.errno, str(error.errno))
    else:
        tried[name] = "done"
attempt("open for writing", lambda: open(os.path.join(outside, "victim.h5"), "r+b"))
attempt("truncate on open", lambda: os.open(os.path.join(outside, "victim.h5"), os.O_WRONLY | os.O_TRUNC))
attempt("create", lambda: os.open(os.path.join(outside, "new"), os.O_RDONLY | os.O_CREAT))
attempt("create here", lambda: open("here.txt", "w"))
attempt("anonymous file", lambda: os.open(outside, os.O_RDWR | os.O_TMPFILE))
attempt("truncate", lambda: os.truncate(os.path.join(outside, "victim.h5"), 0))
attempt("unlink", lambda: os.unlink(os.path.join(outside, "keep", "file.txt")))
attempt("rename", lambda: os.rename(os.path.join(outside, "sizes.txt"), os.path.join(outside, "moved")))
attempt("mkdir", lambda: os.mkdir(os.path.join(outside, "made")))
attempt("rmdir", lambda: os.rmdir(os.path.join(outside, "keep")))
attempt("symlink", lambda: os.symlink("/etc/passwd", os.path.join(outside, "link")))
attempt("hard link", lambda: os.link(os.path.join(outside, "sizes.txt"), os.path.join(outside, "hard")))
attempt("chmod", lambda: os.chmod(os.path.join(outside, "sizes.txt"), 0o777))
attempt("utime", lambda: os.utime(os.path.join(outside, "sizes.txt")))
attempt("socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM))
attempt("unix socket", lambda: socket.socket(socket.AF_UNIX, socket.SOCK_STREAM))
attempt("exec", lambda: os.execv("/bin/true", ["true"]))
with open(os.path.join(outside, "sizes.txt")) as readable:
    tried["read"] = readable.read()
print(json.dumps(tried))
"""


def test_the_confinement_blocks_every_way_of_writing_and_the_network(tmp_path: Path, outside: Path) -> None:
    before = snapshot(outside)
    work = tmp_path / "cwd"
    work.mkdir()
    result = subprocess.run([sys.executable, "-c", CONFINED_ATTEMPTS, str(outside)], check=False,
                            capture_output=True, text=True, timeout=60, cwd=work)
    assert result.returncode == 0, result.stderr
    tried = json.loads(result.stdout)
    assert tried.pop("read") == "image 10 10\n"  # reading still works: Caffe reads the net file
    assert {name: outcome for name, outcome in tried.items() if outcome == "done"} == {}
    assert set(tried.values()) <= {"EACCES", "EPERM"}, tried
    assert snapshot(outside) == before
    assert list(work.iterdir()) == []
