"""The words devices and automatic choices are named by, one constant per fact, shared by the devices' records, job
requests, the planner, the training child and the New model form.

"cpu" names the CPU device wherever it appears: its kind, its key in the devices document and in a job's `device`,
and the form's choice; a GPU's kind is "gpu" (its key is its UUID). "auto" is a choice left to the plugin: the
largest batch that fits, or the device the scheduler picks.
"""

from __future__ import annotations

from typing import Final

CPU: Final = "cpu"
GPU: Final = "gpu"
AUTO: Final = "auto"
