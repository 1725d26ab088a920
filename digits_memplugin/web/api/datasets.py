"""`GET <prefix>/api/datasets`: the datasets found under MEMPLUGIN_DATASET_ROOTS (dataset_scan.py), as JSON.

    {"roots": ["/srv/data/datasets"], "truncated": null,
     "datasets": [{"name": "digits_train_lmdb", "path": "/srv/data/datasets/digits_train_lmdb", "root": "...",
                   "format": "lmdb", "shape": [1, 28, 28], "entries": 1437, "disk_bytes": 1236992, "error": null}]}

The scan is bounded (depth, entries, datasets, time: `truncated` says which bound stopped it); links out of the
roots are neither followed nor listed; a dataset that cannot be read is listed with an error naming the file.
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint, jsonify
from flask.typing import ResponseReturnValue

from ...estimate import dataset_scan
from ..plugin_state import current_plugin
from .envelope import API_PATH


def dataset_roots() -> tuple[Path, ...]:
    """The folders jobs read data from: the job manager's (MEMPLUGIN_DATASET_ROOTS, else <data dir>/datasets)."""
    return tuple(current_plugin().jobs.config.dataset_roots)


def list_datasets() -> ResponseReturnValue:
    return jsonify(dataset_scan.scan(dataset_roots()).to_json())


def register(blueprint: Blueprint) -> None:
    blueprint.add_url_rule(f"{API_PATH}/datasets", "api_datasets", list_datasets)
