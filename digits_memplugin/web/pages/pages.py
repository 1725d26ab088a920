"""HTML pages of the plugin, and what every page's template may use (the live-update settings among them)."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, render_template, request, url_for
from flask_wtf.csrf import generate_csrf

from ... import __version__
from ...core.device_kinds import CPU, GPU
from ...core.errors import MemPluginError
from ...core.oom import signal_words
from ...core.sizes import format_size
from ...devices.reader import DeviceList, is_simulated
from ..api import devices as api_devices
from ..api import downloads as api_downloads
from ..plugin_state import current_plugin
from . import glossary, job_actions, job_clone, job_pages, model_page

# The plugin's pages and API documents, in menu order: (endpoint, label, what it is for).
# A page shows in the menu once its feature has registered the endpoint.
PAGES: tuple[tuple[str, str, str], ...] = (
    ("memplugin.new_model", "New model", "pick a network and a batch size that fits the GPU"),
    ("memplugin.jobs", "Jobs", "training runs with their attempts and live progress"),
    ("memplugin.devices_page", "Devices", "free, used and reserved memory of each GPU, live"),
    ("memplugin.api_devices", "API: devices", "GET the device list as JSON"),
    ("memplugin.api_health", "API: health", "GET the plugin's version and state as JSON"),
)


def _read_devices() -> DeviceList:
    return current_plugin().devices.read()


def home() -> str:
    """What the plugin is, links to its pages, and a banner when no GPU is detected."""
    available = [
        (url_for(endpoint), label, purpose)
        for endpoint, label, purpose in PAGES
        if endpoint in current_app.view_functions
    ]
    return render_template("memplugin/home.html", pages=available, devices=_read_devices(), version=__version__)


def devices_page() -> str:
    """The device table as the server sees it now, with the training attempts each device runs; the live panel of
    the model form pushes the same devices over socketio, and static/js/devices.js keeps both up to date."""
    plugin = current_plugin()
    try:
        attempts, attempts_error = api_devices.running_attempts(), None
    except MemPluginError as error:  # the jobs database cannot be read: the devices still can
        attempts, attempts_error = [], str(error)
    policy = plugin.jobs.config.policy
    return render_template(
        "memplugin/devices.html", devices=_read_devices(), caffe=plugin.caffe, attempts=attempts,
        attempts_error=attempts_error, engines={CPU: policy.engine(CPU), GPU: policy.engine(GPU)},
        version=__version__,
    )


def glossary_page() -> str:
    """Every word the pages explain (digits_memplugin/web/pages/glossary.py), by section; each page's terms link here."""
    return render_template("memplugin/glossary.html", sections=glossary.sections(), version=__version__)


def _page_context() -> dict[str, Any]:
    """What every page of the plugin may use: whether the GPUs are simulated (a banner says so), byte formatting,
    the menu, where the live-update script connects, a CSRF token for pages whose scripts post, times, and the
    glossary's explanations of words (templates/memplugin/terms.html).

    App-wide, not blueprint-wide: the standalone app serves the home page at "/", outside the blueprint. The names
    carry the plugin's prefix so they cannot clash with a host app's own template variables.
    """
    return {
        "memplugin_simulated": is_simulated(),
        "memplugin_size": format_size,
        "memplugin_menu": _menu,
        "memplugin_live": _live_settings,
        "memplugin_csrf_token": generate_csrf,
        "memplugin_time": job_pages.format_time,
        "memplugin_duration": job_pages.format_duration,
        "memplugin_signal_words": signal_words,
        "memplugin_term": glossary.find,
        "memplugin_outcome": glossary.outcome,
        "memplugin_glossary": glossary.to_json,
        "memplugin_job_files": api_downloads.page_files,
        "memplugin_clone_url": job_clone.clone_url,
        "memplugin_confirmations": job_actions.confirmations,
        "memplugin_list_action": job_actions.list_action,
        "memplugin_pace": job_pages.pace_text,
    }


def _menu() -> list[tuple[str, str]]:
    """The pages (not the API documents) whose feature is registered, as (href, label)."""
    return [
        (url_for(endpoint), label)
        for endpoint, label, _ in PAGES
        if endpoint in current_app.view_functions and ".api_" not in endpoint
    ]


def _live_settings() -> dict[str, str]:
    """What static/js/memplugin.js needs to talk to this server: the socketio namespace and path, the API URLs.

    The path is the host's: flask-socketio wraps the app's WSGI callable in middleware that knows it.
    """
    path = getattr(current_app.wsgi_app, "engineio_path", "/socket.io/")
    return {
        "namespace": current_plugin().settings.socketio_namespace,
        "socketio_path": request.script_root + "/" + path.strip("/"),
        "devices_url": url_for("memplugin.api_devices"),
        "estimate_url": url_for("memplugin.api_estimate"),
        "jobs_url": url_for("memplugin.jobs"),
    }


def register(blueprint: Blueprint) -> None:
    blueprint.add_url_rule("/", "home", home)
    blueprint.add_url_rule("/devices", "devices_page", devices_page)
    blueprint.add_url_rule("/glossary", "glossary", glossary_page)
    model_page.register(blueprint)
    job_pages.register(blueprint)
    blueprint.app_context_processor(_page_context)
