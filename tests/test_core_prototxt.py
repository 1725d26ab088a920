"""Loading prototxt text: syntax errors with line and column, hostile input within limits, and the source map."""

from __future__ import annotations

import itertools
import re
import time
from pathlib import Path

import pytest
from conftest import ZOO
from hypothesis import given, settings
from hypothesis import strategies as st
from test_core_netstate import run_pycaffe

from digits_memplugin.core.errors import MemPluginError, NetError, PrototxtSyntaxError, ShapeError
from digits_memplugin.core.layers.base import PHASE_TEST
from digits_memplugin.core.net import build_net
from digits_memplugin.core.prototxt import DEFAULT_LIMITS, MAX_DETAIL, ParseLimits, parse_net, parse_solver
from digits_memplugin.core.sourcemap import code_spans_outside_strings, count_layer_blocks, layer_lines, string_spans

INPUT = 'layer { name: "input" type: "Input" top: "data" input_param { shape { dim: 1 dim: 2 } } }\n'
RELU = 'name: "r" type: "ReLU" bottom: "data" top: "r"'

# ------------------------------------------------------------------------------------------ syntax errors


@pytest.mark.parametrize(
    ("text", "line", "column", "message"),
    [
        pytest.param('name: "x"\nlayer {\n  name: "a"\n', 3, 9, 'Expected "}".', id="unclosed-brace"),
        pytest.param('name: "x"\n}\n', 2, 1, "Expected identifier or number, got }.", id="extra-brace"),
        pytest.param(
            'layer {\n  name: "p"\n  pooling_param { pool: MAXX }\n}\n', 3, 25,
            'Enum type "caffe.PoolingParameter.PoolMethod" has no value named MAXX.', id="bad-enum",
        ),
        pytest.param(
            'layer {\n  name: "a"\n  typo: "x"\n}\n', 3, 3,
            'Message type "caffe.LayerParameter" has no field named "typo".', id="unknown-field",
        ),
        pytest.param(
            'layer {\n  convolution_param { num_output: "ten" }\n}\n', 2, 35, "Couldn't parse integer: \"ten\"",
            id="string-for-number",
        ),
        pytest.param(
            "layer {\n  convolution_param { num_output: 1.5 }\n}\n", 2, 35, "Couldn't parse integer: 1.5",
            id="float-for-int",
        ),
        pytest.param(
            "layer {\n  convolution_param { num_output: -1 }\n}\n", 2, 35, "Value out of range: -1", id="negative-uint"
        ),
        pytest.param(
            "layer { convolution_param { num_output: 4294967296 } }", 1, 41, "Value out of range: 4294967296",
            id="uint32-overflow",
        ),
        pytest.param('layer {\n  convolution_param: "x"\n}\n', 2, 22, 'Expected "{".', id="string-for-message"),
        pytest.param('layer { loss_weight: "one" }', 1, 22, "Couldn't parse float", id="string-for-float"),
        pytest.param('layer {\n  name: "a\n}\n', 2, 9, "String missing ending quote", id="unterminated-string"),
        pytest.param('name: "a"\nname: "b"\n', 2, 7, 'should not have multiple "name" fields', id="repeated-scalar"),
        pytest.param(
            "layer { relu_param { } relu_param { } }", 1, 35, 'should not have multiple "relu_param" fields',
            id="repeated-message",
        ),
        pytest.param("layer { [caffe.x] { } }", 1, 16, "does not have extensions", id="extension"),
        pytest.param('\tlayer {\n\t\tfoo: 1\n\t}\n', 2, 3, 'no field named "foo"', id="tabs-count-one-column"),
        pytest.param('layer {\n  name: "é" typo: 1\n}\n', 2, 13, 'no field named "typo"', id="columns-in-characters"),
        pytest.param('name: "a"\r\nlayer {\r\n foo: 1 }', 3, 2, 'no field named "foo"', id="crlf"),
        pytest.param('name: "x"\nlayer { name: "a\\q" }', 2, 17, "invalid escape sequence '\\\\q'", id="bad-escape"),
    ],
)
def test_syntax_errors_carry_line_and_column(text: str, line: int, column: int, message: str) -> None:
    with pytest.raises(PrototxtSyntaxError) as raised:
        parse_net(text, "train_val.prototxt")
    error = raised.value
    assert (error.line, error.column) == (line, column)
    assert message in error.message
    assert str(error) == f"train_val.prototxt:{line}:{column}: {error.message}"
    assert not error.message.startswith("'"), "the quoted source line is dropped: the location says where"


def test_syntax_error_as_json() -> None:
    with pytest.raises(PrototxtSyntaxError) as raised:
        parse_net("layer {\n  typo: 1\n}\n", "n.prototxt")
    assert raised.value.to_dict() == {
        "message": 'n.prototxt:2:3: Message type "caffe.LayerParameter" has no field named "typo".',
        "detail": 'Message type "caffe.LayerParameter" has no field named "typo".',
        "source": "n.prototxt",
        "line": 2,
        "column": 3,
        "layer": None,
        "layer_type": None,
        "field": None,
    }


def test_solver_syntax_errors_name_the_solver() -> None:
    with pytest.raises(PrototxtSyntaxError) as raised:
        parse_solver('base_lr: 0.01\nlr_policy: fixed\n', "solver.prototxt")
    assert str(raised.value).startswith("solver.prototxt:2:")
    with pytest.raises(PrototxtSyntaxError, match=r"^solver.prototxt:2:6: .*no field named \"momentun\""):
        parse_solver('net: "x"\n  \t  momentun: 0.9\n', "solver.prototxt")


@pytest.mark.parametrize(
    "text",
    [
        "layer { input_param { shape { dim: " + "9" * 100_000 + " } } }",
        "layer { " + "a" * 100_000 + ": 1 }",
        "layer { loss_weight: " + "-" * 100_000 + "1 }",
        'name: "' + "x" * 100_000,
    ],
    ids=["long-number", "long-field-name", "long-sign-run", "long-unterminated-string"],
)
def test_huge_tokens_give_short_messages_quickly(text: str) -> None:
    started = time.monotonic()
    with pytest.raises(PrototxtSyntaxError) as raised:
        parse_net(text)
    assert time.monotonic() - started < 5
    assert len(raised.value.message) <= MAX_DETAIL
    assert raised.value.line == 1


# ------------------------------------------------------------------------------------------ hostile input


def test_nul_character_is_refused_with_its_position() -> None:
    with pytest.raises(PrototxtSyntaxError) as raised:
        parse_net('name: "a"\nlayer {\x00}', "n.prototxt")
    assert str(raised.value) == "n.prototxt:2:8: contains a NUL character"
    with pytest.raises(PrototxtSyntaxError, match="NUL"):
        parse_net(b"name: \"a\x00\"")


def test_non_utf8_bytes_are_refused_with_their_position() -> None:
    with pytest.raises(PrototxtSyntaxError) as raised:
        parse_net(b'name: "a"\nlayer { name: "caf\xe9" }', "n.prototxt")
    error = raised.value
    assert (error.line, error.column) == (2, 19)
    assert "is not UTF-8 text (byte 0xe9 at offset 28)" in str(error)


def test_utf8_bytes_are_accepted() -> None:
    assert parse_net('name: "café"'.encode()).name == "café"
    assert parse_net(bytearray(b'name: "x"')).name == "x"  # type: ignore[arg-type]


def test_a_byte_order_mark_is_refused_clearly() -> None:
    with pytest.raises(PrototxtSyntaxError, match=r"^n.prototxt:1:1: starts with a byte-order mark"):
        parse_net('\ufeffname: "x"', "n.prototxt")
    with pytest.raises(PrototxtSyntaxError, match="byte-order mark"):
        parse_net(b'\xef\xbb\xbfname: "x"')


def test_unicode_whitespace_outside_strings_is_refused_like_caffe() -> None:
    with pytest.raises(PrototxtSyntaxError) as raised:
        parse_net(f'name: "x"\nlayer\u00a0{{ {RELU} }}', "n.prototxt")
    assert str(raised.value).startswith("n.prototxt:2:6: contains the character U+00A0 (no-break space)")
    # Inside strings and comments it is just text.
    assert parse_net('name: "a\u00a0b" # \u3000\n').name == "a\u00a0b"


@pytest.mark.parametrize("text", [5, None, ["layer {}"]])
def test_non_text_is_a_net_error(text: object) -> None:
    with pytest.raises(NetError, match="must be text"):
        parse_net(text)  # type: ignore[arg-type]


def test_oversized_text_is_refused_before_parsing() -> None:
    limits = ParseLimits(max_bytes=1000)
    assert parse_net("#" * 1000, limits=limits).name == ""
    with pytest.raises(NetError) as raised:
        parse_net("#" * 1001, "big.prototxt", limits=limits)
    assert str(raised.value) == "big.prototxt: is 1001 characters; the limit is 1000"
    with pytest.raises(NetError, match="is 1001 bytes; the limit is 1000"):
        parse_net(b"#" * 1001, limits=limits)
    with pytest.raises(NetError, match="the limit is 1000"):
        parse_solver("#" * 1001, limits=limits)


def test_the_default_size_limit_bounds_the_parse_time() -> None:
    zoo_text = (ZOO / "caffe_googlenet" / "train_val.prototxt").read_text() if ZOO.is_dir() else None
    layer = f"layer {{ {RELU} }}\n"
    text = layer * ((DEFAULT_LIMITS.max_bytes - 1) // len(layer))
    started = time.monotonic()
    with pytest.raises(NetError):
        parse_net(text + "x" * (DEFAULT_LIMITS.max_bytes - len(text) + 1))  # over by one character
    with pytest.raises(NetError, match="more than 5000 layers"):
        parse_net(text)  # within the size, over the layer count
    assert time.monotonic() - started < 5
    if zoo_text is not None:
        assert len(zoo_text) < DEFAULT_LIMITS.max_bytes // 50


def test_too_many_layers_is_refused_before_parsing_naming_the_first_extra_layer() -> None:
    limits = ParseLimits(max_layers=3)
    assert len(parse_net("layer {}\n" * 3, limits=limits).layer) == 3
    with pytest.raises(NetError) as raised:
        parse_net("layer {}\n" * 4 + "this is not even parsed {", "n.prototxt", limits=limits)
    assert str(raised.value) == "n.prototxt:4: has more than 3 layers (the limit); layer 4 starts here"
    # V1 layers count the same; 600 000 empty layers are refused at once.
    with pytest.raises(NetError, match="more than 3 layers"):
        parse_net("layers {}\n" * 4, limits=limits)
    started = time.monotonic()
    with pytest.raises(NetError, match="more than 5000 layers"):
        parse_net("layer{}" * 590_000)
    assert time.monotonic() - started < 2


def test_an_upgrade_that_adds_an_input_layer_is_counted() -> None:
    text = 'input: "data"\ninput_dim: 1\ninput_dim: 1\ninput_dim: 1\ninput_dim: 1\n' + "layer {}\n" * 3
    with pytest.raises(NetError, match="has 4 layers; the limit is 3"):
        parse_net(text, limits=ParseLimits(max_layers=3))


def test_solver_inline_nets_are_limited_one_by_one() -> None:
    limits = ParseLimits(max_layers=3)
    three = "layer {}\n" * 3
    solver = f"net_param {{ {three} }}\ntest_net_param {{ {three} }}\ntest_net_param {{ {three} }}\n"
    assert len(parse_solver(solver, limits=limits).test_net_param) == 2
    with pytest.raises(NetError) as raised:
        parse_solver(f"train_net_param {{\n{three}layer {{}}\n}}\n", "s.prototxt", limits=limits)
    assert (raised.value.source, raised.value.line) == ("s.prototxt", 5)


def test_error_messages_survive_odd_locations() -> None:
    """str() of an error must never raise, whatever a caller put in its location fields."""
    error = NetError("bad", source=5, line=3, column=None, layer=7, field=0)  # type: ignore[arg-type]
    assert str(error) == "5:3: layer 7: bad"
    assert str(NetError("bad", line=3, column=4)) == "bad"  # no source: no location to show
    assert str(NetError("bad", layer="l", layer_type="Pooling", field="pooling_param.pad")) == (
        "layer 'l' (Pooling): pooling_param.pad: bad"
    )


def test_all_errors_are_the_projects_own() -> None:
    assert issubclass(PrototxtSyntaxError, NetError) and issubclass(NetError, MemPluginError)


# ------------------------------------------------------------------------------------------ Caffe's own parser

PARSER_CASES = {
    "plain": f"layer {{ {RELU} }}",
    "angle-brackets": f"layer < {RELU} >",
    "message-list": f'layer [ {{ {RELU} }}, {{ name: "r2" type: "ReLU" bottom: "data" top: "r2" }} ]',
    "colon-before-brace": f"layer: {{ {RELU} }}",
    "single-quotes": "layer { name: 'r' type: 'ReLU' bottom: 'data' top: 'r' }",
    "adjacent-strings": 'layer { name: "r" "x" type: "ReLU" bottom: "data" top: "r" }',
    "semicolons": 'layer { name: "r"; type: "ReLU"; bottom: "data"; top: "r"; };',
    "scalar-list": 'layer { name: "r" type: "ReLU" bottom: ["data"] top: ["r"] }',
    "inf-nan": f"layer {{ {RELU} loss_weight: -inf }}",
    "float-suffix-f": f"layer {{ {RELU} loss_weight: 1.5f }}",
    "float-1e400": f"layer {{ {RELU} loss_weight: 1e400 }}",
    "leading-dot": f"layer {{ {RELU} loss_weight: .5 }}",
    "bool-True": f"layer {{ {RELU} propagate_down: True }}",
    "bool-2": f"layer {{ {RELU} propagate_down: 2 }}",
    "enum-number": f"layer {{ {RELU} relu_param {{ engine: 1 }} }}",
    "enum-bad-number": f"layer {{ {RELU} relu_param {{ engine: 7 }} }}",
    "enum-lowercase": f"layer {{ {RELU} relu_param {{ engine: caffe }} }}",
    "unknown-escape": 'layer { name: "\\q" type: "ReLU" bottom: "data" top: "r" }',
    "escapes": 'layer { name: "\\x72\\162\\u0072" type: "ReLU" bottom: "data" top: "r" }',
    "utf8-literal": 'layer { name: "é" type: "ReLU" bottom: "data" top: "r" }',
    "comment-braces": f"# }} {{ layer {{\nlayer {{ {RELU} }} # {{",
    "repeated-scalar": f'layer {{ {RELU} name: "x" }}',
    "repeated-message": f"layer {{ {RELU} relu_param {{ }} relu_param {{ }} }}",
    "unknown-field": f"layer {{ {RELU} nope: 1 }}",
    "extension": f"layer {{ {RELU} [caffe.x]: 1 }}",
    "trailing-brace": f"layer {{ {RELU} }} }}",
    "missing-brace": f"layer {{ {RELU} ",
    "uint-negative": f'layer {{ {RELU} }} layer {{ name: "c" type: "Concat" concat_param {{ concat_dim: -1 }} }}',
    "int32-overflow": f'layer {{ {RELU} }} layer {{ name: "c" type: "Concat" concat_param {{ axis: 2147483648 }} }}',
    "int64-overflow": 'layer { name: "i" type: "Input" top: "d" input_param { shape { dim: 9223372036854775808 } } }',
    "float-for-int": f'layer {{ {RELU} }} layer {{ name: "c" type: "Concat" concat_param {{ axis: 1.0 }} }}',
    "no-colon-scalar": 'layer { name "r" type: "ReLU" bottom: "data" top: "r" }',
    "field-number": f"layer {{ {RELU} 1: 2 }}",
    "tab-cr-vt-ff": f"layer\t{{\r{RELU}\v}}\f",
    "no-break-space": f"layer\u00a0{{ {RELU} }}",
    "slash-comment": f"// c\nlayer {{ {RELU} }}",
    "empty": "",
}
KNOWN_PARSER_DIFFERENCES = {
    # Python's text_format accepts it, Caffe's C++ parser refuses it. DIGITS re-serialises nets with Python's
    # text_format before Caffe reads them, which normalises it away.
    "plus-sign": (f"layer {{ {RELU} loss_weight: +5 }}", "python-only"),
    # Caffe's parser accepts these, Python's refuses them (a false alarm, never a wrong estimate).
    "bool-hex": (f"layer {{ {RELU} propagate_down: 0x0 }}", "caffe-only"),
    "float-suffix-F": (f"layer {{ {RELU} loss_weight: 1.5F }}", "caffe-only"),
    "question-escape": ('layer { name: "r\\?" type: "ReLU" bottom: "data" top: "r" }', "caffe-only"),
    "non-ascii-unicode-escape": ('layer { name: "\\u00e9" type: "ReLU" bottom: "data" top: "r" }', "caffe-only"),
}


def _accepts(text: str) -> bool:
    try:
        parse_net(text)
    except PrototxtSyntaxError:
        return False
    return True


@pytest.fixture(scope="module")
def caffe_accepts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bool]:
    """Whether Caffe's ReadProtoFromTextFile parses each case (a later CHECK about shapes does not count)."""
    folder = tmp_path_factory.mktemp("parser")
    cases = {**PARSER_CASES, **{name: text for name, (text, _) in KNOWN_PARSER_DIFFERENCES.items()}}
    jobs = []
    for index, text in enumerate(cases.values()):
        (folder / f"case{index}.prototxt").write_text(INPUT + text)
        jobs.append({"kind": "net", "path": f"case{index}.prototxt", "phase": "TEST", "level": 0, "stages": []})
    results = run_pycaffe(jobs, folder)
    return {
        name: "Failed to parse NetParameter" not in result.get("fatal", "")
        for name, result in zip(cases, results)
    }


@pytest.mark.parametrize("name", PARSER_CASES)
def test_we_parse_what_caffe_parses(caffe_accepts: dict[str, bool], name: str) -> None:
    assert _accepts(INPUT + PARSER_CASES[name]) == caffe_accepts[name]


@pytest.mark.parametrize("name", KNOWN_PARSER_DIFFERENCES)
def test_known_parser_differences_are_still_what_they_were(caffe_accepts: dict[str, bool], name: str) -> None:
    text, which = KNOWN_PARSER_DIFFERENCES[name]
    assert (_accepts(INPUT + text), caffe_accepts[name]) == ((True, False) if which == "python-only" else (False, True))


# ------------------------------------------------------------------------------------------ the source map


@pytest.mark.parametrize(
    ("text", "lines"),
    [
        ("layer {}\nlayer{}\n\nlayer:{}", [1, 2, 4]),
        ('# layer { not a layer }\nlayer { name: "a}{" }\nlayer { name: "\\"}" }\n', [2, 3]),
        ("layer { name: 'it''s }' }\nlayer {}", [1, 2]),
        ("layer\n#comment {\n{ }\nlayer {}", [1, 4]),
        ("layer <\n>\nlayer { }", [1, 3]),
        ("layer [\n { },\n { }\n]\nlayer {}", [2, 3, 5]),
        ("layer: [ { bottom: ['a', 'b'] } ]\nlayers {}", [1, 2]),
        ('layer { convolution_param { weight_filler { type: "x" } } include { phase: TRAIN } }\nlayer {}', [1, 2]),
        ("layers { layer { } }\n", [1]),  # a V0 inner `layer` is not a layer of the net
        ('name: "layer"\nlayer_name: 1\nlayer {}', [3]),
        ('state { stage: "layer" }\nlayer {}', [2]),
        ("", []),
    ],
)
def test_layer_lines_on_tricky_text(text: str, lines: list[int]) -> None:
    assert layer_lines(text) == lines


def test_layer_lines_put_the_upgraded_input_layer_first() -> None:
    text = 'name: "n"\ninput: "data"\ninput_shape { dim: 1 dim: 2 }\nlayer {}\nlayer {}\n'
    assert layer_lines(text) == [2, 4, 5]
    assert layer_lines('input: "data"\nlayer {}\n') == [2]  # no shape: Caffe drops the input, adds no layer
    assert layer_lines(text.encode()) == [2, 4, 5]


def test_errors_in_a_net_with_input_fields_name_the_right_line() -> None:
    text = (
        'name: "n"\ninput: "data"\ninput_dim: 1\ninput_dim: 3\ninput_dim: 4\ninput_dim: 4\n'
        'layer { name: "ok" type: "ReLU" bottom: "data" top: "ok" }\n'
        'layer { name: "conv" type: "Convolution" bottom: "ok" top: "conv"\n'
        "        convolution_param { num_output: 2 kernel_size: 5 } }\n"
    )
    with pytest.raises(ShapeError) as raised:
        build_net(parse_net(text), PHASE_TEST, source="deploy.prototxt", lines=layer_lines(text))
    assert (raised.value.layer, raised.value.line) == ("conv", 8)


def test_count_layer_blocks() -> None:
    assert count_layer_blocks("layer {} layer {} layer {}", 10) == (3, None)
    assert count_layer_blocks("layer {}\nlayer {}\nlayer {}", 2) == (2, 2)
    solver = "net_param {\nlayer {}\nlayer {} }\ntest_net_param { layer {} }"
    assert count_layer_blocks(solver, 10, nested=True) == (2, None)
    assert count_layer_blocks(solver, 2, nested=True) == (2, 3)
    assert count_layer_blocks(solver, 10) == (0, None)


# The scanner as it was first written, one token at a time (every name, every newline): slow but plain, kept as
# the reference the faster scanner must agree with.
_REFERENCE_TOKEN = re.compile(r'#[^\n]*|"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|[{}<>\[\]]|\n|[A-Za-z_][A-Za-z0-9_]*')


def _reference_blocks(text: str) -> list[tuple[int, int, int]]:
    depth, line, outer, pending, in_list, list_depth, found = 0, 1, -1, None, False, -1, []
    for match in _REFERENCE_TOKEN.finditer(text):
        token = match.group()
        if token == "\n":
            line += 1
        elif token in "{<":
            if pending is not None:
                found.append((depth, outer, pending))
            elif in_list and depth == list_depth:
                found.append((depth, outer, line))
            outer += depth == 0
            pending, depth = None, depth + 1
        elif token in "}>":
            depth, pending = max(depth - 1, 0), None
        elif token == "[":
            if pending is not None:
                in_list, list_depth = True, depth
            pending = None
        elif token == "]":
            in_list = in_list and depth != list_depth
            pending = None
        elif token[0] not in "#\"'":
            pending = line if token in ("layer", "layers") else None
    return found


def _reference_lines(text: str) -> list[int | None]:
    lines: list[int | None] = [line for depth, _, line in _reference_blocks(text) if depth == 0]
    depth, line, first_input, has_shape = 0, 1, None, False
    for match in _REFERENCE_TOKEN.finditer(text):
        token = match.group()
        if token == "\n":
            line += 1
        elif token in "{<":
            depth += 1
        elif token in "}>":
            depth = max(depth - 1, 0)
        elif depth == 0 and token == "input" and first_input is None:
            first_input = line
        elif depth == 0 and token in ("input_shape", "input_dim"):
            has_shape = True
    if first_input is not None and has_shape:
        lines.insert(0, first_input)
    return lines


# Pieces of text, joined by a space or a newline: brackets, the names the scanner looks for, names that merely
# contain them, strings and comments that hide brackets and names. Texts with a name between `layer` and its
# brace are skipped: that is a syntax error, which the reference drops and the faster scanner still counts.
_PIECES = st.sampled_from([
    "layer", "layers", "input", "input_shape", "input_dim", "{", "}", "<", ">", "[", "]", ":", ",", "7",
    '"a { layer"', "'b } [ layers'", '"esc \\" } "', "# layer { input_dim\n", "mylayer_x", "layer_param2",
    'name: "x"',
])


def _name_follows_layer(text: str) -> bool:
    """Whether some `layer` is followed by another name before any bracket (outside strings and comments)."""
    tokens = [t for t in _REFERENCE_TOKEN.findall(text) if t != "\n" and t[0] not in "#\"'"]
    return any(
        a in ("layer", "layers") and b[0].isalpha() and b not in ("layer", "layers") for a, b in itertools.pairwise(tokens)
    )


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_PIECES, st.sampled_from([" ", "\n"])), max_size=60))
def test_block_scanner_agrees_with_the_token_by_token_reference(pieces: list[tuple[str, str]]) -> None:
    text = "".join(piece + sep for piece, sep in pieces)
    if _name_follows_layer(text):
        return  # not a block either scanner must agree on (see _PIECES)
    assert layer_lines(text) == _reference_lines(text)
    hidden = [m for m in _REFERENCE_TOKEN.finditer(text) if m.group()[0] in "#\"'"]
    starts = [0, *(m.end() for m in hidden)]
    assert list(code_spans_outside_strings(text)) == list(zip(starts, [m.start() for m in hidden] + [len(text)]))
    assert list(string_spans(text)) == [m.span() for m in hidden if m.group()[0] != "#"]
    blocks = sum(1 for depth, _, _ in _reference_blocks(text) if depth == 0)
    assert count_layer_blocks(text, 10**6) == (blocks, None)


def test_code_spans_skip_strings_and_comments() -> None:
    text = 'a "b" c # d\ne'
    assert [text[s:e] for s, e in code_spans_outside_strings(text)] == ["a ", " c ", "\ne"]


ZOO_NETS = sorted(p for p in ZOO.glob("*/*.prototxt") if "solver" not in p.name) if ZOO.is_dir() else []


@pytest.mark.skipif(not ZOO_NETS, reason="the zoo is not available")
@pytest.mark.parametrize("path", ZOO_NETS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_layer_lines_match_every_zoo_net(path: Path) -> None:
    text = path.read_text()
    try:
        net = parse_net(text, path.name)
    except NetError:
        pytest.skip("a net for another Caffe fork")
    lines = layer_lines(text)
    source = text.split("\n")
    assert len(lines) == len(net.layer)
    for line, layer in zip(lines, net.layer):
        assert line is not None
        first = source[line - 1]
        assert ("input" if layer.type == "Input" and "layer" not in first else "layer") in first
        # The block that starts there names this layer within its first lines.
        block = "\n".join(source[line - 1 : line + 3])
        assert layer.type == "Input" or f'"{layer.name}"' in block or f"'{layer.name}'" in block
