"""A job's trained model, downloaded (jobs/definition/model_files.py says what is packed and how files are opened):

    GET /jobs/<id>/snapshots                      200 {"job_id", "snapshots": [snapshot, ...], "model_url", "total",
                                                       "older"}   ?limit=N (at most 500) &before=<iteration>
    GET /jobs/<id>/snapshots/<N>/<kind>           200 the file (kind "caffemodel" or "solverstate"), as an attachment
    GET /jobs/<id>/model.tar.gz                   200 the trained model (?iteration=N; default: the latest snapshot)

    snapshot = {"iteration", "attempt", "model_url": the archive of this snapshot,
                "files": {"caffemodel": {"name", "bytes", "url"}, "solverstate": {...} | null}}

404 when the job or the snapshot is unknown (or the job has none yet), 409 when its file is not one the job wrote
(a link on its way, another kind of file, a hard link): nothing is sent then. Reads, as GET /jobs/<id> is (a token
with MEMPLUGIN_AUTH_READS; the job page's links carry the page's session).
"""

from __future__ import annotations

import dataclasses
import json
import time
import unicodedata
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

from flask import Blueprint, Response, current_app, jsonify, request, stream_with_context, url_for
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import BadRequest, Conflict, HTTPException, NotFound

from ... import __version__
from ...core import inputs
from ...core.errors import NetError
from ...jobs.definition.definition import NET_SOURCE, SOLVER_SOURCE
from ...jobs.definition.model_files import (
    INFO_FILE,
    KINDS,
    DownloadError,
    Member,
    Snapshot,
    close_members,
    file_size,
    find_snapshot,
    open_job_file,
    open_mean_file,
    tar_gz,
    written_snapshots,
)
from ...jobs.manager import JobManager
from ...jobs.store.records import Attempt, Job
from ..plugin_state import current_plugin
from .envelope import API_PATH, job_or_404

MAX_DEFINITION_BYTES = 4 * 1024 * 1024
"""The job's net and solver as submitted are at most this (MEMPLUGIN_MAX_REQUEST_BYTES' default)."""


def _manager() -> JobManager:
    return current_plugin().started_jobs()



def refused(error: DownloadError) -> HTTPException:
    """A DownloadError as the API's JSON error: 404 or 409 (web/api/envelope.py answers HTTP errors under the API in JSON)."""
    return Conflict(str(error)) if error.status == 409 else NotFound(str(error))


MAX_LISTED_SNAPSHOTS = 500
"""Snapshots one answer of GET /jobs/<id>/snapshots lists at most (its default): each is opened for its size, and a
job with `snapshot: 1` writes one an iteration (5,000 of them held the server's thread 0.8 s at every job page)."""
PAGE_SNAPSHOTS = 20
"""Snapshots the job's page lists (templates/memplugin/job_files.html, static/js/job-files.js)."""


@dataclasses.dataclass(frozen=True)
class SnapshotPage:
    """The newest snapshots before an iteration, as documents (oldest first), and how many the job wrote in all."""

    documents: list[dict[str, Any]]
    total: int
    older: int | None
    """The iteration to give as `before` for the next older page (None: this page reaches the oldest)."""


def snapshot_documents(
    manager: JobManager, job: Job, limit: int = MAX_LISTED_SNAPSHOTS, before: int | None = None
) -> SnapshotPage:
    """The job's `limit` newest snapshots (of those before the iteration `before`) as GET /jobs/<id>/snapshots lists
    them (newest last), each file with its size now; a file that could not be sent (gone, or not a plain file any
    more) is left out."""
    written = written_snapshots(manager.jobs_root, job, manager.attempts(job.id))
    earlier = [snapshot for snapshot in written if before is None or snapshot.iteration < before]
    chosen = earlier[-limit:]
    older = chosen[0].iteration if len(earlier) > len(chosen) else None
    documents = []
    for snapshot in chosen:
        files: dict[str, Any] = {}
        for kind in KINDS:
            relative = snapshot.files.get(kind)
            size = file_size(manager.jobs_root, job, relative) if relative else None
            files[kind] = None if size is None else {
                "name": snapshot.name(kind), "bytes": size,
                "url": url_for("memplugin.api_job_snapshot_file", job_id=job.id, iteration=snapshot.iteration, kind=kind),
            }
        if files["caffemodel"] is None:
            continue
        documents.append({
            "iteration": snapshot.iteration, "attempt": snapshot.attempt, "files": files,
            "model_url": url_for("memplugin.api_job_model", job_id=job.id, iteration=snapshot.iteration),
        })
    return SnapshotPage(documents, len(written), older)


def list_snapshots(job_id: str) -> ResponseReturnValue:
    """The newest snapshots (?limit=N, default and at most 500; ?before=<iteration> for older ones)."""
    limit = _number_arg("limit", 3)
    if limit is not None and not 1 <= limit <= MAX_LISTED_SNAPSHOTS:
        raise BadRequest(f"limit must be a whole number from 1 to {MAX_LISTED_SNAPSHOTS}")
    before = _number_arg("before", 10)
    manager = _manager()
    job = job_or_404(manager, job_id)
    page = snapshot_documents(manager, job, limit or MAX_LISTED_SNAPSHOTS, before)
    model_url = url_for("memplugin.api_job_model", job_id=job.id) if page.total else None
    return jsonify(job_id=job.id, snapshots=page.documents, model_url=model_url, total=page.total, older=page.older)


def page_files(job_id: str) -> dict[str, Any] | None:
    """What a job's page shows of its trained model (templates/memplugin/job_files.html): the snapshots document
    GET /jobs/<id>/snapshots answers, or None when the job cannot be read."""
    try:
        manager = _manager()
        job = manager.get(job_id)
        page = snapshot_documents(manager, job, PAGE_SNAPSHOTS)
    except Exception:
        current_app.logger.exception("the snapshots of job %s could not be listed", job_id)
        return None
    return {
        "snapshots": page.documents,
        "total": page.total,
        "model_url": url_for("memplugin.api_job_model", job_id=job.id) if page.documents else None,
        "snapshots_url": url_for("memplugin.api_job_snapshots", job_id=job.id),
    }


def _snapshot(manager: JobManager, job: Job, iteration: int | None) -> Snapshot:
    try:
        return find_snapshot(written_snapshots(manager.jobs_root, job, manager.attempts(job.id)), iteration)
    except DownloadError as error:
        raise refused(error) from None


def snapshot_file(job_id: str, iteration: int, kind: str) -> ResponseReturnValue:
    """One file of one snapshot, as the job wrote it."""
    if kind not in KINDS:
        raise NotFound(f"a snapshot holds {' and '.join(KINDS)} files, not {inputs.shown(kind)!r}")
    manager = _manager()
    job = job_or_404(manager, job_id)
    snapshot = _snapshot(manager, job, iteration)
    relative = snapshot.files.get(kind)
    if relative is None:
        raise NotFound(f"the snapshot at iteration {iteration} has no {kind} file")
    try:
        opened = open_job_file(manager.jobs_root, job, relative)
    except DownloadError as error:
        raise refused(error) from None
    response = Response(stream_with_context(opened.chunks()), mimetype="application/octet-stream")
    response.content_length = opened.size
    response.call_on_close(opened.close)
    attachment(response, opened.name)
    return response


def model_archive(job_id: str) -> ResponseReturnValue:
    """The trained model (jobs/definition/model_files.py): the snapshot's weights with the nets, solver, deploy net and mean
    file that run it, as one tar.gz, written while it is sent."""
    iteration = _iteration_arg()
    manager = _manager()
    job = job_or_404(manager, job_id)
    snapshot = _snapshot(manager, job, iteration)
    attempt = next((a for a in manager.attempts(job.id) if a.number == snapshot.attempt), None)
    members = _members(manager, job, snapshot, attempt)
    name = f"{safe_name(job.name)}_iter_{snapshot.iteration}.tar.gz"

    def stream() -> Iterator[bytes]:
        try:
            yield from tar_gz(members)
        finally:
            close_members(members)

    response = Response(stream_with_context(stream()), mimetype="application/gzip")
    response.call_on_close(lambda: close_members(members))
    attachment(response, name)
    return response


def _members(manager: JobManager, job: Job, snapshot: Snapshot, attempt: Attempt | None) -> list[Member]:
    """What the archive holds, every file opened now (so that a refusal is an answer, not a cut download)."""
    folder = manager.jobs_root / job.folder
    try:
        net_text = _text(manager, job, NET_SOURCE)
        solver_text = _text(manager, job, SOLVER_SOURCE)
    except DownloadError as error:
        raise refused(error) from None
    try:
        definition = manager.definitions.get(job)
        definition_problem = None
    except (NetError, OSError) as problem:  # the dataset moved or went: the nets are still packed
        definition, definition_problem = None, str(problem)
    try:
        nets = manager.planner.packed(net_text, solver_text, job.spec, attempt, job.max_iter, definition)
    except NetError as error:
        raise refused(DownloadError(f"the job's net cannot be packed: {error.message}", 409)) from None
    now = time.time()
    members = [Member(name, text.encode(), mtime=now) for name, text in nets.files.items()]
    mean_note = None
    try:
        if nets.mean_file is not None and definition is not None:
            try:
                mean = open_mean_file(nets.mean_file, definition.roots)
                members.append(Member(mean.name, file=mean, mtime=mean.mtime))
            except DownloadError as error:
                mean_note = str(error)
        weights = open_job_file(manager.jobs_root, job, snapshot.files["caffemodel"])
        members.append(Member(weights.name, file=weights, mtime=weights.mtime))
    except DownloadError as error:
        close_members(members)
        raise refused(error) from None
    info = {
        "job": {"id": job.id, "name": job.name, "status": job.status, "created_at": job.created_at,
                "max_iter": job.max_iter, "spec": job.spec},
        "snapshot": {"iteration": snapshot.iteration, "attempt": snapshot.attempt,
                     "weights": snapshot.name("caffemodel")},
        "attempt": attempt.to_json() if attempt is not None else None,
        "files": [member.name for member in members] + [INFO_FILE],
        "deploy": "deploy.prototxt" if nets.deploy_refused is None else None,
        "deploy_refused": nets.deploy_refused,
        "mean_file": None if nets.mean_file is None else nets.mean_file.name,
        "mean_file_note": mean_note or (definition_problem and f"the dataset could not be read: {definition_problem}"),
        "folder": str(folder.name),
        "made_by": f"digits-memplugin {__version__}",
    }
    members.append(Member(INFO_FILE, json.dumps(info, indent=2, sort_keys=True).encode() + b"\n", mtime=now))
    return members


def _text(manager: JobManager, job: Job, name: str) -> str:
    opened = open_job_file(manager.jobs_root, job, name)
    try:
        data = b"".join(opened.chunks()) if opened.size <= MAX_DEFINITION_BYTES else None
    finally:
        opened.close()
    if data is None:
        raise DownloadError(f"the job's {name} is larger than {MAX_DEFINITION_BYTES} bytes", 409)
    return data.decode("utf-8", errors="replace")


def _iteration_arg() -> int | None:
    return _number_arg("iteration", 10)


def _number_arg(name: str, digits: int) -> int | None:
    """A query parameter that must be a whole number written with 0-9, at most `digits` of them (None: absent)."""
    value = request.args.get(name)
    if value is None:
        return None
    number = inputs.ascii_int(value, max_digits=digits) if value.isascii() and value.isdigit() else None
    if number is None:
        raise BadRequest(f"{name} must be a whole number (the digits 0-9, at most {digits} of them)")
    return number


def safe_name(name: str) -> str:
    """A job's name as a file name: letters, digits, "-", "_" and "." kept (any script), the rest "_"."""
    cleaned = "".join(char if char.isalnum() or char in "-_." else "_" for char in name).strip("._")
    return cleaned[:100] or "job"


def attachment(response: Response, name: str) -> None:
    """Content-Disposition: attachment with the file's name, as RFC 6266 says: an ASCII `filename` for every
    browser, and `filename*` in UTF-8 (RFC 8187) when the name has other letters (werkzeug's send_file does the
    same)."""
    try:
        name.encode("ascii")
    except UnicodeEncodeError:
        simple = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode("ascii") or "download"
        response.headers.set("Content-Disposition", "attachment", filename=simple,
                             **{"filename*": f"UTF-8''{quote(name, safe='!#$&+^`|~')}"})
    else:
        response.headers.set("Content-Disposition", "attachment", filename=name)
    response.headers["X-Content-Type-Options"] = "nosniff"


def register(blueprint: Blueprint) -> None:
    base = f"{API_PATH}/jobs/<job_id>"
    blueprint.add_url_rule(f"{base}/snapshots", "api_job_snapshots", list_snapshots, methods=["GET"])
    blueprint.add_url_rule(f"{base}/snapshots/<int:iteration>/<kind>", "api_job_snapshot_file", snapshot_file,
                           methods=["GET"])
    blueprint.add_url_rule(f"{base}/model.tar.gz", "api_job_model", model_archive, methods=["GET"])
