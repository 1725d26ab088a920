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
     "divergence": "stop" | "continue",                       # a NaN or infinite net output (core.divergence)
     "test_net": "auto" | "shared" | "apart",                 # where the test nets live (core.test_nets)
     "tester_device": "auto" | "same" | "cpu" | "GPU-<uuid>" | 1}  # with them apart: where the tester runs

`epochs` sets max_iter as DIGITS does (core.epochs: epochs x ceil(training items / batch_size x iter_size)), and with
it `test_interval` and `test_iter` left out are DIGITS' too: validation once per epoch ("epoch"), one pass over the
validation set ("pass"); without it they are the solver's unless given. A fallback field left out takes the server's default (a safety margin left out: the device kind's, known only
once the job is placed).

`test_net` "auto" (the default) keeps the test nets apart only where that trains a larger batch or fewer iter_size
passes and stopping for the tester costs under 5% of an interval (core.planning.apart); `tester_device` "auto" puts
the tester on another GPU with room for it, else on the trainer's device ("same"); the CPU only when named.

Validation errors are collected per field ({"batch": "must be a positive integer or \"auto\""}), so the REST API
answers 400 with all of them at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

from ...core import fields
from ...core.device_kinds import AUTO
from ...core.divergence import DEFAULT_POLICY, POLICIES
from ...core.epochs import EVERY_EPOCH, ONE_PASS
from ...core.fields import INT32_MAX
from ...core.inputs import capped, not_text, surrogate_in
from ...core.planning.fallback import DEFAULT_GROWTH, Policy
from ...core.sizes import byte_count
from ...core.test_net_modes import SAME_DEVICE, TEST_NET_APART, TEST_NET_AUTO, TEST_NET_MODES, TEST_NET_SHARED

FIELDS = (
    "net", "solver", "name", "device", "batch", "data", "data_shapes", "classes", "max_iter", "epochs", "test_interval",
    "test_iter", "memory_cap", "fallback", "divergence", "test_net", "tester_device",
)
MAX_EPOCHS = 1_000_000
FALLBACK_FIELDS = ("max_attempts", "safety_margin", "growth", "start")
STARTS = ("plan", "wanted")
MAX_NAME = 200
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
    test_net: str = TEST_NET_AUTO
    """Where the test nets live (core.test_net_modes): "auto", "shared" or "apart"."""
    tester_device: str | int = AUTO
    """With the test nets apart, where the tester runs: "auto", "same", "cpu", a GPU's UUID or index (normalised
    against the devices present at submission, as `device` is)."""

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
            "test_net": self.test_net,
            "tester_device": self.tester_device,
        }


POSITIVE = f"must be a positive integer up to {INT32_MAX}"


def _count(field: str, value: Any, *, word: str | None = None, must: str = POSITIVE) -> int | str:
    """A positive 32-bit count, or `word` ("auto", "epoch", "pass") as it is."""
    return value if word is not None and value == word else fields.integer(field, value, low=1, high=INT32_MAX, must=must)


def _text(field: str, value: Any) -> str:
    return fields.string(field, value, nonblank=True, must=f"give the {field} prototxt text")


def _name(field: str, value: Any) -> str | None:
    return fields.string(field, value, max_length=MAX_NAME, must=f"must be text of at most {MAX_NAME} characters").strip() or None


def _device(field: str, value: Any) -> str | int:
    if isinstance(value, str):
        return value.strip()
    return fields.integer(field, value, low=0, must='must be "auto", "cpu", a GPU UUID or a GPU index')


def _data(field: str, value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and k and isinstance(v, str) and v for k, v in value.items()):
        fields.refuse(field, 'must map layer names (or "train"/"test") to data sources (paths)')
    return dict(value)


def _memory_cap(field: str, value: Any) -> int:
    try:
        return memory_cap(value)
    except ValueError as error:
        fields.refuse(field, str(error))


def _tester_device(field: str, value: Any) -> str | int:
    if isinstance(value, str):
        return value.strip()
    return fields.integer(field, value, low=0, must=TESTER_DEVICE)


TEST_NET = (
    f'must be "{TEST_NET_AUTO}" (apart only where it pays), "{TEST_NET_SHARED}" (beside the train net, as Caffe '
    f'does) or "{TEST_NET_APART}" (in a tester process, on each test interval\'s snapshot)'
)
TESTER_DEVICE = f'must be "{AUTO}", "{SAME_DEVICE}", "cpu", a GPU UUID or a GPU index'
DIVERGENCE = (
    f'must be "{POLICIES[0]}" (end the job when a net output becomes NaN or infinite, as DIGITS does) or '
    f'"{POLICIES[1]}" (train on regardless)'
)
CHECKS: dict[str, Callable[..., Any]] = {
    "net": _text,
    "solver": _text,
    "name": _name,
    "device": _device,
    "batch": partial(_count, word="auto", must=f'{POSITIVE} or "auto"'),
    "data": _data,
    "data_shapes": fields.shapes,
    "classes": _count,
    "max_iter": _count,
    "epochs": partial(fields.integer, low=1, high=MAX_EPOCHS,
                      must=f"must be a whole number of passes over the training set, from 1 to {MAX_EPOCHS}"),
    "test_interval": partial(_count, word=EVERY_EPOCH, must=f'{POSITIVE}, or "{EVERY_EPOCH}" (once per epoch)'),
    "test_iter": partial(_count, word=ONE_PASS, must=f'{POSITIVE}, or "{ONE_PASS}" (one pass over the validation set)'),
    "memory_cap": _memory_cap,
    "divergence": partial(fields.choice, options=POLICIES, must=DIVERGENCE),
    "test_net": partial(fields.choice, options=TEST_NET_MODES, must=TEST_NET),
    "tester_device": _tester_device,
}
"""Each field's check, in the order the errors are listed; fallback is checked apart (its errors are nested)."""
ENTRIES = {"data_shapes": "data_shapes entries that are not shapes"}
"""Fields refused entry by entry (`data_shapes.<top>`), and what their entries are when a list is cut short."""
REQUIRED = {"net": None, "solver": None, "device": "auto"}
"""Fields checked even when left out or null, with the value they then have (None: refused as missing)."""


def parse_job_request(
    body: Any, *, default_attempts: int, default_margin: float | None = None
) -> tuple[JobRequest | None, dict[str, Any]]:
    """The request, or None with {field: message} for everything wrong with it."""
    if not isinstance(body, Mapping):
        return None, {"body": "expected a JSON object"}
    refusals = fields.Refusals()
    body = _screened(body, refusals.errors)
    values: dict[str, Any] = {}
    for key, check in CHECKS.items():
        value = body.get(key)
        if key in refusals.errors or (value is None and key not in REQUIRED):
            continue
        refusals.take(values, key, check, REQUIRED.get(key) if value is None else value, many=ENTRIES.get(key))
        if key == "epochs" and "epochs" in values and "max_iter" in values:
            del values["epochs"]
            refusals.errors[key] = "give the length once: epochs or max_iter, not both"
    policy, margin, start = _fallback(body.get("fallback"), refusals.errors, default_margin, default_attempts)
    if refusals.errors:
        return None, refusals.errors
    return JobRequest(**values, policy=policy, safety_margin=margin, start=start), {}


def _screened(body: Mapping[str, Any], errors: dict[str, Any]) -> dict[str, Any]:
    """The body's known fields whose text any file, database or socket can hold; the others refused in `errors`
    (unknown fields, and lone surrogates before any other check)."""
    capped(errors, (key for key in body if key not in FIELDS), f"unknown field (known: {', '.join(FIELDS)})")
    for key in FIELDS:
        where = surrogate_in(body.get(key))
        if where is not None:
            errors[key] = not_text(where)
    return {key: value for key, value in body.items() if key in FIELDS and key not in errors}


def memory_cap(value: Any) -> int:
    """A job's memory cap in bytes: a whole number of bytes, or a size with its unit ("2GiB"), from 1 MiB to 1 EiB
    (the REST API's field, and the New model form's). ValueError saying what is wrong."""
    try:
        cap = byte_count(value)
    except ValueError as error:
        raise ValueError(str(error) if isinstance(value, str) else MEMORY_CAP_RANGE) from None
    if not (fields.is_whole(cap) and 1 << 20 <= cap <= MAX_MEMORY_CAP):
        raise ValueError(MEMORY_CAP_RANGE)
    return cap


FALLBACK_CHECKS: dict[str, Callable[..., Any]] = {
    "max_attempts": partial(fields.integer, low=1, high=100, must="must be a whole number from 1 to 100"),
    "safety_margin": partial(fields.number, low=0, below=1, must="must be a fraction in [0, 1)"),
    "growth": partial(fields.number, low=0, below=1, must="must be a fraction in [0, 1)"),
    "start": partial(fields.choice, options=STARTS, must=f"must be one of {', '.join(STARTS)}"),
}


def _fallback(
    value: Any, errors: dict[str, Any], margin: float | None, attempts: int
) -> tuple[Policy, float | None, str]:
    """The fallback's policy, safety margin and start; its problems nested under errors["fallback"]."""
    policy: dict[str, Any] = {"max_attempts": attempts, "growth": DEFAULT_GROWTH}
    if value is None:
        return Policy(**policy), margin, "plan"
    if not isinstance(value, Mapping):
        errors["fallback"] = "must be an object"
        return Policy(**policy), margin, "plan"
    refusals = fields.Refusals()
    capped(refusals.errors, (key for key in value if key not in FALLBACK_CHECKS),
           f"unknown field (known: {', '.join(FALLBACK_FIELDS)})")
    for key, item in value.items():
        if key in FALLBACK_CHECKS:
            refusals.take(policy, key, FALLBACK_CHECKS[key], item)
    if refusals.errors:
        errors["fallback"] = refusals.errors
    margin = policy.pop("safety_margin", margin)
    start = policy.pop("start", "plan")
    return Policy(**policy), margin, start
