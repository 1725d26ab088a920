"""The pycaffe shape oracle: real Caffe, in a child process, for the layers the estimator has no rule for."""

from __future__ import annotations

from pathlib import Path

import pytest

from digits_memplugin.core.errors import NetError, ShapeError, UnsupportedLayerError
from digits_memplugin.core.layers import rule_for
from digits_memplugin.core.net import build_net, input_net
from digits_memplugin.core.prototxt import parse_net
from digits_memplugin.estimate.pycaffe_shapes import caffe_error, caffe_net, differences, pycaffe_oracle

pytestmark = pytest.mark.slow

FORK_LAYER = "PixelShuffle"
"""A layer this Caffe registers (brocolli's fork) that the estimator has no rule for."""

PIXEL_SHUFFLE_NET = """
name: "shuffle"
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 8 dim: 3 dim: 5 } } }
layer { name: "conv" type: "Convolution" bottom: "data" top: "conv" convolution_param { num_output: 12 kernel_size: 1 } }
layer { name: "shuffle" type: "PixelShuffle" bottom: "conv" top: "shuffle" pixelshuffle_param { upscale_factor: 2 } }
layer { name: "after" type: "Convolution" bottom: "shuffle" top: "after" convolution_param { num_output: 4 kernel_size: 3 } }
layer { name: "loss" type: "EuclideanLoss" bottom: "after" bottom: "after" top: "loss" }
"""


def test_a_fork_layer_without_a_rule_gets_its_shapes_from_pycaffe() -> None:
    assert rule_for(FORK_LAYER) is None
    net = build_net(parse_net(PIXEL_SHUFFLE_NET), "TRAIN", oracle=pycaffe_oracle)
    shuffle = next(layer for layer in net.layers if layer.name == "shuffle")
    assert shuffle.from_oracle
    assert [net.blobs[i].shape for i in shuffle.tops] == [(2, 3, 6, 10)]
    # The layers after it are shaped by the rules from the oracle's answer, and all of it is what Caffe builds.
    assert net.blob("after").shape == (2, 4, 4, 8)
    assert not any(layer.from_oracle for layer in net.layers if layer.name != "shuffle")
    assert differences(net, caffe_net(input_net(net), "TRAIN")) == []


def test_without_an_oracle_a_layer_without_a_rule_is_unsupported() -> None:
    with pytest.raises(UnsupportedLayerError) as error:
        build_net(parse_net(PIXEL_SHUFFLE_NET), "TRAIN")
    assert error.value.layer == "shuffle"
    assert error.value.layer_type == FORK_LAYER
    assert error.value.field == "type"


def test_data_layers_reach_pycaffe_as_input_layers_of_the_computed_shapes() -> None:
    text = PIXEL_SHUFFLE_NET.replace(
        'layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 8 dim: 3 dim: 5 } } }',
        'layer { name: "data" type: "Data" top: "data" data_param { source: "missing_lmdb" batch_size: 2 } }',
    )
    net = build_net(parse_net(text), "TRAIN", data_shapes={"data": (8, 3, 5)}, oracle=pycaffe_oracle)
    assert net.blob("shuffle").shape == (2, 3, 6, 10)
    sent = input_net(net)
    assert sent.layer[0].type == "Input"
    assert list(sent.layer[0].input_param.shape[0].dim) == [2, 8, 3, 5]


def test_a_net_pycaffe_rejects_gives_a_net_error_with_caffes_message() -> None:
    text = PIXEL_SHUFFLE_NET.replace("upscale_factor: 2", "upscale_factor: 5")
    with pytest.raises(ShapeError) as error:
        build_net(parse_net(text), "TRAIN", source="shuffle.prototxt", lines=[2, 3, 4, 5, 6], oracle=pycaffe_oracle)
    assert error.value.layer == "shuffle"
    assert error.value.layer_type == FORK_LAYER
    assert "Check failed: bottom[0]->shape(1) % upscale_factor_ == 0" in error.value.message
    # Where the layer is written is added on our side.
    assert (error.value.source, error.value.line) == ("shuffle.prototxt", 4)


def test_an_unknown_layer_type_is_unsupported_by_caffe_too() -> None:
    net = parse_net(PIXEL_SHUFFLE_NET.replace('type: "PixelShuffle"', 'type: "NoSuchLayer"'))
    with pytest.raises(UnsupportedLayerError) as error:
        build_net(net, "TRAIN", oracle=pycaffe_oracle)
    assert (error.value.layer, error.value.layer_type, error.value.field) == ("shuffle", "NoSuchLayer", "type")
    assert "no layer type 'NoSuchLayer'" in str(error.value)


def test_a_python_layer_with_bottoms_takes_the_given_shapes_and_its_module_is_never_imported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    marker = tmp_path / "imported"
    (tmp_path / "doubler.py").write_text(f"open({str(marker)!r}, 'w').write('imported')\nclass Doubler:\n    pass\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    text = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 dim: 4 dim: 4 } } }
layer { name: "double" type: "Python" bottom: "data" top: "double" python_param { module: "doubler" layer: "Doubler" } }
layer { name: "shuffle" type: "PixelShuffle" bottom: "double" top: "shuffle" pixelshuffle_param { upscale_factor: 2 } }
layer { name: "conv" type: "Convolution" bottom: "shuffle" top: "conv" convolution_param { num_output: 1 kernel_size: 3 } }
"""
    net = build_net(parse_net(text), "TEST", data_shapes={"double": (2, 8, 4, 4)}, oracle=pycaffe_oracle)
    assert net.blob("double").shape == (2, 8, 4, 4)
    assert not net.layers[1].from_oracle
    assert net.blob("shuffle").shape == (2, 2, 8, 8)  # pycaffe shaped the layer after it, from an Input of (2, 8, 4, 4)
    assert net.params[0].shape == (1, 2, 3, 3)
    assert not marker.exists()


def test_without_the_shapes_a_python_layer_with_bottoms_says_what_to_give() -> None:
    text = """
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "py" type: "Python" bottom: "data" top: "py" python_param { module: "m" layer: "L" } }
"""
    with pytest.raises(ShapeError) as error:
        build_net(parse_net(text), "TEST", oracle=pycaffe_oracle)
    assert (error.value.layer, error.value.layer_type, error.value.field) == ("py", "Python", "top")
    assert "Python layer m.L, which the estimator never imports" in error.value.message
    # The message names no front end's flag or field; each says how (the CLI: --data-shape py/py=...).
    assert "--data-shape" not in error.value.message
    assert error.value.missing_shape is not None and error.value.missing_shape[0] == "py/py"


def test_a_net_with_a_python_layer_or_a_file_is_refused_before_any_child_starts() -> None:
    python = parse_net("""
layer { name: "data" type: "Input" top: "data" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "py" type: "Python" bottom: "data" top: "py" python_param { module: "sys" layer: "exit" } }
""")
    with pytest.raises(UnsupportedLayerError) as error:
        caffe_net(python, "TEST", timeout=0.001)  # a child would not even start in that time
    assert (error.value.layer, error.value.field) == ("py", "python_param.module")
    assert "never handed to pycaffe" in error.value.message
    named = parse_net(PIXEL_SHUFFLE_NET.replace("upscale_factor: 2 }", 'upscale_factor: 2 } '
                                                "hdf5_data_param { source: \"list.txt\" }"))
    with pytest.raises(NetError) as refused:
        caffe_net(named, "TRAIN", timeout=0.001)
    assert (refused.value.layer, refused.value.field) == ("shuffle", "hdf5_data_param.source")


def test_the_child_is_time_limited() -> None:
    with pytest.raises(NetError, match="did not build the net within"):
        caffe_net(parse_net(PIXEL_SHUFFLE_NET), "TRAIN", timeout=0.001)


def test_caffe_net_reports_blobs_splits_loss_weights_backward_and_memory() -> None:
    built = caffe_net(parse_net(PIXEL_SHUFFLE_NET), "TRAIN")
    names = [name for name, _ in built.blobs]
    assert names == ["data", "conv", "shuffle", "after", "after_after_0_split_0", "after_after_0_split_1", "loss"]
    assert dict(built.loss_weights)["loss"] == 1.0
    assert [layer.need_backward for layer in built.layers] == [False, True, True, True, True, True]
    counts = [2 * 8 * 3 * 5, 2 * 12 * 3 * 5, 2 * 3 * 6 * 10, 2 * 4 * 4 * 8, 2 * 2 * 4 * 4 * 8, 1]
    assert built.memory_required_for_data == 4 * sum(counts)


def test_phase_must_be_train_or_test() -> None:
    with pytest.raises(ValueError, match="phase"):
        caffe_net(parse_net(PIXEL_SHUFFLE_NET), "DEPLOY")


# The log reading, on logs as glog writes them.

NET = parse_net(PIXEL_SHUFFLE_NET)


def test_a_check_failure_names_the_layer_being_set_up() -> None:
    log = (
        "I1202 09:26:11.928985 20263 net.cpp:127] Creating Layer conv\n"
        "I1202 09:26:11.928995 20263 net.cpp:177] Setting up conv\n"
        "I1202 09:26:11.929319 20263 net.cpp:127] Creating Layer shuffle\n"
        "F1202 09:26:11.929842 20263 pixelshuffle_layer.cpp:21] Check failed: x == 0 (2 vs. 0)\n"
        "*** Check failure stack trace: ***\n"
    )
    error = caffe_error(log, NET, -6)
    assert isinstance(error, ShapeError)
    assert (error.layer, error.layer_type) == ("shuffle", FORK_LAYER)
    assert error.message == "Caffe rejects it: Check failed: x == 0 (2 vs. 0) (pixelshuffle_layer.cpp:21)"


def test_glog_dates_with_the_year_are_read_too() -> None:
    log = (
        "I20261202 09:26:11.929319 20263 net.cpp:127] Creating Layer conv\n"
        "F20261202 09:26:11.929842 20263 io.cpp:44] Check failed: fd != -1 (-1 vs. -1) File not found: x\n"
    )
    error = caffe_error(log, NET, -6)
    assert error.layer == "conv"
    assert "File not found: x" in error.message


def test_an_unknown_bottom_is_named_from_the_message() -> None:
    log = (
        "I1202 09:26:11.929319 20263 net.cpp:127] Creating Layer data\n"
        "F1202 09:26:11.929842 20263 net.cpp:400] Unknown bottom blob 'nope' (layer 'conv', bottom index 0)\n"
    )
    error = caffe_error(log, NET, -6)
    assert error.layer == "conv"


def test_a_failure_without_a_fatal_line_keeps_the_last_line() -> None:
    error = caffe_error("Traceback (most recent call last):\n  File x\nKeyError: 'boom'\n", NET, 1)
    assert "KeyError: 'boom'" in error.message
    assert "something odd" in caffe_error("Traceback:\nsomething odd\n", NET, 1).message
    assert error.layer is None
    assert "exited with status 7" in caffe_error("", NET, 7).message
