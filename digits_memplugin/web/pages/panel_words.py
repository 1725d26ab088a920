"""The words of the New model page in plain terms: the memory categories of an estimate, the engines, and the
jargon the panel shows (iter_size, usable, reserved, where the figures come from, validation passes).

One place for them: the template renders the terms section and the categories table from here, and the page's
script gets the same words as JSON (new-model.js), so the server-rendered and the live panel say the same.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...core.layers.base import (
    ACTIVATION_DIFFS,
    ACTIVATIONS,
    CATEGORIES,
    CONTEXT,
    DATA_PREFETCH,
    ENGINE_CPU,
    ENGINE_CUDNN,
    ENGINE_GPU,
    LAYER_BUFFERS,
    PARAM_DIFFS,
    PARAMS,
    SOLVER_HISTORY,
    WORKSPACE,
)
from ...core.planning.job_plan import PlanningPolicy


@dataclasses.dataclass(frozen=True)
class Term:
    """A word as the page shows it, and what it means in a sentence or two."""

    key: str
    label: str
    meaning: str

    @property
    def anchor(self) -> str:
        """The id of its entry in the page's terms section (links and tooltips point there)."""
        return "term-" + self.key.replace("_", "-")

    def to_json(self) -> dict[str, str]:
        return {"key": self.key, "label": self.label, "meaning": self.meaning, "anchor": self.anchor}


CATEGORY_TERMS: dict[str, Term] = {
    term.key: term
    for term in (
        Term(ACTIVATIONS, "Layer outputs",
             "What each layer computes for the whole batch (Caffe's top blobs, the activations): grows with the batch."),
        Term(ACTIVATION_DIFFS, "Output gradients",
             "The gradients of the layer outputs, computed by the backward pass: grow with the batch."),
        Term(PARAMS, "Weights", "The learned parameters (weights and biases): the same at any batch."),
        Term(PARAM_DIFFS, "Weight gradients", "One gradient per weight, computed at every iteration."),
        Term(SOLVER_HISTORY, "Solver state",
             "What the solver keeps between iterations: one copy of the weights (momentum or history) for SGD, "
             "Nesterov, AdaGrad and RMSProp, two for Adam and AdaDelta."),
        Term(LAYER_BUFFERS, "Layer buffers",
             "Scratch memory inside layers: a convolution's unrolled input (im2col), max-pooling indices, dropout "
             "masks, softmax probabilities."),
        Term(DATA_PREFETCH, "Prefetched batches",
             "Batches the data layers read ahead of training (4 by default in Caffe), so that the next one is ready."),
        Term(WORKSPACE, "cuDNN workspace",
             "Scratch memory cuDNN's convolution algorithms work in (GPU with cuDNN only)."),
        Term(CONTEXT, "Process overhead",
             "What a Caffe process needs whatever the net: on a GPU the CUDA context, cuBLAS and cuRAND (hundreds of "
             "MB); on the CPU Caffe's own objects (layers, blobs, threads, the parsed definitions)."),
    )
}
assert tuple(CATEGORY_TERMS) == CATEGORIES, "every category of the memory model has its words, in its order"

ENGINE_TERMS: dict[str, Term] = {
    term.key: term
    for term in (
        Term(ENGINE_CPU, "cpu", "Caffe on the CPU; its memory is the host's RAM, taken with malloc."),
        Term(ENGINE_GPU, "gpu", "Caffe's own CUDA code on a GPU, without cuDNN."),
        Term(ENGINE_CUDNN, "gpu-cudnn",
             "Caffe on a GPU with NVIDIA's cuDNN library for its convolutions, which adds cuDNN's workspace."),
    )
}


def terms(policy: PlanningPolicy) -> tuple[Term, ...]:
    """The jargon of the page, in the order its terms section lists it; the margins are the server's policy."""
    return (
        Term("engine", "engine",
             "How Caffe computes, which decides what it allocates. Each device is estimated with the engine a job "
             f"trains with there: {policy.engine('gpu')} on a GPU, {policy.engine('cpu')} on the CPU."),
        Term("iter_size", "iter_size",
             "Caffe's gradient accumulation: batch b × iter_size k runs k passes of b items and adds up their "
             "gradients before each weight update, so it trains like a batch of b·k in the memory of a batch of b."),
        Term("usable", "usable",
             "The free memory a job may plan with: the device's free memory less a safety margin "
             f"({policy.gpu_safety_margin:.0%} on a GPU, {policy.cpu_safety_margin:.0%} on the CPU) for what the "
             "estimate cannot see (a driver's own allocations, other processes growing)."),
        Term("reserved", "reserved",
             "GPU memory the NVIDIA driver keeps for itself: neither used by a process nor free."),
        Term("memory_source", "where the figures come from",
             "GPUs: NVML, the NVIDIA driver's management library (nvml_v2: its version 2 memory query, which "
             "reports reserved memory; nvml_v1: older drivers, without it). The CPU: /proc/meminfo (meminfo: "
             "MemAvailable, what can be allocated without swapping), lowered to the memory limit of the server's "
             "cgroup (cgroup_v1, cgroup_v2) when it has one."),
        Term("validation", "validation batch × passes",
             "At every validation interval the validation net runs a number of passes (Validation iterations, "
             "Caffe's test_iter) of its batch: batch 32 × 100 passes reads 3,200 validation items each time, so a "
             "smaller validation set is read more than once. It is a second net in memory, beside the training net."),
        Term("one_gpu", "one device per job",
             "A job trains on one GPU, or on the CPU. DIGITS can split a job over several GPUs (each holds a whole "
             "copy of the net); this plugin plans and trains each job on a single device."),
    )


def page_terms(policy: PlanningPolicy) -> dict[str, Any]:
    """Everything the New model page's script needs to word the panel: categories, engines, terms by key."""
    return {
        "categories": [term.to_json() for term in CATEGORY_TERMS.values()],
        "engines": {key: term.to_json() for key, term in ENGINE_TERMS.items()},
        "terms": {term.key: term.to_json() for term in terms(policy)},
    }
