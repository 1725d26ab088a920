"""The words for where a job's test nets live (issue 28), one constant each, apart from the memory model that
counts each placement (core.test_nets), so that the training child and the request's checks read them without
loading the estimator."""

from __future__ import annotations

from typing import Final

TEST_NET_SHARED: Final = "shared"
"""The test nets beside the train net in the trainer's process, sharing its weights (Caffe's own way)."""
TEST_NET_APART: Final = "apart"
"""The test nets in a tester process of their own, on a snapshot's weights: the trainer's device holds no test net."""
TEST_NET_AUTO: Final = "auto"
"""`apart` only where it pays (core.planning.apart.choose_test_net), else `shared`."""
TEST_NET_MODES: Final = (TEST_NET_SHARED, TEST_NET_APART, TEST_NET_AUTO)

TRAINER: Final = "trainer"
TESTER: Final = "tester"
"""The two processes of an attempt whose test nets are apart (which one ran out of memory, say)."""

SAME_DEVICE: Final = "same"
"""A job's `tester_device` when its tester must share the trainer's device (the trainer stops while it runs)."""
