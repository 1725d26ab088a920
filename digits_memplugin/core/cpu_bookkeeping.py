"""The CPU engine's costs beyond its blobs' bytes, as constants: what glibc's malloc adds to each allocation (its
chunk layout, and the mmap threshold as measured under pycaffe) and Caffe's own objects per process, thread, net,
layer, blob and param, fitted with bench/bookkeeping.py (mallinfo2 of pycaffe on nets of 20 tiny layers of one type,
where bookkeeping is nearly all there is; docs/memory-model.md, "Caffe's own bookkeeping on the CPU"). The memory
model (core/memory.py: `_allocation`, `cpu_bookkeeping_bytes`) adds them up.
"""

from __future__ import annotations

CPU_ALLOCATION_OVERHEAD = 16
"""glibc's chunk header and alignment per malloc'd buffer (CPU engine only)."""
CPU_MMAP_THRESHOLD = 1024 * 1024
"""glibc serves a request this large or larger with its own mmap, whole pages plus a header: its threshold starts at
128 KiB and rises to the size of any mmap'd chunk freed; importing pycaffe (numpy, protobuf) leaves it between 900
KiB and 950 KiB, measured with mallinfo2's hblks."""
CPU_PAGE_BYTES = 4096
CPU_SIZE_BYTES = 8
"""glibc's SIZE_SZ: the size field in front of every chunk."""
CPU_ALIGNMENT = 16
CPU_RUNTIME_BYTES = 408 * 1024
"""A CPU training process's own bookkeeping, once: protobuf's descriptor tables for caffe.proto, built at the first
parse, the solver's objects, registries. This and the constants below were measured with bench/bookkeeping.py
(mallinfo2 of pycaffe on nets of 20 tiny layers of one type, so that bookkeeping is nearly all there is)."""
CPU_THREAD_BYTES = 30 * 1024
"""Per prefetch or reader thread: its thread-local storage blocks and its own Caffe RNG (massif)."""
CPU_LAYER_BYTES = 1536
"""Per layer of a net: the layer object, its LayerParameter copy, the net's per-layer vectors and names."""
CPU_BLOB_BYTES = 614
"""Per blob of a net (an in-place top is no new blob): the Blob and SyncedMemory objects, its shape, its name."""
CPU_PARAM_BYTES = 800
"""Per param blob a layer makes, in every net (a test net's layers make their own before sharing the train net's)."""
CPU_LEARNABLE_PARAM_BYTES = 1330
"""Per learnable param of the train net (shared names count once): the solver's history, update and temp Blobs."""
CPU_LAYER_BUFFER_BYTES = 400
"""Per internal blob of a layer type not in CPU_LAYER_TYPE_BYTES (each Buffer of its rule, gradients aside)."""
CPU_LAYER_TYPE_BYTES: dict[str, int] = {
    # Measured per layer type: its internal blobs (Convolution's five int shape blobs, col_buffer_ and
    # bias_multiplier_; BatchNorm's seven...), and for a layer that wraps inner layers, their objects too.
    "Convolution": 2840,
    "Deconvolution": 2840,
    "BatchNorm": 1880,
    "Pooling": 665,
    "Dropout": 460,
    "Softmax": 850,
    "LRN": 1075,
    "Scale": 820,
    "PReLU": 630,
    "InnerProduct": 30,
    "SoftmaxWithLoss": 3040,
    "SigmoidCrossEntropyLoss": 2025,
    "EuclideanLoss": 410,
    "Accuracy": 300,
    "Data": 5400,
    "ImageData": 5400,
    "WindowData": 5400,
}
CPU_LRN_WITHIN_CHANNEL_BYTES = 7000
"""LRN with WITHIN_CHANNEL: its five inner layers (split, square, pool, power, product) and their five blobs."""
CPU_SCALE_BIAS_BYTES = 1765
"""Scale with bias_term: its inner Bias layer (a copy of the Scale's LayerParameter) and bias_multiplier_."""
