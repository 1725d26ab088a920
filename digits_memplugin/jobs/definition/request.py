"""What a client asks for when it submits a job, checked field by field before anything is stored.

    {"net": "<prototxt>", "solver": "<prototxt>",             # required
     "name": "lenet", "device": "auto" | "cpu" | "GPU-<uuid>" | 0,
     "batch": 256 | "auto",                                   # default: the net's own batch size
     "data": {"train": "mnist_train_lmdb", "test": "mnist_test_lmdb", "<layer>": "<source>"},
     "data_shapes": {"data": [3, 224, 224]}, "classes": 10,
     "max_iter": 1000 | "epochs": 30,                         # the length: iterations, or passes over the training set
     "test_interval": 500 | "epoch", "test_iter": 100 | "pass",  # validation: iterations, or DIGITS' by the datasets
     "memory_cap": 2147483648 | "2GiB",                       # CPU jobs only
     "fallback": {"max_attempts": 5, "safety_margin": 0.03, "growth": 0.1, "start": "plan" | "wanted"},
     "divergence": "stop" | "continue"}                       # a NaN or infinite net output (core.divergence)

`epochs` sets max_iter as DIGITS does (core.epochs: epochs x ceil(training items / batch_size x iter_size)), and with
it `test_interval` and `test_iter` left out are DIGITS' too: validation once per epoch ("epoch"), one pass over the
validation set ("pass"); without it they are the solver's unless given. A fallback field left out takes the server's default (a safety margin left out: the device kind's, known only
once the job is placed).

Validation errors are collected per field ({"batch": "must be a positive integer or \"auto\""}), so the REST API
answers 400 with all of them at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ...core.divergence import DEFAULT_POLICY, POLICIES
from ...core.epochs import EVERY_EPOCH, ONE_PASS
from ...core.inputs import capped, not_text, surrogate_in
from ...core.planning.fallback import DEFAULT_GROWTH, Policy
from ...core.sizes import byte_count

FIELDS = (
    "net", "solver", "name", "device", "batch", "data", "data_shapes", "classes", "max_iter", "epochs", "test_interval",
    "test_iter", "memory_cap", "fallback", "divergence",
)
MAX_EPOCHS = 1_000_000
FALLBACK_FIELDS = ("max_attempts", "safety_margin", "growth", "start")
STARTS = ("plan", "wanted")
MAX_NAME = 200
MAX_DIMS = 8
INT32_MAX = 2**31 - 1
"""Caffe's batch sizes, dimensions, max_iter and class counts are 32-bit; larger values are refused here, with the
field named, before they reach a prototxt or the database (SQLite's integers are 64-bit)."""
MAX_MEMORY_CAP = 1 << 60
MEMORY_CAP_RANGE = 'must be a number of bytes from 1 MiB to 1 EiB, or a size such as "2GiB"'


@dataclasses.dataclass(frozen=True)
class JobRequest:
    """A validated submission. `device` is normalised later against the devices present (see the manager)."""

    net: str
    solver: str
    name: str | None = None
    device: str | int = "auto"
    batch: int | str | None = None
    """A positive integer (the effective batch to keep), "auto" (the largest that fits) or None (the net's own)."""
    data: dict[str, str] = dataclasses.field(default_factory=dict)
    data_shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    classes: int | None = None
    max_iter: int | None = None
    epochs: int | None = None
    """The length in passes over the training set (core.epochs), instead of max_iter."""
    test_interval: int | str | None = None
    """Iterations between validations, or "epoch" (once per epoch); None: the solver's (once per epoch with epochs)."""
    test_iter: int | str | None = None
    """Validation iterations, or "pass" (one pass over the validation set); None: the solver's (a pass with epochs)."""
    memory_cap: int | None = None
    policy: Policy = dataclasses.field(default_factory=Policy)
    safety_margin: float | None = None
    """The margin the request asked for; None: the default of the device the job is placed on."""
    start: str = "plan"
    """"plan": the first attempt uses the planner's batch; "wanted": it tries the wanted batch as given first."""
    divergence: str = DEFAULT_POLICY
    """"stop": a net output that becomes NaN or infinite ends the job with DIGITS' advice; "continue": it trains on."""

    def spec(self, device: str) -> dict[str, Any]:
        """What the job row keeps (the prototxt texts are files in the job's folder)."""
        return {
            "device": device,
            "batch": self.batch,
            "data": self.data,
            "data_shapes": {key: list(value) for key, value in self.data_shapes.items()},
            "classes": self.classes,
            "max_iter": self.max_iter,
            "epochs": self.epochs,
            "test_interval": self.test_interval,
            "test_iter": self.test_iter,
            "memory_cap": self.memory_cap,
            "fallback": {**self.policy.to_dict(), "safety_margin": self.safety_margin, "start": self.start},
            "divergence": self.divergence,
        }


def _positive_int(value: Any, limit: int = INT32_MAX) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value <= limit


def parse_job_request(
    body: Any, *, default_attempts: int, default_margin: float | None = None
) -> tuple[JobRequest | None, dict[str, Any]]:
    """The request, or None with {field: message} for everything wrong with it."""
    if not isinstance(body, Mapping):
        return None, {"body": "expected a JSON object"}
    errors: dict[str, Any] = {}
    capped(errors, (key for key in body if key not in FIELDS), f"unknown field (known: {', '.join(FIELDS)})")
    for key in FIELDS:
        where = surrogate_in(body.get(key))
        if where is not None:  # text no file, database or socket can hold: refused before any other check
            errors[key] = not_text(where)
    body = {key: value for key, value in body.items() if key in FIELDS and key not in errors}
    values: dict[str, Any] = {}
    for key in ("net", "solver"):
        value = body.get(key)
        if key in errors:
            continue
        if not isinstance(value, str) or not value.strip():
            errors[key] = f"give the {key} prototxt text"
        else:
            values[key] = value
    name = body.get("name")
    if name is not None:
        if not isinstance(name, str) or len(name) > MAX_NAME:
            errors["name"] = f"must be text of at most {MAX_NAME} characters"
        else:
            values["name"] = name.strip() or None
    device = body.get("device", "auto")
    if device is None:
        device = "auto"
    if isinstance(device, bool) or not isinstance(device, (str, int)) or (isinstance(device, int) and device < 0):
        errors["device"] = 'must be "auto", "cpu", a GPU UUID or a GPU index'
    else:
        values["device"] = device.strip() if isinstance(device, str) else device
    batch = body.get("batch")
    if batch is not None:
        if batch == "auto" or _positive_int(batch):
            values["batch"] = batch
        else:
            errors["batch"] = f'must be a positive integer up to {INT32_MAX} or "auto"'
    data = body.get("data")
    if data is not None:
        if not isinstance(data, Mapping) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in data.items()
        ):
            errors["data"] = 'must map layer names (or "train"/"test") to data sources (paths)'
        else:
            values["data"] = dict(data)
    shapes = body.get("data_shapes")
    if shapes is not None:
        if not isinstance(shapes, Mapping):
            errors["data_shapes"] = "must map data tops to item shapes"
        else:
            parsed = {}
            wrong = []
            for top, shape in shapes.items():
                if (
                    not isinstance(shape, list)
                    or not 0 < len(shape) <= MAX_DIMS
                    or not all(_positive_int(d) for d in shape)
                ):
                    wrong.append(f"data_shapes.{top}")
                else:
                    parsed[str(top)] = tuple(shape)
            capped(errors, wrong, f"must be a list of 1 to {MAX_DIMS} positive integers up to {INT32_MAX}",
                   "data_shapes entries that are not shapes")
            values["data_shapes"] = parsed
    for key in ("classes", "max_iter"):
        value = body.get(key)
        if value is not None:
            if _positive_int(value):
                values[key] = value
            else:
                errors[key] = f"must be a positive integer up to {INT32_MAX}"
    epochs = body.get("epochs")
    if epochs is not None:
        if not _positive_int(epochs, MAX_EPOCHS):
            errors["epochs"] = f"must be a whole number of passes over the training set, from 1 to {MAX_EPOCHS}"
        elif "max_iter" in values:
            errors["epochs"] = "give the length once: epochs or max_iter, not both"
        else:
            values["epochs"] = epochs
    for key, word, meaning in (("test_interval", EVERY_EPOCH, "once per epoch"),
                               ("test_iter", ONE_PASS, "one pass over the validation set")):
        value = body.get(key)
        if value is not None:
            if value == word or _positive_int(value):
                values[key] = value
            else:
                errors[key] = f'must be a positive integer up to {INT32_MAX}, or "{word}" ({meaning})'
    cap = body.get("memory_cap")
    if cap is not None:
        try:
            values["memory_cap"] = memory_cap(cap)
        except ValueError as error:
            errors["memory_cap"] = str(error)
    divergence = body.get("divergence")
    if divergence is not None:
        if isinstance(divergence, str) and divergence in POLICIES:
            values["divergence"] = divergence
        else:
            errors["divergence"] = (
                f'must be "{POLICIES[0]}" (end the job when a net output becomes NaN or infinite, as DIGITS does) or '
                f'"{POLICIES[1]}" (train on regardless)'
            )
    policy, margin, start = _fallback(body.get("fallback"), errors, default_margin, default_attempts)
    if errors:
        return None, errors
    return JobRequest(**values, policy=policy, safety_margin=margin, start=start), {}


def memory_cap(value: Any) -> int:
    """A job's memory cap in bytes: a whole number of bytes, or a size with its unit ("2GiB"), from 1 MiB to 1 EiB
    (the REST API's field, and the New model form's). ValueError saying what is wrong."""
    try:
        cap = byte_count(value)
    except ValueError as error:
        raise ValueError(str(error) if isinstance(value, str) else MEMORY_CAP_RANGE) from None
    if not (_positive_int(cap, MAX_MEMORY_CAP) and cap >= 1 << 20):
        raise ValueError(MEMORY_CAP_RANGE)
    return cap


def _fallback(
    value: Any, errors: dict[str, Any], margin: float | None, attempts: int
) -> tuple[Policy, float | None, str]:
    fields: dict[str, Any] = {"max_attempts": attempts, "growth": DEFAULT_GROWTH}
    start = "plan"
    if value is None:
        return Policy(**fields), margin, start
    if not isinstance(value, Mapping):
        errors["fallback"] = "must be an object"
        return Policy(**fields), margin, start
    problems: dict[str, str] = {}
    capped(problems, (key for key in value if key not in (*FALLBACK_FIELDS,)),
           f"unknown field (known: {', '.join(FALLBACK_FIELDS)})")
    for key, item in value.items():
        if key not in FALLBACK_FIELDS:
            continue
        if key == "start":
            if item in STARTS:
                start = item
            else:
                problems[key] = f"must be one of {', '.join(STARTS)}"
        elif key == "max_attempts":
            if _positive_int(item) and item <= 100:
                fields[key] = item
            else:
                problems[key] = "must be a whole number from 1 to 100"
        elif key in ("safety_margin", "growth"):
            if not isinstance(item, bool) and isinstance(item, (int, float)) and 0 <= item < 1:
                if key == "safety_margin":
                    margin = float(item)
                else:
                    fields[key] = float(item)
            else:
                problems[key] = "must be a fraction in [0, 1)"
    if problems:
        errors["fallback"] = problems
    return Policy(**fields), margin, start
