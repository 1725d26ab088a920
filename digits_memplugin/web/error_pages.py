"""HTTP errors of the plugin's pages in the site's layout (templates/memplugin/error.html), with a way back to the
jobs list, instead of Werkzeug's bare page. API paths keep their JSON errors (web/api/envelope.py json_error)."""

from __future__ import annotations

from flask import current_app, make_response, render_template, url_for
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException

from .. import __version__


def error_page(error: HTTPException) -> ResponseReturnValue:
    """The error as an HTML page with its status; its own headers (Allow, Retry-After) are kept."""
    code = error.code or 500
    jobs = "memplugin.jobs" in current_app.view_functions
    response = make_response(
        render_template(
            "memplugin/error.html",
            code=code,
            name=error.name,
            description=error.description or error.name,
            jobs_url=url_for("memplugin.jobs") if jobs else None,
            version=__version__,
        ),
        code,
    )
    for name, value in error.get_headers():
        if name.lower() != "content-type":
            response.headers[name] = value
    return response
