"""The "New model" form: what a training job needs, asked the way DIGITS asks, validated by WTForms with CSRF.

The field names are also the keys of the form's JSON twin (``POST <prefix>/models.json``), so a script and the page
go through one validation. A valid form becomes a `ModelSpec`: the texts and settings the job manager will take.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from flask_wtf import FlaskForm
from flask_wtf.file import FileField
from google.protobuf import text_format
from werkzeug.datastructures import FileStorage, MultiDict
from wtforms import Field, FloatField, IntegerField, RadioField, SelectField, StringField, TextAreaField
from wtforms.fields.choices import SelectChoice
from wtforms.fields.core import UnboundField
from wtforms.validators import InputRequired, Length, NumberRange, Optional, ValidationError

from ...core.device_kinds import AUTO, CPU
from ...core.divergence import CONTINUE, DEFAULT_POLICY, STOP
from ...core.epochs import DEFAULT_EPOCHS, EVERY_EPOCH, ONE_PASS
from ...core.errors import FieldErrors
from ...core.estimate import EstimateRequest
from ...core.fields import INT32_MAX, is_whole, refuse
from ...core.inputs import ascii_int, not_text, shown, surrogate_in, type_name
from ...core.layers.base import INT_MAX
from ...core.planning.job_plan import PlanningPolicy
from ...core.proto import caffe_pb2
from ...core.sizes import MAX_SIZE_TEXT
from ...core.test_net_modes import SAME_DEVICE, TEST_NET_APART, TEST_NET_AUTO, TEST_NET_SHARED
from ...estimate.datasets import parse_shape
from ...jobs.definition.request import MAX_EPOCHS
from ...jobs.definition.request import memory_cap as job_memory_cap
from ...networks import STANDARD_NETWORKS, StandardNetwork, standard_network

SOLVER_TYPES = ("SGD", "Nesterov", "AdaGrad", "RMSProp", "AdaDelta", "Adam")
NO_MOMENTUM = frozenset({"AdaGrad", "RMSProp"})
"""Caffe's AdaGrad and RMSProp solvers abort when momentum is set, so it is left out of their solver."""
LR_POLICIES = ("fixed", "step", "exp", "inv", "multistep", "poly", "sigmoid")
NEEDS_GAMMA = frozenset({"step", "exp", "inv", "multistep", "sigmoid"})
NEEDS_POWER = frozenset({"inv", "poly"})
DEVICE_NEXT = "next"
TESTER_CHOICES = (
    (AUTO, "Auto"),
    (SAME_DEVICE, "The training device"),
    (CPU, "CPU"),
)
"""The tester device's choices every server has; each GPU comes after them."""
DATA_TOP = "data"
"""The top of the data layers that gets the dataset's item shape (DIGITS names it so in every standard network)."""


class WholeNumberField(IntegerField):  # type: ignore[misc]
    """An integer field that reads only the digits 0-9, at most 10 of them: WTForms' IntegerField reads "١٢٣" and
    "1_000", and NumberRange then fails with OverflowError on a number of 400 digits (it asks math.isnan)."""

    def process_formdata(self, valuelist: list[Any]) -> None:
        if not valuelist:
            return
        self.data = ascii_int(str(valuelist[0]), max_digits=10)
        if self.data is None:
            raise ValueError(self.gettext("Not a whole number written with the digits 0-9 (at most 10 of them)."))


class FiniteFloatField(FloatField):  # type: ignore[misc]
    """A float field that refuses what float() reads as infinite or not a number ("1e999", 400 digits, "nan"):
    a solver cannot use them, and NumberRange lets infinity through."""

    data: float | None

    def process_formdata(self, valuelist: list[Any]) -> None:
        super().process_formdata(valuelist)
        if self.data is not None and not math.isfinite(self.data):
            self.data = None
            raise ValueError(self.gettext("Not a finite number."))


class NamedChoiceField(SelectField):  # type: ignore[misc]
    """A select whose refusal names the values it takes, where WTForms says only "Not a valid choice.": a script
    posting the JSON twin learns what to send."""

    def pre_validate(self, form: Any) -> None:
        try:
            super().pre_validate(form)
        except ValidationError:
            taken = ", ".join(f'"{choice.value}"' for choice in self.choices
                              if not (choice.render_kw or {}).get("disabled"))
            raise ValidationError(f"{shown(str(self.data))!r} is not one of {taken}") from None


def _choices(*pairs: tuple[str, str] | str) -> list[SelectChoice]:
    """Options as WTForms 3.3 wants them declared: a value, or (value, label)."""
    return [SelectChoice(pair) if isinstance(pair, str) else SelectChoice(*pair) for pair in pairs]


class NewModelForm(FlaskForm):  # type: ignore[misc]
    """The fields of DIGITS' "New image classification model" page that matter for memory and for the job."""

    model_name = StringField("Model name", validators=[InputRequired(), Length(max=200)])

    network = RadioField(
        "Network", choices=_choices(("standard", "Standard network"), ("custom", "Custom network")), default="standard"
    )
    standard_network = RadioField(
        "Standard network", choices=_choices(*((n.key, n.title) for n in STANDARD_NETWORKS)),
        default=STANDARD_NETWORKS[0].key,
    )
    custom_network = TextAreaField("Custom network (prototxt)", validators=[Length(max=4 * 1024 * 1024)])
    custom_network_file = FileField("Or upload a prototxt file")

    solver = RadioField(
        "Solver", choices=_choices(("settings", "Solver settings"), ("file", "Solver file")), default="settings"
    )
    solver_type = SelectField("Solver type", choices=_choices(*SOLVER_TYPES), default="SGD")
    base_lr = FiniteFloatField("Base learning rate", default=0.01, validators=[Optional(), NumberRange(min=0)])
    lr_policy = SelectField("Learning rate policy", choices=_choices(*LR_POLICIES), default="step")
    gamma = FiniteFloatField("Gamma", default=0.1, validators=[Optional(), NumberRange(min=0)])
    power = FiniteFloatField("Power (inv, poly)", default=0.75, validators=[Optional(), NumberRange(min=0)])
    stepsize = WholeNumberField("Step size (step)", default=3000, validators=[Optional(), NumberRange(min=1, max=INT32_MAX)])
    stepvalues = StringField("Step values (multistep)", validators=[Optional(), Length(max=1000)])
    momentum = FiniteFloatField("Momentum", default=0.9, validators=[Optional(), NumberRange(min=0, max=1)])
    weight_decay = FiniteFloatField("Weight decay", default=0.0005, validators=[Optional(), NumberRange(min=0)])
    epochs = WholeNumberField(
        "Training epochs", default=DEFAULT_EPOCHS, validators=[Optional(), NumberRange(min=1, max=MAX_EPOCHS)]
    )
    max_iter = WholeNumberField("Training iterations", validators=[Optional(), NumberRange(min=1, max=INT32_MAX)])
    test_interval = WholeNumberField("Validation interval", validators=[Optional(), NumberRange(min=1, max=INT32_MAX)])
    test_iter = WholeNumberField("Validation iterations", validators=[Optional(), NumberRange(min=1, max=INT32_MAX)])
    snapshot = WholeNumberField("Snapshot interval", default=5000, validators=[Optional(), NumberRange(min=0, max=INT32_MAX)])
    solver_text = TextAreaField("Solver (prototxt)", validators=[Length(max=1024 * 1024)])
    solver_file = FileField("Or upload a solver file")
    divergence = SelectField(
        "When the loss becomes NaN or infinite",
        choices=_choices((STOP, "Stop the job (try a lower learning rate)"), (CONTINUE, "Keep training")),
        default=DEFAULT_POLICY,
    )

    data_backend = SelectField(
        "Dataset format", choices=_choices(("lmdb", "LMDB folder"), ("hdf5", "HDF5 list file")), default="lmdb"
    )
    train_source = StringField("Training data", validators=[InputRequired(), Length(max=4096)])
    val_source = StringField("Validation data", validators=[Optional(), Length(max=4096)])
    item_shape = StringField("Item shape", validators=[Optional(), Length(max=100)])
    classes = WholeNumberField("Classes", validators=[Optional(), NumberRange(min=1, max=INT_MAX)])

    batch_size = StringField("Batch size", validators=[Optional(), Length(max=20)])
    device = SelectField("Device", choices=_choices((DEVICE_NEXT, "Next available")), default=DEVICE_NEXT)
    memory_cap = StringField("Memory cap (CPU jobs)", validators=[Optional(), Length(max=MAX_SIZE_TEXT)])
    """The most a CPU attempt may allocate ("2GiB"), as the REST API's `memory_cap` (jobs.definition.request.memory_cap)."""
    test_net = NamedChoiceField(
        "Test nets",
        choices=_choices(
            (TEST_NET_AUTO, "Auto: apart where it pays"),
            (TEST_NET_SHARED, "Shared, as Caffe does"),
            (TEST_NET_APART, "Apart, in a tester process"),
        ),
        default=TEST_NET_AUTO,
    )
    """Where the validation nets live (the job's `test_net`, core.test_net_modes)."""
    tester_device = NamedChoiceField(
        "Tester device",
        choices=_choices(*TESTER_CHOICES),
        default=AUTO,
    )
    """With the test nets apart, where the tester runs (the job's `tester_device`): the GPUs are added per page
    (model_page.py), as the device field's are."""

    def validate(self, extra_validators: Mapping[str, Any] | None = None) -> bool:
        """Field checks, then the rules between fields (a custom network needs a text, a step policy a step size)."""
        valid = bool(super().validate(extra_validators))
        checks = (self._check_network, self._check_solver, self._check_data, self._check_batch, self._check_memory_cap)
        for check in checks:
            valid = check() and valid
        return valid

    def _fail(self, field: Field, message: str) -> bool:
        field.errors = [*field.errors, message]
        return False

    def _check_network(self) -> bool:
        if self.network.data != "custom":
            return True
        if self.custom_network_file.data or (self.custom_network.data or "").strip():
            return True
        return self._fail(self.custom_network, "paste a network definition or upload a prototxt file")

    def _check_solver(self) -> bool:
        if self.solver.data == "file":
            if self.solver_file.data or (self.solver_text.data or "").strip():
                return True
            return self._fail(self.solver_text, "paste a solver definition or upload a solver file")
        valid = True
        required: list[Field] = [self.base_lr, self.snapshot, self.weight_decay]
        if self.max_iter.data is None and self.epochs.data is None and not (self.max_iter.errors or self.epochs.errors):
            valid = self._fail(self.epochs, "required (or give the training iterations)")
        if self.solver_type.data not in NO_MOMENTUM:
            required.append(self.momentum)
        if self.lr_policy.data in NEEDS_GAMMA:
            required.append(self.gamma)
        if self.lr_policy.data in NEEDS_POWER:
            required.append(self.power)
        if self.lr_policy.data == "step":
            required.append(self.stepsize)
        for field in required:
            if field.data is None and not field.errors:
                by_policy = field in (self.gamma, self.power, self.stepsize)
                valid = self._fail(field, f"required with the {self.lr_policy.data!r} policy" if by_policy else "required")
        if self.lr_policy.data == "multistep":
            try:
                steps = _step_values(self.stepvalues.data or "")
            except ValueError as error:
                valid = self._fail(self.stepvalues, str(error))
            else:
                if not steps:
                    valid = self._fail(self.stepvalues, "required with the 'multistep' policy")
        return valid

    def _check_data(self) -> bool:
        text = (self.item_shape.data or "").strip()
        if not text:
            return True
        try:
            parse_shape(text)
        except ValueError as error:
            return self._fail(self.item_shape, str(error))
        return True

    def _check_batch(self) -> bool:
        try:
            parse_batch(self.batch_size.data)
        except ValueError as error:
            return self._fail(self.batch_size, str(error))
        return True

    def _check_memory_cap(self) -> bool:
        try:
            parse_memory_cap(self.memory_cap.data)
        except ValueError as error:
            return self._fail(self.memory_cap, str(error))
        return True

    def to_spec(self) -> ModelSpec:
        """The validated form as a job's inputs; call after `validate()` returned True."""
        network: StandardNetwork | None = None
        if self.network.data == "custom":
            net_text, net_source = self._text_of(self.custom_network_file, self.custom_network, "network.prototxt")
        else:
            network = standard_network(self.standard_network.data)
            net_text, net_source = network.text, network.filename
        settings: dict[str, Any] | None = None
        if self.solver.data == "file":
            solver_text, solver_source = self._text_of(self.solver_file, self.solver_text, "solver.prototxt")
        else:
            settings = self._solver_settings()
            solver_text = solver_prototxt(settings, validation="test_iter" in settings)
            solver_source = "solver settings"
        shape = (self.item_shape.data or "").strip()
        # Left empty with a standard network: the dataset it was written for (the page shows it as a placeholder).
        item_shape = parse_shape(shape) if shape else (network.item_shape if network else None)
        classes = self.classes.data if self.classes.data is not None else (network.classes if network else None)
        return ModelSpec(
            name=self.model_name.data.strip(),
            network_key=network.key if network else None,
            net_text=net_text,
            net_source=net_source,
            solver_text=solver_text,
            solver_source=solver_source,
            solver_settings=settings,
            data_backend=self.data_backend.data,
            train_source=self.train_source.data.strip(),
            val_source=(self.val_source.data or "").strip() or None,
            item_shape=item_shape,
            classes=classes,
            batch=parse_batch(self.batch_size.data),
            device=self.device.data,
            divergence=self.divergence.data,
            memory_cap=parse_memory_cap(self.memory_cap.data),
            test_net=self.test_net.data,
            tester_device=self.tester_device.data,
            epochs=settings.get("epochs") if settings else None,
            test_interval=settings.get("test_interval") if settings else None,
            test_iter=settings.get("test_iter") if settings else None,
        )

    def _text_of(self, upload: FileField, pasted: TextAreaField, default_name: str) -> tuple[str, str]:
        """An uploaded file wins over pasted text (DIGITS' order); the source name labels error messages."""
        storage = upload.data
        if isinstance(storage, FileStorage) and storage.filename:
            raw = storage.read()
            try:
                return raw.decode("utf-8"), storage.filename
            except UnicodeDecodeError:
                raise FieldErrors.one(upload.name, f"{storage.filename} is not UTF-8 text") from None
        return pasted.data or "", default_name

    def _solver_settings(self) -> dict[str, Any]:
        settings: dict[str, Any] = {
            "type": self.solver_type.data,
            "base_lr": self.base_lr.data,
            "lr_policy": self.lr_policy.data,
            "weight_decay": self.weight_decay.data,
            "snapshot": self.snapshot.data,
        }
        # The length: the iterations given, else the epochs (DIGITS' way: the job computes max_iter from them).
        if self.max_iter.data is not None:
            settings["max_iter"] = self.max_iter.data
        else:
            settings["epochs"] = self.epochs.data
        if self.solver_type.data not in NO_MOMENTUM:
            settings["momentum"] = self.momentum.data
        if self.lr_policy.data in NEEDS_GAMMA:
            settings["gamma"] = self.gamma.data
        if self.lr_policy.data in NEEDS_POWER:
            settings["power"] = self.power.data
        if self.lr_policy.data == "step":
            settings["stepsize"] = self.stepsize.data
        if self.lr_policy.data == "multistep":
            settings["stepvalue"] = _step_values(self.stepvalues.data or "")
        if (self.val_source.data or "").strip():  # left empty: once per epoch, one pass over the validation set
            settings["test_interval"] = self.test_interval.data or EVERY_EPOCH
            settings["test_iter"] = self.test_iter.data or ONE_PASS
        return settings

    def errors_by_field(self) -> dict[str, str]:
        """One message per field (WTForms keeps lists), the shape of DIGITS' JSON errors."""
        return {name: "; ".join(str(m) for m in messages) for name, messages in self.errors.items() if messages}


BATCH_LIMIT = f"a batch size is at most {INT_MAX} (Caffe keeps it in a 32-bit int)"
"""Said once, in the same words by the page's script (new-model.js), when a batch is past what Caffe takes."""


def parse_batch(value: str | None) -> int | str | None:
    """The batch field: empty (the net's own), "auto" (the largest that fits on the device), or a positive integer."""
    text = (value or "").strip().lower()
    if not text:
        return None
    if text == AUTO:
        return AUTO
    batch = ascii_int(text, max_digits=10)
    if batch is None and text.isascii() and text.isdigit():  # a whole number, only too long to read
        raise ValueError(f"{shown(text)} is too large: {BATCH_LIMIT}")
    if batch is None:
        raise ValueError(f"{shown(value)!r} is not a batch size: give a positive integer (0-9), or 'auto'")
    if batch <= 0:
        raise ValueError(f"{batch} is not a batch size: give 1 or more, or 'auto'")
    if batch > INT_MAX:
        raise ValueError(f"{batch} is too large: {BATCH_LIMIT}")
    return batch


def parse_memory_cap(value: str | None) -> int | None:
    """The memory cap field: empty (none: the CPU's available memory), or a size with its unit ("2GiB"), checked as
    the REST API checks `memory_cap` (1 MiB to 1 EiB). A bare number is refused: "2048" could mean anything."""
    text = (value or "").strip()
    if not text:
        return None
    return job_memory_cap(text)


def _step_values(text: str) -> list[int]:
    parsed = [ascii_int(part, max_digits=10) for part in text.replace(" ", ",").split(",") if part]
    steps = [step for step in parsed if step is not None]
    if len(steps) != len(parsed):
        raise ValueError(f"{shown(text)!r} is not a list of iterations: write them like 10000,20000")
    if any(not 0 < step <= INT32_MAX for step in steps) or steps != sorted(set(steps)):
        raise ValueError(f"step values must be increasing, from 1 to {INT32_MAX}")
    return steps


def solver_prototxt(settings: Mapping[str, Any], *, validation: bool) -> str:
    """Caffe's solver for the form's settings, with DIGITS' stages: the train net runs with stage "train" and the
    validation net with stage "val". The job manager adds what depends on where the job runs (net, solver_mode,
    snapshot_prefix), and what depends on the datasets and the batch: max_iter by `epochs`, a validation interval
    of "epoch" and validation iterations of "pass" (core.epochs), which the text says in comments (test_iter and
    test_interval stand at 1 there: a solver with a validation net must have them)."""
    notes = []
    if settings.get("epochs") is not None:
        notes.append(f"# max_iter: {settings['epochs']} epochs, computed by the job from the training set's size and "
                     "the batch")
    solver = caffe_pb2.SolverParameter()
    for name in ("type", "base_lr", "lr_policy", "gamma", "power", "stepsize", "momentum", "weight_decay", "max_iter",
                 "snapshot"):
        if settings.get(name) is not None:
            setattr(solver, name, settings[name])
    solver.stepvalue.extend(settings.get("stepvalue", []))
    solver.display = 50
    solver.train_state.stage.append("train")
    if validation:
        test_iter, test_interval = settings["test_iter"], settings["test_interval"]
        if test_interval == EVERY_EPOCH:
            notes.append("# test_interval: once per epoch, computed by the job")
        if test_iter == ONE_PASS:
            notes.append("# test_iter: one pass over the validation set, computed by the job")
        solver.test_iter.append(test_iter if isinstance(test_iter, int) else 1)
        solver.test_interval = test_interval if isinstance(test_interval, int) else 1
        solver.test_state.add().stage.append("val")
    return "".join(f"{note}\n" for note in notes) + str(text_format.MessageToString(solver))


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """What the form asks a training job to do (web/pages/model_job.py maps it onto a job request)."""

    name: str
    network_key: str | None
    """The standard network chosen, or None for a custom one."""
    net_text: str
    net_source: str
    solver_text: str
    solver_source: str
    solver_settings: dict[str, Any] | None
    data_backend: str
    train_source: str
    val_source: str | None
    item_shape: tuple[int, ...] | None
    classes: int | None
    batch: int | str | None
    device: str
    divergence: str = DEFAULT_POLICY
    """What the job does when a net output becomes NaN or infinite (core.divergence): "stop" or "continue"."""
    memory_cap: int | None = None
    """Bytes a CPU attempt may allocate (the job's `memory_cap`); None: the CPU's available memory."""
    test_net: str = TEST_NET_AUTO
    """Where the validation nets live (core.test_net_modes): "auto", "shared" or "apart"."""
    tester_device: str = AUTO
    """With them apart, the form's choice of the tester's device: "auto", "same", "cpu" or a GPU's key."""
    epochs: int | None = None
    """The length in epochs (the solver settings without training iterations); None: the solver's max_iter."""
    test_interval: int | str | None = None
    """The request's test_interval: iterations, or "epoch"; None: the solver's."""
    test_iter: int | str | None = None
    """The request's test_iter: iterations, or "pass"; None: the solver's."""

    def estimate_request(
        self, engine: str, free_bytes: int | None, batch: int | None = None, max_batch: int | None = None,
        policy: PlanningPolicy | None = None, *, auto: bool = False, train_items: int | None = None,
    ) -> EstimateRequest:
        """The estimate of this job on one device; `batch` None means the net's own batch; `max_batch` caps the
        batch the planner may choose; `auto` caps it as "auto" is capped (planner.auto_cap, from `train_items`,
        the training set's size)."""
        return EstimateRequest(
            net=self.net_text,
            solver=self.solver_text,
            net_source=self.net_source,
            solver_source=self.solver_source,
            batch=batch,
            engine=engine,
            free_bytes=free_bytes,
            data_shapes={DATA_TOP: self.item_shape} if self.item_shape else {},
            classes=self.classes,
            max_batch=max_batch,
            auto=auto,
            train_items=train_items,
            policy=policy or PlanningPolicy(),
        )


def formdata_from_json(body: Any) -> MultiDict[str, str]:
    """The JSON twin's body as form data: numbers as text, a shape list as "3,256,256"; anything else is refused."""
    if not isinstance(body, dict):
        refuse("body", "expected a JSON object with the form's fields")
    known = {name for name, value in vars(NewModelForm).items() if isinstance(value, UnboundField)}
    data: MultiDict[str, str] = MultiDict()
    for key, value in body.items():
        if key not in known or key.endswith("_file"):
            refuse(shown(key), "unknown field (uploads go in a multipart form post)")
        if value is None:
            continue
        where = surrogate_in(value)
        if where is not None:
            refuse(key, not_text(where))
        if isinstance(value, bool):
            refuse(key, f"must be text or a number, got {value!r}")
        if key == "memory_cap" and isinstance(value, int):
            data.add(key, f"{value}B")  # bytes, as the REST API reads a number; the form's text needs a unit
        elif isinstance(value, (int, float, str)):
            data.add(key, str(value))
        elif isinstance(value, list) and all(is_whole(v) for v in value):
            data.add(key, ",".join(str(v) for v in value))
        else:
            refuse(key, f"must be text or a number, got {type_name(value)}")
    return data
