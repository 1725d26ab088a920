"""The jobs list and a job's page: first paint rendered here from the job documents, live parts kept up to date
by static/js/jobs.js and job-page.js over the socketio rooms `jobs` and `job:<id>`.

    GET  <prefix>/jobs                  the jobs with their status, newest first, a page at a time
                                        (?limit=N, default 50; ?before=<id> for older ones)
    GET  <prefix>/jobs/<id>             status, plan, attempts, progress, log tail, the definition as submitted
    POST <prefix>/jobs/<id>/cancel      cancel without JavaScript (a form with its CSRF token): 303 to the page
    POST <prefix>/jobs/<id>/delete      delete a job that is not running, the same way, in two steps: without
                                        confirm=yes the page asks (its snapshots named), with it 303 to the list
    POST <prefix>/jobs/<id>/resume      queue an interrupted, cancelled or failed job again: 303 to the page

The scripts use the REST API (`<prefix>/api/jobs/...`) instead of the POST routes; the API takes JSON from
scripts, these take a browser's form post, so they check the CSRF token.
"""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flask import Blueprint, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_wtf.csrf import validate_csrf
from werkzeug.exceptions import NotFound
from wtforms.validators import ValidationError

from ... import __version__
from ...core.device_kinds import AUTO, CPU
from ...core.oom import SIGNAL_WORDS
from ...core.sizes import format_size
from ...core.test_net_modes import SAME_DEVICE, TEST_NET_SHARED
from ...devices.reader import DeviceList
from ...jobs.definition.definition import SOLVER_SOURCE
from ...jobs.errors import JobNotFound, JobPageError, JobStateError
from ...jobs.events.pace import format_duration as format_time_left
from ...jobs.events.pace import format_rate
from ...jobs.manager import DEFAULT_PAGE_SIZE, JobManager
from ...jobs.store.records import ACTIVE_STATES, RUNNING
from ..api.jobs import page_limit
from ..plugin_state import current_plugin

LOG_TAIL_LINES = 60
"""Lines of Caffe's log on a job's first paint (the page's script then fetches more and follows the log)."""
REFRESH_SECONDS = 5
"""How often a page without JavaScript reloads itself while a job is queued or running."""
MAX_DEFINITION_BYTES = 1024 * 1024
"""A definition shown on the page is cut here (submissions are limited to MEMPLUGIN_MAX_REQUEST_BYTES anyway)."""


def _manager() -> JobManager:
    """The started job manager; another server holding the data folder is a 503 (web/api/envelope.py as_http_error)."""
    return current_plugin().started_jobs()


def _devices() -> DeviceList:
    return current_plugin().devices.read()


def device_labels(devices: DeviceList) -> dict[str, str]:
    """What a job's device key reads as: "CPU", "GPU 0: <name>"; "auto" is the form's "next available"."""
    labels = {AUTO: "next available GPU" if devices.gpus else "next available (the CPU)", CPU: "CPU"}
    for gpu in devices.gpus:
        labels[gpu.key] = f"GPU {gpu.index}{f' of {gpu.host}' if gpu.host else ''}: {gpu.name or 'n/a'}"
        if gpu.uuid:
            labels[gpu.uuid] = labels[gpu.key]
    for cpu in devices.other_cpus:
        labels[cpu.key] = f"CPU of {cpu.host}"
    return labels


def format_time(seconds: float | None) -> str:
    """Seconds since the epoch in the server's local time, as the pages show them; "" for None."""
    if seconds is None:
        return ""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seconds))


def pace_text(job: dict[str, Any]) -> str:
    """A running job's speed and time left, from its document: "14.6 it/s · 3 min 05 s left"; "measuring the
    speed…" until two records say; "" once it is not running (job-format.js: paceText)."""
    if job.get("status") != RUNNING:
        return ""
    rate, left = job.get("iterations_per_second"), job.get("seconds_left")
    if not isinstance(rate, (int, float)) or rate <= 0:
        return "measuring the speed…"
    return format_rate(rate) + (f" · {format_time_left(left)} left" if isinstance(left, (int, float)) else "")


def format_duration(seconds: float | None) -> str:
    """"12.3 s", "4 min 05 s", "1 h 02 min"; "" for None (still running)."""
    if seconds is None:
        return ""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, rest = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {rest:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"


def jobs_page() -> str:
    """One page of the list (as GET <prefix>/api/jobs pages it), with links to the older jobs and back."""
    limit = page_limit(request.args.get("limit"))
    try:
        page = _manager().page(limit, request.args.get("before"))
    except JobPageError as error:
        raise NotFound(str(error)) from None
    jobs = [job.to_json() for job in reversed(page.jobs)]
    active = any(job["status"] in ACTIVE_STATES for job in jobs)
    size: dict[str, Any] = {} if limit == DEFAULT_PAGE_SIZE else {"limit": limit}
    return render_template(
        "memplugin/jobs.html", jobs=jobs, labels=device_labels(_devices()), refresh=REFRESH_SECONDS if active else None,
        page=page, older_url=url_for(".jobs", before=page.older, **size) if page.older else None,
        newest_url=url_for(".jobs", **size) if page.before else None, version=__version__,
    )


def job_page(
    job_id: str, error: str | None = None, status: int = 200, confirm_delete: bool = False
) -> ResponseReturnValue:
    """A job's page; `confirm_delete`: with the question whether to delete it for good open (the first post of
    Delete without JavaScript)."""
    manager = _manager()
    try:
        document = manager.document(job_id)
    except JobNotFound as missing:
        raise NotFound(str(missing)) from None
    folder = manager.folder(job_id)
    snapshots = snapshot_models(folder)
    labels = device_labels(_devices())
    page = render_template(
        "memplugin/job.html",
        job=document,
        labels=labels,
        log_lines=_log_tail(manager, job_id),
        net_text=_read(folder / "net.prototxt"),
        solver_text=_read(folder / SOLVER_SOURCE),
        refresh=REFRESH_SECONDS if document["status"] in ACTIVE_STATES and not confirm_delete else None,
        action_error=error,
        confirm_delete=confirm_delete,
        deletion=deletion_words(snapshots),
        snapshots=snapshots,
        memory_cap=memory_cap_words(document, manager.config.cpu_memory_cap),
        test_net_asked=test_net_asked(manager.get(job_id).spec, labels),
        signal_words=SIGNAL_WORDS,
        version=__version__,
    )
    return page, status


_SNAPSHOT_MODEL = re.compile(r"_iter_(\d+)\.caffemodel(?:\.h5)?$")


def snapshot_models(folder: Path) -> list[str]:
    """The job's snapshots, by their model files ("snapshots/lenet_iter_200.caffemodel"), in iteration order: what
    Delete removes with the job (job-page.js adds those that training writes while the page is open)."""
    try:
        names = [entry.name for entry in (folder / "snapshots").iterdir() if _SNAPSHOT_MODEL.search(entry.name)]
    except OSError:
        return []
    return [f"snapshots/{name}" for name in sorted(names, key=_snapshot_iteration)]


def _snapshot_iteration(name: str) -> int:
    match = _SNAPSHOT_MODEL.search(name)
    return int(match.group(1)) if match else 0


def deletion_words(snapshots: list[str]) -> str:
    """What Delete takes with the job, as the confirmation says it (job-page.js: deletionWords)."""
    if not snapshots:
        return "It has no snapshot; its attempts' logs go with it."
    latest = max(map(_snapshot_iteration, snapshots))
    count = f"{len(snapshots)} snapshot" + ("s" if len(snapshots) > 1 else "")
    return f"Its {count} (the latest at iteration {latest}) and its attempts' logs go with it."


def memory_cap_words(job: dict[str, Any], server_cap: int | None) -> str:
    """The memory a job's CPU attempts may allocate (the job's `memory_cap` or the server's, the smaller; enforced
    on the child with RLIMIT_DATA), or why none applies."""
    device = job["device"]["assigned"] or job["device"]["requested"]
    if device not in (CPU, AUTO) and not str(device).startswith(CPU + "@"):
        return "none: a GPU job is planned against the GPU's free memory"
    own = job.get("memory_cap")
    caps = [cap for cap in (own, server_cap) if cap is not None]
    if not caps:
        return "none: the CPU's available memory"
    cap = min(caps)
    if own is not None and cap == own:
        note = "this job's" + (f"; the server's is {format_size(server_cap)}" if server_cap is not None else "")
    else:
        note = "the server's MEMPLUGIN_CPU_MEMORY_CAP" + (
            f"; this job asked for {format_size(own)}" if own is not None else "")
    where = " on the CPU" if device == AUTO else ""
    return f"{format_size(cap)}{where} ({note})"


def test_net_asked(spec: dict[str, Any], labels: dict[str, str]) -> str:
    """Where the job asked for its validation nets, as the summary says it: "auto", "shared", "apart", with the
    tester's device when one was named ("apart, tester on the training device")."""
    asked = spec.get("test_net") or TEST_NET_SHARED  # a job stored before the choice existed: Caffe's way
    tester = spec.get("tester_device")
    if asked == TEST_NET_SHARED or tester in (None, AUTO):
        return str(asked)
    return f"{asked}, tester on " + ("the training device" if tester == SAME_DEVICE else labels.get(tester, str(tester)))


def _log_tail(manager: JobManager, job_id: str) -> list[str]:
    try:
        path = manager.log_path(job_id)
    except (JobStateError, JobNotFound):
        return []
    if not path.is_file():
        return []
    with path.open("r", encoding="utf-8", errors="replace") as log:
        return [line.rstrip("\n") for line in deque(log, maxlen=LOG_TAIL_LINES)]


def _read(path: Path) -> str:
    try:
        with path.open("r", encoding="utf-8", errors="replace") as file:
            return file.read(MAX_DEFINITION_BYTES)
    except OSError:
        return ""


def _csrf_problem() -> str | None:
    """Why the form post's CSRF token is not accepted, or None when it is."""
    try:
        validate_csrf(request.form.get("csrf_token"))
    except ValidationError as error:
        return str(error)
    return None


def _job_action_form(job_id: str, done: str, action: Callable[[str], object]) -> ResponseReturnValue:
    """A job action posted from the page without JavaScript: the CSRF token checked, the action run, the page again
    (with why it was not `done` when it was not)."""
    problem = _csrf_problem()
    if problem is not None:
        return job_page(job_id, f"The job was not {done}: {problem} Reload the page and try again.", 400)
    try:
        action(job_id)
    except JobNotFound as missing:
        raise NotFound(str(missing)) from None
    except JobStateError as error:
        return job_page(job_id, f"The job was not {done}: {error}.", 409)
    return redirect(url_for(".job_page", job_id=job_id), code=303)


def cancel_job_form(job_id: str) -> ResponseReturnValue:
    """Cancel from the page without JavaScript; the page comes back with the job "cancelling" or cancelled."""
    return _job_action_form(job_id, "cancelled", _manager().cancel)


def delete_job_form(job_id: str) -> ResponseReturnValue:
    """Delete from the page without JavaScript, in two steps: the first post (no `confirm`) brings the page back
    asking whether to delete the job for good, naming its snapshots; the second (`confirm=yes`) deletes it and goes
    back to the jobs list."""
    problem = _csrf_problem()
    if problem is not None:
        return job_page(job_id, f"The job was not deleted: {problem} Reload the page and try again.", 400)
    manager = _manager()
    try:
        if manager.get(job_id).status == RUNNING:
            return job_page(job_id, "The job was not deleted: it is running; cancel it first.", 409)
        if request.form.get("confirm") != "yes":
            return job_page(job_id, confirm_delete=True)
        manager.delete(job_id)
    except JobNotFound as missing:
        raise NotFound(str(missing)) from None
    except JobStateError as error:
        return job_page(job_id, f"The job was not deleted: {error}.", 409)
    return redirect(url_for(".jobs"), code=303)


def resume_job_form(job_id: str) -> ResponseReturnValue:
    """Resume from the page without JavaScript (the API's resume: from the last snapshot, or from the start)."""
    return _job_action_form(job_id, "resumed", _manager().resume)


def register(blueprint: Blueprint) -> None:
    blueprint.add_url_rule("/jobs", "jobs", jobs_page)
    blueprint.add_url_rule("/jobs/<job_id>", "job_page", job_page)
    blueprint.add_url_rule("/jobs/<job_id>/cancel", "cancel_job_form", cancel_job_form, methods=["POST"])
    blueprint.add_url_rule("/jobs/<job_id>/delete", "delete_job_form", delete_job_form, methods=["POST"])
    blueprint.add_url_rule("/jobs/<job_id>/resume", "resume_job_form", resume_job_form, methods=["POST"])
