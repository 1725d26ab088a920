"""A training job's nets as Caffe's Solver sets them up: the train net and each test net, with their states.

Solver::InitTrainNet and Solver::InitTestNets in Python. The caller hands over texts; where the solver names
other files (`test_net: "..."`), a `load` callback reads them, so that the caller decides what may be read.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from .cost import Meter
from .errors import NetError
from .fields import is_whole
from .flavour import caffes_that_build, definition_flavour
from .layers.base import PHASE_TEST, PHASE_TRAIN
from .memory import MemoryOptions, MemoryReport, job_memory
from .net import Net, PreparedNet, ShapeOracle, build_net, prepare_net
from .proto import caffe_pb2
from .prototxt import DEFAULT_LIMITS, ParseLimits, parse_net, parse_solver
from .sourcemap import layer_lines

DIGITS_STAGES = {"train", "val", "deploy"}
UINT32_MAX = 2**32 - 1

Loader = Callable[[str], tuple[str, str]]
"""Reads a file a solver names: path -> (text, source name for messages). Raises NetError when not allowed."""


@dataclasses.dataclass
class NetDefinition:
    param: Any  # caffe_pb2.NetParameter
    source: str
    lines: list[int | None]
    state: Any | None = None  # the solver's train_state / test_state for this net
    _prepared: dict[str, PreparedNet] = dataclasses.field(default_factory=dict, init=False, repr=False, compare=False)

    def prepare(self, phase: str) -> PreparedNet:
        """The net filtered and split for `phase`, computed once: a planner's search builds it at many batches."""
        if phase not in self._prepared:
            self._prepared[phase] = prepare_net(
                self.param, phase, source=self.source, lines=self.lines, state=self.state
            )
        return self._prepared[phase]

    def forget_prepared(self) -> None:
        """Call after changing `param` in place."""
        self._prepared.clear()


@dataclasses.dataclass
class TrainingDefinition:
    """What a solver trains: one train net, its test nets (run at start unless test_initialization is off)."""

    train: NetDefinition
    tests: list[NetDefinition]
    solver_type: str = "SGD"
    l1_regularization: bool = False
    test_iters: list[int] = dataclasses.field(default_factory=list)
    assumptions: list[str] = dataclasses.field(default_factory=list)
    solver: Any | None = None
    memo: dict[Any, Any] = dataclasses.field(default_factory=dict, repr=False, compare=False)
    """Results callers may keep about these nets (the estimator's totals per batch); cleared when they change."""

    @property
    def flavour(self) -> str:
        """The Caffe that builds it (core/flavour.py): "nvcaffe" when the solver or a net needed NVcaffe's schema,
        "ssd" when a net uses SSD's layers, else "bvlc"."""
        return definition_flavour(self._messages())

    @property
    def builders(self) -> frozenset[str]:
        """The Caffes (flavour.FLAVOURS) that can build the solver and every net: who may train it."""
        return caffes_that_build(self._messages())

    def _messages(self) -> list[Any]:
        return [self.train.param, *(test.param for test in self.tests), self.solver]

    def build(
        self,
        batch: int | None = None,
        test_batch: int | None = None,
        data_shapes: Mapping[str, Any] | None = None,
        oracle: ShapeOracle | None = None,
        tests: list[Net] | None = None,
        *,
        meter: Meter | None = None,
    ) -> tuple[Net, list[Net]]:
        """Build the nets; `batch` replaces the TRAIN data layers' batch size, `test_batch` the TEST ones'.
        `tests`, built before with the same test_batch, data shapes and oracle, are used as they are: the train
        batch does not change them. `meter` counts (and may stop) the builds (core/cost.py)."""
        train = build_net(
            self.train.param, PHASE_TRAIN, data_shapes=data_shapes, batch_override=batch, oracle=oracle,
            prepared=self.train.prepare(PHASE_TRAIN), meter=meter,
        )
        if tests is None:
            tests = [
                build_net(
                    test.param, PHASE_TEST, data_shapes=data_shapes, batch_override=test_batch, oracle=oracle,
                    prepared=test.prepare(PHASE_TEST), meter=meter,
                )
                for test in self.tests
            ]
        return train, tests

    def memory(
        self,
        options: MemoryOptions,
        batch: int | None = None,
        test_batch: int | None = None,
        data_shapes: Mapping[str, Any] | None = None,
        oracle: ShapeOracle | None = None,
        tests: list[Net] | None = None,
        *,
        meter: Meter | None = None,
    ) -> tuple[MemoryReport, Net, list[Net]]:
        train, tests = self.build(batch, test_batch, data_shapes, oracle, tests, meter=meter)
        report = job_memory(train, tests, options)
        report.assumptions[:0] = self.assumptions
        return report, train, tests


def _net_definition(text: str, source: str, limits: ParseLimits, state: Any | None = None) -> NetDefinition:
    return NetDefinition(parse_net(text, source, limits), source, layer_lines(text), state)


def fill_num_classes(definition: TrainingDefinition, classes: int) -> None:
    """What DIGITS does before training a standard network: InnerProduct layers that leave num_output unset
    (the classifier) get the dataset's number of classes."""
    if not is_whole(classes) or not 0 < classes <= UINT32_MAX:
        raise NetError(f"the number of classes must be an integer from 1 to {UINT32_MAX}, got {classes!r}",
                       field="classes")
    filled = False
    for net in (definition.train, *definition.tests):
        for layer in net.param.layer:
            if layer.type == "InnerProduct" and not layer.inner_product_param.HasField("num_output"):
                layer.inner_product_param.num_output = classes
                filled = True
    for net in (definition.train, *definition.tests):
        net.forget_prepared()
    definition.memo.clear()
    if filled:
        definition.assumptions.append(f"InnerProduct layers without num_output get the {classes} classes (as DIGITS does)")


def _inline(param: Any, source: str, field: str, state: Any | None = None) -> NetDefinition:
    return NetDefinition(param, f"{source} ({field})", [], state)


def training_definition(
    net_text: str | None = None,
    solver_text: str | None = None,
    *,
    net_source: str = "net.prototxt",
    solver_source: str = "solver.prototxt",
    load: Loader | None = None,
    limits: ParseLimits = DEFAULT_LIMITS,
) -> TrainingDefinition:
    """Work out the nets of a training job from a net text, a solver text, or both.

    With both, the given net is the solver's train net (and the generic test net), whatever the solver's `net`
    field says: the caller has already picked the file. With a net alone, Caffe's default solver is assumed (SGD)
    with one test net when the net has TEST-phase layers, as DIGITS sets up with a validation set.
    """
    if net_text is None and solver_text is None:
        raise NetError("give a net definition, a solver, or both")
    if solver_text is None:
        assert net_text is not None
        return _without_solver(_net_definition(net_text, net_source, limits))
    solver = parse_solver(solver_text, solver_source, limits)
    files = _SolverFiles(load, solver_source, limits)
    given = _net_definition(net_text, net_source, limits) if net_text is not None else None
    train, generic = _train_net(solver, given, files)
    tests = _test_nets(solver, generic, files)
    _check_solver(solver, tests, solver_source)
    assumptions = []
    if tests and not solver.test_initialization:
        assumptions.append("test_initialization is off: the first test pass comes after test_interval iterations")
    return TrainingDefinition(
        train,
        tests,
        solver_type=solver.type or "SGD",
        l1_regularization=solver.regularization_type == "L1",
        test_iters=list(solver.test_iter),
        assumptions=assumptions,
        solver=solver,
    )


def _without_solver(train: NetDefinition) -> TrainingDefinition:
    """A net given alone: Caffe's default solver (SGD); DIGITS' stages when the net uses them; one test net when it
    has TEST-phase layers (or DIGITS' "val" stage), passed once at the start as test_initialization does."""
    rules = [rule for layer in train.param.layer for rule in (*layer.include, *layer.exclude)]
    stages = {stage for rule in rules for stage in (*rule.stage, *rule.not_stage)}
    assumptions = ["no solver given: SGD"]
    test_state = None
    if DIGITS_STAGES & stages:
        # A DIGITS standard network: DIGITS' solver trains with stage "train" and validates with stage "val".
        train.state = caffe_pb2.NetState(stage=["train"])
        test_state = caffe_pb2.NetState(stage=["val"])
        assumptions.append('DIGITS stages: the train net has stage "train", the test net stage "val"')
    has_test = test_state is not None or any(
        rule.HasField("phase") and rule.phase == caffe_pb2.TEST for rule in rules
    )
    # The test net is the same definition under another state: parsed once, shared (build_net never mutates it).
    tests = [dataclasses.replace(train, state=test_state)] if has_test else []
    if tests:
        assumptions.append("one test pass at the start of training (Caffe's test_initialization)")
    return TrainingDefinition(train, tests, test_iters=[1] * len(tests), assumptions=assumptions)


@dataclasses.dataclass(frozen=True)
class _SolverFiles:
    """The net files a solver names (`net`, `train_net`, `test_net`), read through the caller's loader."""

    load: Loader | None
    solver_source: str
    limits: ParseLimits

    def read(self, path: str, field: str) -> NetDefinition:
        if self.load is None:
            raise NetError(
                f"the solver names the file {path!r}; give its text instead (net_param / test_net_param)",
                source=self.solver_source,
                field=field,
            )
        try:
            text, source = self.load(path)
        except NetError as error:
            # The loader knows the file; the user knows the solver line that named it.
            raise NetError(f"{field}: {error}", source=self.solver_source, field=field) from None
        return _net_definition(text, source, self.limits)


def _train_net(solver: Any, given: NetDefinition | None,
               files: _SolverFiles) -> tuple[NetDefinition, NetDefinition | None]:
    """Solver::InitTrainNet: exactly one of net, net_param, train_net, train_net_param (a given net wins). The train
    net, in the solver's train_state, and the generic net the test nets are instances of (None when the train net
    is a separate train_net)."""
    source = files.solver_source
    fields = [f for f in ("net", "net_param", "train_net", "train_net_param") if solver.HasField(f)]
    generic: NetDefinition | None = None
    if given is not None:
        train = given
        separate_train_net = solver.HasField("train_net") or solver.HasField("train_net_param")
        generic = None if separate_train_net else dataclasses.replace(train)
    else:
        if len(fields) != 1:
            raise NetError(
                "a solver must name its train net with exactly one of net, net_param, train_net, train_net_param"
                + (f" (it sets {', '.join(fields)})" if fields else ""),
                source=source,
            )
        field = fields[0]
        if field == "net":
            train = files.read(solver.net, "net")
            generic = dataclasses.replace(train)
        elif field == "net_param":
            train = _inline(solver.net_param, source, "net_param")
            generic = dataclasses.replace(train)
        elif field == "train_net":
            train = files.read(solver.train_net, "train_net")
        else:
            train = _inline(solver.train_net_param, source, "train_net_param")
    train.state = solver.train_state
    return train, generic


def _test_nets(solver: Any, generic: NetDefinition | None, files: _SolverFiles) -> list[NetDefinition]:
    """Solver::InitTestNets: explicit test nets first, then as many generic instances as test_iter has left; each
    in its test_state."""
    source = files.solver_source
    explicit = [_inline(param, source, f"test_net_param #{i}") for i, param in enumerate(solver.test_net_param)]
    explicit += [files.read(path, "test_net") for path in solver.test_net]
    if generic is not None:
        if len(solver.test_iter) < len(explicit):
            raise NetError("test_iter must be given for each test net", source=source, field="test_iter")
        instances = len(solver.test_iter) - len(explicit)
        tests = explicit + [dataclasses.replace(generic) for _ in range(instances)]
    else:
        if len(solver.test_iter) != len(explicit):
            raise NetError(
                f"test_iter must be given once per test net ({len(explicit)}), got {len(solver.test_iter)}",
                source=source,
                field="test_iter",
            )
        tests = explicit
    if len(solver.test_state) and len(solver.test_state) != len(tests):
        raise NetError(
            f"test_state must be unspecified or given once per test net ({len(tests)})",
            source=source,
            field="test_state",
        )
    for index, test in enumerate(tests):
        test.state = solver.test_state[index] if len(solver.test_state) else None
    return tests


def _check_solver(solver: Any, tests: list[NetDefinition], source: str) -> None:
    """What Caffe's solvers CHECK at construction and this module has not yet: a test interval for the test nets,
    no momentum where AdaGrad and RMSProp refuse it."""
    if tests and solver.test_interval <= 0:
        raise NetError("test_interval must be positive when there are test nets", source=source, field="test_interval")
    solver_type = solver.type or "SGD"
    if solver_type in ("AdaGrad", "RMSProp") and solver.momentum != 0:
        raise NetError(
            f"momentum cannot be used with {solver_type} (Caffe aborts on it); remove it or set it to 0",
            source=source,
            field="momentum",
        )


