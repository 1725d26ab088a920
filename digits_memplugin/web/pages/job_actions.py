"""Cancel and delete from the jobs list, with a confirmation first (issue 26, point 10).

    POST <prefix>/jobs/<id>/confirm/<action>     action "cancel" or "delete", a form post with its CSRF token:
                                                 without `confirmed=yes`, the confirmation page (200); with it, the
                                                 action, then 303 back to the jobs list (409 page: why not)

With JavaScript the list's buttons ask in a dialog of the page and call the REST API (static/js/job-actions.js);
without it each button is this form post, so the confirmation is a page of its own. Both say the same thing: what
the action does to the job and its files (CONFIRMATIONS).
"""

from __future__ import annotations

from flask import Blueprint, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_wtf.csrf import validate_csrf
from werkzeug.exceptions import NotFound
from wtforms.validators import ValidationError

from ... import __version__
from ...jobs.errors import JobNotFound, JobStateError
from ...jobs.manager import JobManager
from ...jobs.store.records import ACTIVE_STATES, RUNNING, Job
from ..api.envelope import job_or_404
from ..plugin_state import current_plugin

CONFIRMATIONS = {
    "cancel": {
        "question": "Cancel the job “{name}”?",
        "detail": "Its training stops after a snapshot of where it got (a job still waiting has nothing to save), and "
                  "Resume on its page trains on from it.",
        "button": "Cancel the job",
        "keep": "Let it train",
        "done": "cancelled",
    },
    "delete": {
        "question": "Delete the job “{name}”?",
        "detail": "Its attempts, Caffe's logs and its snapshots (the trained weights) are removed for good. Download "
                  "the trained model from its page first to keep it.",
        "button": "Delete the job",
        "keep": "Keep it",
        "done": "deleted",
    },
}
"""What each action asks and says; static/js/job-actions.js reads the same from the page (`confirmations`)."""


def _manager() -> JobManager:
    return current_plugin().started_jobs()


def confirmations() -> dict[str, dict[str, str]]:
    return CONFIRMATIONS


def _page(job: Job, action: str, error: str | None = None, status: int = 200) -> ResponseReturnValue:
    page = render_template(
        "memplugin/job_confirm.html", job=job, action=action, text=CONFIRMATIONS[action], error=error,
        version=__version__,
    )
    return page, status


def confirm_action(job_id: str, action: str) -> ResponseReturnValue:
    if action not in CONFIRMATIONS:
        raise NotFound(f"a job can be cancelled or deleted from the list, not {action[:40]!r}")
    manager = _manager()
    job = job_or_404(manager, job_id)
    try:
        validate_csrf(request.form.get("csrf_token"))
    except ValidationError as problem:
        return _page(job, action, f"The job was not {CONFIRMATIONS[action]['done']}: {problem} Reload the list and "
                                  "try again.", 400)
    if request.form.get("confirmed") != "yes":
        return _page(job, action)
    try:
        if action == "cancel":
            manager.cancel(job_id)
        elif job.status == RUNNING:
            return _page(job, action, "The job was not deleted: it is running; cancel it first.", 409)
        else:
            manager.delete(job_id)
    except JobNotFound as missing:
        raise NotFound(str(missing)) from None
    except JobStateError as error:
        return _page(manager.get(job_id), action, f"The job was not {CONFIRMATIONS[action]['done']}: {error}.", 409)
    return redirect(url_for(".jobs"), code=303)


def list_action(job: dict[str, object]) -> str | None:
    """The action the jobs list offers for a job document: cancel while it waits or trains, delete otherwise."""
    return "cancel" if job.get("status") in ACTIVE_STATES else "delete"


def register(blueprint: Blueprint) -> None:
    blueprint.add_url_rule("/jobs/<job_id>/confirm/<action>", "confirm_job_action", confirm_action, methods=["POST"])
