"""`GET <prefix>/api/openapi.json`: the OpenAPI 3.1 description of the REST API, so that scripts and client
generators need not read the source.

The document is a maintained file beside this module (openapi.json), not generated from the views: its field
descriptions are written for people, and tests/test_openapi.py holds it to the routes and to real answers. Its
paths are relative to the API root; the served copy's `servers` names where this server has the API (the prefix
and any script root), so the same file serves every app.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any

from flask import Blueprint, current_app, url_for
from flask.typing import ResponseReturnValue

from .envelope import API_PATH

DOCUMENT = "openapi.json"
ENDPOINT = "api_openapi"


@functools.cache
def load_document() -> dict[str, Any]:
    """The document as shipped in the package (read once per process)."""
    text = resources.files(__package__).joinpath(DOCUMENT).read_text(encoding="utf-8")
    return json.loads(text)  # type: ignore[no-any-return]


def api_root() -> str:
    """Where this app serves the API (`/memplugin/api` by default): the document's server URL."""
    return url_for(f".{ENDPOINT}").rsplit("/", 1)[0]


def openapi_document() -> ResponseReturnValue:
    document = {**load_document(), "servers": [{"url": api_root(), "description": "this server"}]}
    # Written in the file's order (paths as the API reads, schemas after), not jsonify's sorted keys.
    return current_app.response_class(json.dumps(document, ensure_ascii=False), mimetype="application/json")


def register(blueprint: Blueprint) -> None:
    blueprint.add_url_rule(f"{API_PATH}/{DOCUMENT}", ENDPOINT, openapi_document)
