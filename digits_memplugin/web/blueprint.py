"""The plugin's blueprint: one per `init_app` call, assembled from the feature modules' routes."""

from __future__ import annotations

from flask import Blueprint

from ..host.resources import static_dir, templates_dir
from . import access
from .api import datasets as api_datasets
from .api import devices as api_devices
from .api import downloads as api_downloads
from .api import envelope as api
from .api import estimate as api_estimate
from .api import jobs as api_jobs
from .api import openapi as api_openapi
from .frame_guard import forbid_framing
from .pages import job_actions, job_clone, pages

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
