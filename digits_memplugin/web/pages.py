"""HTML pages of the plugin."""

from __future__ import annotations

from flask import Blueprint, current_app, render_template, url_for

from .. import __version__
from ..devices import probe_gpus

# The plugin's pages and API documents, in menu order: (endpoint, label, what it is for).
# A page shows in the menu once its feature has registered the endpoint.
PAGES: tuple[tuple[str, str, str], ...] = (
    ("memplugin.new_model", "New model", "pick a network and a batch size that fits the GPU"),
    ("memplugin.jobs", "Jobs", "training runs with their attempts and live progress"),
    ("memplugin.devices_page", "Devices", "free, used and reserved memory of each GPU, live"),
    ("memplugin.api_devices", "API: devices", "GET the device list as JSON"),
    ("memplugin.api_health", "API: health", "GET the plugin's version and state as JSON"),
)


def home() -> str:
    """What the plugin is, links to its pages, and a banner when no GPU is detected."""
    available = [
        (url_for(endpoint), label, purpose)
        for endpoint, label, purpose in PAGES
        if endpoint in current_app.view_functions
    ]
    return render_template("memplugin/home.html", pages=available, gpus=probe_gpus(), version=__version__)


def register(blueprint: Blueprint) -> None:
    blueprint.add_url_rule("/", "home", home)
