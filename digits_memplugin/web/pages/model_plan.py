"""The New model form's job as it would be queued: planned on its device as its first attempt will be (the job
manager's preview of the typed request), with the estimate the panel shows there.

The form's estimate (`core.estimate`, through the estimate pool) gives the panel's report, a definition error
beside the field that caused it (with its line), and which data layers the nets have; `model_job` maps the form
onto the typed job request; the job manager's preview plans it (the same definition checks, memory and planning
function as the job's attempts). The views (model_page.py) render what this module returns.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...core.device_kinds import AUTO, CPU
from ...core.errors import FieldErrors, NetError
from ...core.planning.fit import LIMITED_BY_MAX_BATCH, Decision
from ...core.planning.job_plan import PlanningPolicy
from ...core.sizes import format_size
from ...core.test_net_modes import TEST_NET_APART, TEST_NET_SHARED
from ...devices.reader import Device, DeviceList
from ...estimate import dataset_scan
from ...estimate.dataset_scan import FoundDataset
from ...jobs.definition.attempt_files import test_iters
from ...jobs.definition.definition import JobDefinition
from ...jobs.errors import JobValidationError
from ...jobs.scheduling.scheduler import MEMORY_CAP_ON_GPU
from ...networks import standard_network
from ..plugin_state import current_plugin
from . import panel_words
from .forms import DEVICE_NEXT, ModelSpec, NewModelForm
from .model_job import TypedJob, form_errors, job_body, job_request, manager_device

DATA_LAYER_TYPES = frozenset({"Data", "ImageData", "HDF5Data", "WindowData"})
TOP_LAYERS = 10


PLANNED_BY_JOB = "job"
"""The plan is the job manager's preview of the typed request: what the job's first attempt gets."""
PLANNED_BY_FORM = "form"
"""The dataset cannot be read yet (Auto before the data is in place): planned on the form's item shape, by the
same function and policy."""


@dataclasses.dataclass(frozen=True)
class PlannedJob:
    """A job as it would be queued: what was asked, the device it was planned on, the plan its first attempt gets,
    and the estimate there (the report the panel shows)."""

    spec: ModelSpec
    device: Device
    engine: str
    estimate: dict[str, Any]
    plan: dict[str, Any]
    """batch_size, iter_size, fits, bytes, effective_batch."""
    test_plan: dict[str, int] | None = None
    usable_bytes: int = 0
    free_bytes: int = 0
    """The memory the job may use on the device (free, less what running jobs reserved, or its cap)."""
    limited_by: str = "memory"
    planned_by: str = PLANNED_BY_JOB
    typed: TypedJob | None = None
    """The typed request the manager previewed (None when planned by the form)."""
    dataset: FoundDataset | None = None
    """The training dataset the form names, when it was found and read (its size caps "auto")."""
    auto_cap: str | None = None
    """Why "auto" stops at its batch when its cap chose it (planner.AutoCap.note), else None."""
    length: dict[str, Any] | None = None
    """How long the job trains and how often it validates at the planned batch (JobDefinition.length: max_iter,
    test_interval, per_epoch, epochs), and its validation iterations (test_iter); None when planned by the form."""
    test_net: str = TEST_NET_SHARED
    """Where the plan put the validation nets (Decision.test_net): "shared" or "apart"."""
    test_net_note: str | None = None
    """Why there, when the planner chose (auto) or could not keep them apart (Decision.test_net_note)."""
    tester_bytes: int | None = None
    """With them apart, the tester's estimated peak (the validation nets alone, at their own batch)."""
    tester_device: str | None = None
    """With them apart, the tester's device when it is not the trainer's (None: the trainer's)."""

    def preview_document(self) -> dict[str, Any]:
        """The plan as the JSON twin's preview answers it."""
        return {
            "device": self.device.key, "engine": self.engine, "planned_by": self.planned_by,
            "free_bytes": self.free_bytes, "usable_bytes": self.usable_bytes, "plan": self.plan,
            "test_plan": self.test_plan, "max_batch_limited_by": self.limited_by,
            "total_bytes": self.estimate["total_bytes"], "auto_cap": self.auto_cap, "length": self.length,
            "test_net": self.test_net, "test_net_note": self.test_net_note, "tester_bytes": self.tester_bytes,
            "tester_device": self.tester_device,
        }

    def test_net_words(self, devices: DeviceList) -> str:
        """Where the plan put the validation nets, in words (new-model.js: testNetWords): "Test nets apart: the
        tester on GPU 1, about 12.3 MiB. <why>"; "" for a net without validation."""
        if self.test_net == TEST_NET_APART:
            return apart_words(self.device_label, self.tester_bytes, self.tester_device, devices, self.test_net_note)
        if self.test_net_note is not None:
            return f"Test nets shared. {_why(self.test_net_note)}"
        if self.spec.test_net == TEST_NET_SHARED and self.estimate.get("test_batch_size"):
            return "Test nets shared, as asked."
        return ""

    @property
    def verdict(self) -> str:
        return verdict(self.plan)

    @property
    def network_title(self) -> str:
        return standard_network(self.spec.network_key).title if self.spec.network_key else "custom network"

    @property
    def device_label(self) -> str:
        return device_label(self.device)

    @property
    def batch_note(self) -> str:
        """What Auto chose and why, as the page's script words it (new-model.js: autoNote)."""
        return auto_note(self.plan["batch_size"], self.device_label, self.usable_bytes, self.free_bytes, self.auto_cap,
                         self.limited_by)

    @property
    def top_layers(self) -> list[dict[str, Any]]:
        return sorted(self.estimate["layers"], key=lambda layer: layer["bytes"], reverse=True)[:TOP_LAYERS]

    @property
    def categories(self) -> list[tuple[panel_words.Term, int]]:
        """The estimate by kind of memory, in the memory model's order, without the kinds this net has none of."""
        found = self.estimate["categories"]
        return [(term, found[key]) for key, term in panel_words.CATEGORY_TERMS.items() if found.get(key)]


def apart_words(
    trainer_label: str, tester_bytes: int | None, tester_device: str | None, devices: DeviceList, note: str | None,
) -> str:
    """The plan's validation nets apart, in words: where the tester runs, what it needs, and why apart."""
    other = devices.get(tester_device) if tester_device else None
    where = device_label(other) if other is not None else (tester_device or f"{trainer_label} (training pauses meanwhile)")
    needs = f", about {format_size(tester_bytes)}" if tester_bytes is not None else ""
    why = f" {_why(note)}" if note else ""
    return f"Test nets apart: the tester on {where}{needs}.{why}"


def _why(note: str) -> str:
    """A plan's test_net_note as a sentence ("test nets shared: the Caffe that trains ..." reads "The Caffe that
    trains ..."; a note that is more than its placement stays whole)."""
    for lead in ("test nets shared: ", "test nets apart: "):
        note = note.removeprefix(lead)
    note = note.strip()
    return (note[:1].upper() + note[1:]).rstrip(".") + "." if note else ""


def device_label(device: Device) -> str:
    where = f" of {device.host}" if device.host else ""
    return f"CPU{where}" if device.kind == CPU else f"GPU {device.index}{where}"


def auto_note(
    batch: int, label: str, usable: int, free: int, auto_cap: str | None, limited_by: str = "memory"
) -> str:
    """"Batch 71: capped at 71 so that an epoch of the 1438 training items has 21 iterations (...); CPU has memory
    for more." (new-model.js: autoNote)."""
    if auto_cap:
        return f"Batch {batch}: {auto_cap}; {label} has memory for more."
    if limited_by == "blob_limit":
        return (f"Batch {batch}: the largest Caffe can build in one pass (one more item would make a blob over its "
                f"limit of 2147483647 elements), though {label} has memory for more.")
    return f"Batch {batch}: the largest that fits on {label} ({format_size(usable)} usable of {format_size(free)} free)."


def train_dataset(spec: ModelSpec) -> FoundDataset | None:
    """The training dataset the form names, read from it; None when there is none there (yet) or it cannot be
    read (the job's own checks then say why, beside the field)."""
    roots = current_plugin().jobs.config.dataset_roots
    found = dataset_scan.source_dataset(spec.train_source, spec.data_backend, roots)
    return found if found is not None and found.error is None else None


@dataclasses.dataclass(frozen=True)
class Asked:
    """What the form asks for: its spec, and the training dataset it names as read once for the request (its item
    shape fills an empty item shape, its size caps "auto")."""

    spec: ModelSpec
    dataset: FoundDataset | None

    def with_batch(self, batch: int | str | None) -> Asked:
        return dataclasses.replace(self, spec=dataclasses.replace(self.spec, batch=batch))


def asked_of(form: NewModelForm) -> Asked:
    """The form's spec and training dataset; an item shape left empty is the training dataset's own (read from it,
    as the job does), else the standard network's."""
    spec = form.to_spec()
    dataset = train_dataset(spec)
    if not (form.item_shape.data or "").strip() and dataset is not None and dataset.shape:
        spec = dataclasses.replace(spec, item_shape=dataset.shape)
    return Asked(spec, dataset)


def verdict(plan: dict[str, Any] | None) -> str:
    """The panel's words for a plan: "fits", "fits with iter_size k" or "does not fit"."""
    if not plan or not plan["fits"]:
        return "does not fit"
    if plan["iter_size"] > 1:
        return f"fits with iter_size {plan['iter_size']}"
    return "fits"


def target_device(choice: str, devices: DeviceList) -> Device:
    """The device a job is planned on: the one chosen, or for "next available" the GPU with the most free memory
    now (the CPU when there is none). The job manager decides for itself when the job starts."""
    if choice == DEVICE_NEXT:
        usable = [gpu for gpu in devices.gpus if gpu.error is None and gpu.memory_free is not None]
        return max(usable, key=lambda gpu: gpu.memory_free or 0) if usable else devices.cpu
    device = devices.get(choice)
    if device is None:
        raise FieldErrors.one("device", f"the device {choice!r} is gone; choose another")
    if device.error is not None or device.memory_free is None:
        raise FieldErrors.one("device", f"{device_label(device)} cannot be planned on: {device.error or 'free memory unknown'}")
    return device


def plan_model(asked: Asked, devices: DeviceList, *, strict: bool = True) -> PlannedJob:
    """Plan the job on its device as its first attempt will be planned: the form's estimate gives the report (and
    which data layers the nets have), the typed request goes to the job manager's preview (the same definition
    checks, memory and planning function as the job's attempts); the training dataset is the one `asked` read.
    `strict` False (Auto): a dataset the job cannot read yet does not stop the suggestion, which is then planned
    on the form's item shape, by the same function and policy."""
    plugin = current_plugin()
    policy = plugin.jobs.config.policy
    spec, dataset = asked.spec, asked.dataset
    device = target_device(spec.device, devices)
    if spec.memory_cap is not None and device.kind != CPU:
        raise FieldErrors.one("memory_cap", MEMORY_CAP_ON_GPU)  # before anything else the GPU would say
    engine = policy.engine(device.kind)
    batch = spec.batch if isinstance(spec.batch, int) else None
    cap = Cap(spec.batch == AUTO, dataset.entries if dataset else None)
    document = _estimate(spec, engine, device, batch, cap, policy)
    if document["plan"] is None:
        raise FieldErrors.one("custom_network" if spec.network_key is None else "standard_network",
                        "the network has no data layer whose batch could be planned")
    if not document["plan"]["fits"]:  # not even batch 1 on the form's item shape: said before the data's errors
        raise FieldErrors.one(
            "device",
            f"does not fit on {device_label(device)}: even batch 1 needs more than the "
            f"{format_size(document['usable_bytes'])} usable there; choose another device",
        )
    tester = devices.get(spec.tester_device)
    mapped = job_body(  # the form's choices that the net cannot take
        spec, document, manager_device(spec.device, device.index),
        manager_device(spec.tester_device, tester.index if tester is not None else None),
    )
    try:
        typed = job_request(spec, mapped, plugin.settings.job_max_attempts)
        preview = plugin.started_jobs().preview(typed.request, device.key)
    except FieldErrors as refused:  # the request's fields, or (JobValidationError) the manager's, named as its own
        errors = form_errors(refused.errors, spec, mapped.sources) if isinstance(refused, JobValidationError) else (
            refused.errors
        )
        if strict or not set(errors) <= DATA_FIELDS:
            raise FieldErrors(errors) from None
        return _planned_by_form(spec, device, engine, document, cap, policy, dataset)
    decision = preview.decision
    if decision.plan is None:
        raise FieldErrors.one("device", f"does not fit on {device_label(device)}: {decision.message}; choose another device")
    if decision.plan.batch_size != document["batch_size"]:
        # The panel's report at the planned batch: the plan is the preview's, so the core is not asked to plan again.
        document = _estimate(spec, engine, None, decision.plan.batch_size, cap, policy)
    return PlannedJob(
        spec=spec, device=device, engine=engine, estimate=document, plan=decision.plan.to_dict(),
        test_plan=decision.test_plan, usable_bytes=decision.budget, free_bytes=preview.limit_bytes,
        limited_by=decision.limited_by, typed=typed, dataset=dataset, auto_cap=decision.auto_cap,
        length=_length(preview.definition, decision), test_net=decision.test_net,
        test_net_note=decision.test_net_note, tester_bytes=decision.tester_bytes, tester_device=decision.tester_device,
    )


@dataclasses.dataclass(frozen=True)
class Cap:
    """How the form's estimate caps its batch: as "auto" is capped (planner.auto_cap), from the training set's size."""

    auto: bool
    train_items: int | None


def _length(definition: JobDefinition, decision: Decision) -> dict[str, Any] | None:
    """The job's length and validation at its planned batch, as its first attempt will train (JobDefinition)."""
    if decision.plan is None:
        return None
    length = definition.length(decision.plan.effective_batch).to_dict()
    test_batch = decision.test_plan["batch_size"] if decision.test_plan else None
    iters = test_iters(definition, test_batch)
    return {**length, "test_iter": iters[0] if iters else None}


DATA_FIELDS = frozenset({"train_source", "val_source", "data_backend", "item_shape"})
"""Form fields about the dataset: Auto still suggests a batch while they cannot be read."""


def _planned_by_form(
    spec: ModelSpec, device: Device, engine: str, document: dict[str, Any], cap: Cap,
    policy: PlanningPolicy, dataset: FoundDataset | None,
) -> PlannedJob:
    """Auto before the dataset can be read: the form's estimate plans (core.planning.job_plan, the server's policy). The
    caller found that batch 1 fits there, so the largest batch that fits does too."""
    if spec.batch == AUTO and document["max_batch_size"]:
        document = _estimate(spec, engine, device, document["max_batch_size"], cap, policy)
    capped = document.get("auto_cap")
    at_cap = (capped is not None and document.get("max_batch_limited_by") == LIMITED_BY_MAX_BATCH
              and document["plan"] is not None and document["plan"]["batch_size"] >= capped["batch_size"])
    return PlannedJob(
        spec=spec, device=device, engine=engine, estimate=document, plan=document["plan"],
        test_plan=document["test_plan"], usable_bytes=document["usable_bytes"], free_bytes=document["free_bytes"],
        limited_by=document.get("max_batch_limited_by", "memory"), planned_by=PLANNED_BY_FORM, dataset=dataset,
        auto_cap=capped["note"] if at_cap and capped else None,
        test_net=document.get("test_net") or TEST_NET_SHARED, test_net_note=document.get("test_net_note"),
        tester_bytes=document.get("tester_bytes"),
    )


def _estimate(
    spec: ModelSpec, engine: str, device: Device | None, batch: int | None, cap: Cap, policy: PlanningPolicy
) -> dict[str, Any]:
    """The estimate, in a worker process for large texts (estimate/pool.py; a full queue is a 503); planned on
    `device`'s free memory, or (None) the report alone, with no plan."""
    plugin = current_plugin()
    free = device.memory_free if device is not None else None
    try:
        request = spec.estimate_request(engine, free, batch, policy=policy, auto=cap.auto,
                                        train_items=cap.train_items)
        return plugin.estimates.estimate(request)
    except NetError as error:
        field = _error_field(error, spec)
        raise FieldErrors.one(field, _error_detail(error, field, spec)) from None


TYPED_TEXT_FIELDS = frozenset({"custom_network", "solver_text"})
"""Fields whose text the user typed or uploaded: only there does a line number point at something they can see."""


def _error_field(error: NetError, spec: ModelSpec) -> str:
    """The form field a definition error belongs beside: the field that caused it, where the user looks.

    A standard network is known to build at its own dataset's shape and batch, so an error in it comes from what
    the user changed: the item shape if one was given, else the batch."""
    if error.source is not None and error.source.startswith(spec.solver_source) and spec.solver_source != spec.net_source:
        return "solver_text" if spec.solver_settings is None else "solver_type"
    if error.field == "top" and error.layer_type in DATA_LAYER_TYPES and spec.item_shape is None:
        return "item_shape"
    if error.field == "inner_product_param.num_output" and spec.classes is None:
        return "classes"
    if error.field in ("batch", "classes"):
        return "batch_size" if error.field == "batch" else "classes"
    if spec.network_key is not None:
        if spec.item_shape != standard_network(spec.network_key).item_shape:
            return "item_shape"
        if isinstance(spec.batch, int):
            return "batch_size"
        return "standard_network"
    return "custom_network"


def _error_detail(error: NetError, field: str, spec: ModelSpec) -> dict[str, Any]:
    """The error as the form shows it: line numbers only beside text the user typed, and the standard network
    named (its text is never shown, so "layer conv1" alone would say nothing)."""
    detail = error.to_dict()
    if field not in TYPED_TEXT_FIELDS:
        detail.update(line=None, column=None)
    if spec.network_key is not None and error.layer is not None:
        detail["network"] = standard_network(spec.network_key).title
    return detail

