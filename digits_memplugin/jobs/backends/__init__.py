"""Where an attempt runs: children of this server, or Ray jobs on a cluster's nodes. The attempt's child process
(`attempt_process.py`) and its stuck-attempt watchdog (`watchdog.py`) are the local backend's, and the node wrapper
runs the same on a cluster's host."""

from __future__ import annotations

LOCAL = "local"
RAY = "ray"
JOB_BACKENDS = (LOCAL, RAY)
"""The backends a server may run attempts through (`MEMPLUGIN_BACKEND`, `serve --backend`); stdlib only, so that
the settings can name them without loading a backend."""
