"""The core: prototxt loading, phase filtering, shape inference, the memory model, the batch planner.

Plain Python: nothing here imports Flask, gevent, pynvml, sqlite3 or subprocess, and nothing loads Caffe's C++
library (caffe_pb2 is loaded on its own, see `proto`). The CLI, the REST API, the web form and the job manager all
call into it.
"""
