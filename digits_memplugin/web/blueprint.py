"""The plugin's blueprint: one per `init_app` call, assembled from the feature modules' routes."""

from __future__ import annotations

from flask import Blueprint

from ..resources import static_dir, templates_dir
from . import (
    access,
    api,
    api_datasets,
    api_devices,
    api_downloads,
    api_estimate,
    api_jobs,
    api_openapi,
    job_actions,
    job_clone,
    pages,
)
from .frame_guard import forbid_framing

BLUEPRINT_NAME = "memplugin"


def create_blueprint() -> Blueprint:
    blueprint = Blueprint(
        BLUEPRINT_NAME,
        __name__,
        template_folder=str(templates_dir()),
        static_folder=str(static_dir()),
        static_url_path="/static",
    )
    access.register(blueprint)
    pages.register(blueprint)
    api.register(blueprint)
    api_datasets.register(blueprint)
    api_devices.register(blueprint)
    api_estimate.register(blueprint)
    api_jobs.register(blueprint)
    api_downloads.register(blueprint)
    job_clone.register(blueprint)
    job_actions.register(blueprint)
    api_openapi.register(blueprint)
    blueprint.after_request(forbid_framing)
    return blueprint
