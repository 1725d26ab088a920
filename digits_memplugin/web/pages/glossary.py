"""The words the pages show that a new user may not know (nvml_v2, iter_size, host_allocation_failed, SIGTERM...),
each explained in a sentence or two of plain words.

One source for every page: templates put a term through the `term` macro (templates/memplugin/terms.html: the word
itself, linked to its entry on the glossary page, the short text as its title), scripts through
`MemPlugin.term` (static/js/glossary.js), which reads the same texts from the page (`to_json`). The glossary page
(`<prefix>/glossary`) lists them all. A word with no entry is shown as it is.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Final


@dataclasses.dataclass(frozen=True)
class Term:
    """One entry: what it is called on the pages, its one-line explanation, and more where one line is not enough."""

    key: str
    title: str
    short: str
    more: str = ""

    @property
    def anchor(self) -> str:
        """The entry's id on the glossary page: "term-" and the key with anything but letters, digits, "-" and "_"
        replaced (keys such as "gpu-cudnn" stay as they are)."""
        return "term-" + re.sub(r"[^A-Za-z0-9_-]", "-", self.key)

    def to_json(self) -> dict[str, str]:
        return {"title": self.title, "short": self.short, "anchor": self.anchor}


OUTCOME: Final = "outcome_"
"""The key of an attempt's outcome is this and the outcome (core.oom's OUTCOME_*): "cancelled" alone would be a
job's status too."""


def _terms(*terms: Term) -> dict[str, Term]:
    return {term.key: term for term in terms}


GROUPS: Final[tuple[tuple[str, tuple[str, ...]], ...]] = (
    ("Where memory figures come from", ("nvml_v2", "nvml_v1", "meminfo", "cgroup_v1", "cgroup_v2", "reserved")),
    ("Engines: how Caffe computes on a device", ("cpu", "gpu", "gpu-cudnn")),
    ("Batches", ("iter_size", "validation_batch")),
    ("Where the validation nets live", ("shared", "apart", "tester")),
    ("How an attempt ended", tuple(f"{OUTCOME}{status}" for status in (
        "success", "out_of_memory", "replanned", "diverged", "failed", "cancelled", "interrupted",
    ))),
    ("Why an attempt ran out of memory", (
        "host_allocation_failed", "cpp_bad_alloc", "python_memory_error", "openblas_malloc_failed",
        "blas_allocation_retry", "sigkill", "pinned_host_out_of_memory", "cuda_out_of_memory", "cudnn_alloc_failed", "cudnn_internal_error",
        "cudnn_execution_failed", "nvcaffe_out_of_memory", "nvcaffe_failed_to_allocate", "nvcaffe_safe_reserve",
    )),
    ("How a process ended", ("SIGINT", "SIGTERM", "SIGKILL", "SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL")),
)
"""The glossary page's sections, in order; every term is in one."""

TERMS: Final[dict[str, Term]] = _terms(
    # --- memory sources (the Devices page: "memory from ...") ------------------------------------------------------
    Term("nvml_v2", "nvml_v2",
         "Read from the NVIDIA driver (NVML, memory info version 2): free, used and reserved memory, separately.",
         "NVML is the library nvidia-smi uses. Its version 2 reading splits off the memory the driver reserves for "
         "itself, so free + used + reserved = total. Jobs are fitted into the free memory."),
    Term("nvml_v1", "nvml_v1",
         "Read from the NVIDIA driver (NVML, memory info version 1): free and used; the driver's reserve is counted "
         "in used.",
         "An older driver answers only version 1 of NVML's memory reading; reserved then shows n/a."),
    Term("meminfo", "meminfo",
         "Read from the Linux kernel's /proc/meminfo: the machine's memory and what is available to new programs.",
         "Available is what a CPU job can allocate without pushing other programs into swap."),
    Term("cgroup_v1", "cgroup v1",
         "Read from the memory limit of the container this server runs in (Linux cgroups, version 1).",
         "The container may have less memory than the machine: its limit is what a CPU job can really use."),
    Term("cgroup_v2", "cgroup v2",
         "Read from the memory limit of the container this server runs in (Linux cgroups, version 2).",
         "The container may have less memory than the machine: its limit is what a CPU job can really use."),
    Term("reserved", "Reserved",
         "Memory the NVIDIA driver keeps for itself: no program can use it.",
         "Only NVML's version 2 reading reports it; with version 1 it is part of used."),
    # --- engines ------------------------------------------------------------------------------------------------------
    Term("cpu", "cpu (engine)",
         "Caffe computes on the processor, with its BLAS library; memory comes from the machine's RAM."),
    Term("gpu", "gpu (engine)",
         "Caffe computes on an NVIDIA GPU with its own CUDA code, without cuDNN.",
         "Convolutions then use an im2col buffer per layer instead of cuDNN's workspaces."),
    Term("gpu-cudnn", "gpu-cudnn (engine)",
         "Caffe computes on an NVIDIA GPU and hands convolutions and pooling to NVIDIA's cuDNN library.",
         "cuDNN is faster and takes some extra workspace memory per convolution; it is the usual engine on a GPU."),
    # --- batches ------------------------------------------------------------------------------------------------------
    Term("iter_size", "iter_size",
         "How many batches Caffe adds up before it updates the weights once: batch 64 × iter_size 4 trains like "
         "batch 256 in the memory of batch 64.",
         "When a batch does not fit, the job takes a smaller batch and a larger iter_size, so each update still "
         "sees as many images (the effective batch)."),
    Term("validation_batch", "Validation batch",
         "How the validation set is read at each test: batch B × P passes reads B × P images, then the results "
         "are averaged.",
         "Passes come from the solver's test_iter. A smaller validation batch with more passes reads the same "
         "images in less memory."),
    # --- the validation nets (core/test_net_modes.py) -------------------------------------------------------------
    Term("shared", "shared (test nets)",
         "The validation nets live beside the train net in the training process, on its device, for the whole run "
         "(Caffe's own way): the device holds both at once.",
         "When they do not fit beside it, the plan shrinks the validation batch (with more passes) before the "
         "train batch."),
    Term("apart", "apart (test nets)",
         "The train net has the device to itself; at each validation interval a tester process builds the "
         "validation nets from that interval's snapshot and tests it.",
         "On another device the tester runs while training goes on; on the training device, training pauses "
         "for it and resumes where it was. The results are the same as shared, at the same iterations. A job's "
         "\"auto\" keeps them apart only where that trains a larger batch (or fewer iter_size passes) and pausing "
         "costs under 5% of an interval."),
    Term("tester", "tester",
         "The process that tests one snapshot with the validation nets apart: it reports the same validation "
         "results as the training process would, then ends.",
         "Its memory is the validation nets alone, at their own batch. \"Stop cost\" is the time pausing training "
         "for it and resuming takes, against the training time of one validation interval."),
    # --- how an attempt ended (core/oom.py's outcomes) ---------------------------------------------------------------
    Term(f"{OUTCOME}success", "success", "The attempt trained to the end: the job is done."),
    Term(f"{OUTCOME}out_of_memory", "out of memory",
         "The attempt ran out of memory; the job retries with a smaller batch (and a larger iter_size, so each "
         "update still sees as many images)."),
    Term(f"{OUTCOME}replanned", "replanned",
         "The attempt stopped on purpose after a snapshot, so that the next one trains with a better plan; "
         "nothing is lost, and the next attempt goes on from that snapshot.",
         "With the validation nets apart on the training device (the job's \"auto\"), pausing training for the "
         "tester was measured on the first interval to cost 5% of an interval or more: the next attempt keeps "
         "the validation nets shared instead."),
    Term(f"{OUTCOME}diverged", "diverged",
         "The loss became NaN or infinite (too high a learning rate, usually): the job stopped, as DIGITS does."),
    Term(f"{OUTCOME}failed", "failed",
         "The attempt ended on an error other than memory; its Why and Caffe's log say which."),
    Term(f"{OUTCOME}cancelled", "cancelled",
         "You cancelled the job: the attempt saved a snapshot and stopped; Resume continues from it."),
    Term(f"{OUTCOME}interrupted", "interrupted",
         "The server stopped while the attempt ran; Resume continues from the last snapshot."),
    # --- out-of-memory signatures (core/oom.py) ----------------------------------------------------------------------
    Term("host_allocation_failed", "host_allocation_failed",
         "Caffe asked for more of the machine's memory (RAM) than the job may use, and the request failed.",
         "On the CPU a job runs under a memory cap; Caffe's own check then stops it with \"host allocation of size "
         "N failed\". The job retries with a smaller batch."),
    Term("cpp_bad_alloc", "cpp_bad_alloc",
         "A C++ library inside Caffe asked for memory and got none (std::bad_alloc): the machine's memory or the "
         "job's cap ran out."),
    Term("python_memory_error", "python_memory_error",
         "Python itself could not get memory (MemoryError) while the job ran: the job's memory cap or the "
         "machine's memory ran out."),
    Term("openblas_malloc_failed", "openblas_malloc_failed",
         "The BLAS library Caffe computes with could not get its work buffer: the job's memory ran out."),
    Term("blas_allocation_retry", "blas_allocation_retry",
         "The BLAS library kept retrying a memory allocation that could not succeed, so the watchdog stopped the "
         "job: its memory had run out."),
    Term("sigkill", "sigkill (out of memory, likely)",
         "The process was killed with SIGKILL, which this server did not send: most likely the kernel's "
         "out-of-memory killer, because the machine or its container ran out of memory."),
    Term("pinned_host_out_of_memory", "pinned_host_out_of_memory",
         "A GPU job could not lock (pin) a piece of the machine's memory for its transfers to the GPU: the "
         "machine's memory ran out, not the GPU's.",
         "Caffe keeps page-locked host copies of some blobs (cudaMallocHost). The job retries with a smaller batch; "
         "if it keeps failing, other processes hold the machine's memory."),
    Term("cuda_out_of_memory", "cuda_out_of_memory",
         "The GPU had no free memory left for what Caffe asked (cudaMalloc said \"out of memory\")."),
    Term("cudnn_alloc_failed", "cudnn_alloc_failed",
         "NVIDIA's cuDNN library could not get GPU memory for its work buffers."),
    Term("cudnn_internal_error", "cudnn_internal_error",
         "cuDNN reported an internal error; near the memory limit this usually means it ran out of memory (not "
         "certain, so shown as likely)."),
    Term("cudnn_execution_failed", "cudnn_execution_failed",
         "A cuDNN computation failed on the GPU; near the memory limit this is usually memory (not certain, so "
         "shown as likely)."),
    Term("nvcaffe_out_of_memory", "nvcaffe_out_of_memory",
         "NVIDIA's Caffe (NVcaffe) could not allocate GPU memory: the GPU was full."),
    Term("nvcaffe_failed_to_allocate", "nvcaffe_failed_to_allocate",
         "NVcaffe's memory pool could not allocate what Caffe asked on the GPU: the GPU was full."),
    Term("nvcaffe_safe_reserve", "nvcaffe_safe_reserve",
         "NVcaffe could not reserve the workspace it wanted on the GPU: not enough free GPU memory."),
    # --- signals --------------------------------------------------------------------------------------------------------
    Term("SIGINT", "SIGINT",
         "A request to stop at the next step: this server sends it when you cancel a job, and the training process "
         "saves a snapshot of where it got before it ends (Resume continues from it), as Ctrl-C does to caffe train.",
         "A process that has not stopped within the cancel's bound (MEMPLUGIN_JOB_CANCEL_SECONDS) gets SIGTERM."),
    Term("SIGTERM", "SIGTERM",
         "A request to stop now: this server sends it to a job's process that did not stop after a cancel's SIGINT "
         "within its bound (or when training must stop), and the process ends without a snapshot.",
         "If the process has not stopped after a grace period, SIGKILL follows."),
    Term("SIGKILL", "SIGKILL",
         "An order to stop at once, which a process cannot refuse: sent by this server when SIGTERM was not enough, "
         "or by the kernel when memory runs out."),
    Term("SIGABRT", "SIGABRT",
         "The process stopped itself on an error: Caffe does this when one of its checks fails (running out of "
         "memory is one such check). The log's last lines say which."),
    Term("SIGSEGV", "SIGSEGV",
         "The process crashed reading memory it does not own (a segmentation fault): a bug in Caffe or a library, "
         "or a damaged file."),
    Term("SIGBUS", "SIGBUS",
         "The process crashed reading a file that was cut short or changed while it was mapped (often a dataset "
         "still being copied)."),
    Term("SIGFPE", "SIGFPE",
         "The process crashed on an arithmetic error (an integer division by zero): a bug in Caffe or a layer."),
    Term("SIGILL", "SIGILL",
         "The process crashed on an instruction this CPU does not have: a Caffe or BLAS built for a newer CPU."),
)

def outcome(status: str | None) -> Term | None:
    """The entry of an attempt's outcome ("replanned", "out_of_memory"...), None for a status without one."""
    return TERMS.get(f"{OUTCOME}{status}") if status else None


_ALIASES: Final[dict[str, str]] = {"cgroup v1": "cgroup_v1", "cgroup v2": "cgroup_v2"}


def find(word: str | None) -> Term | None:
    """The entry for a word as a page shows it ("nvml_v2", "SIGTERM", "gpu-cudnn"); None when it has none."""
    if not word:
        return None
    key = _ALIASES.get(word, word)
    return TERMS.get(key) or TERMS.get(key.lower())


def to_json() -> dict[str, dict[str, str]]:
    """Every entry by key, for the pages' scripts (`MemPlugin.term`)."""
    return {key: term.to_json() for key, term in TERMS.items()}


def sections() -> list[tuple[str, list[Term]]]:
    """The glossary page's sections with their entries."""
    return [(heading, [TERMS[key] for key in keys]) for heading, keys in GROUPS]
