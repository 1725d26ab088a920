/* digits-memplugin: the jobs list, kept live from the `jobs` room: the `jobs` event (the page of the list this page
 * shows, sent when subscribing, so again after every reconnection: nothing missed while offline stays missed)
 * redraws the table; `job` events update a row, or add one on the first page (the newest jobs; rows past the page's
 * size then move to the older page); `job_deleted` removes one; `job_iteration` moves a training job's iteration.
 * The server drew the first paint. */
(function () {
  "use strict";

  const MP = window.MemPlugin;
  const F = MP.JobFormat;
  const body = document.getElementById("jobs-body");
  if (!body) return;
  const empty = document.getElementById("no-jobs");
  const labels = MP.readJSON("mp-device-labels") || {};
  const limit = Number(body.dataset.limit) || 50;
  const before = body.dataset.before || null;
  const older = document.getElementById("older-jobs");
  const href = (id) => MP.config.jobsUrl + "/" + encodeURIComponent(id);

  const rowOf = (id) => [...body.children].find((row) => row.dataset.jobId === id) || null;
  // The documents the rows were drawn from, so a `job_iteration` event (the latest iteration of a training job,
  // more often than its `job` events, which come at snapshots, with its speed and time left) can redraw a row.
  const shown = new Map();
  const showEmpty = () => { empty.hidden = body.children.length > 0; };

  /** The link to the next older page: the jobs before `id` (none: this page reaches the oldest job). */
  function showOlder(id) {
    if (!older) return;
    older.hidden = !id;
    if (!id) return;
    const url = new URL(window.location.href);
    url.searchParams.set("before", id);
    older.href = url.pathname + url.search;
  }

  /** This page of the list (oldest first from the server), drawn newest first as the server renders it. */
  function onJobs(document_) {
    shown.clear();
    for (const job of document_.jobs) shown.set(job.id, job);
    body.replaceChildren(...document_.jobs.slice().reverse().map((job) => F.jobRow(job, labels, href(job.id))));
    if ("older" in document_) showOlder(document_.older);
    showEmpty();
  }

  function onJob(job) {
    const known = shown.get(job.id);
    // The stored iteration lags the live one while the same run trains: keep the newer.
    if (known && job.status === "running" && known.status === "running" && known.iteration > job.iteration) {
      job = { ...job, iteration: known.iteration };
    }
    shown.set(job.id, job);
    const row = F.jobRow(job, labels, href(job.id));
    const old = rowOf(job.id);
    if (old) old.replaceWith(row);
    else if (!before) {
      body.prepend(row);
      let moved = false;
      while (body.children.length > limit) { body.lastElementChild.remove(); moved = true; }
      if (moved) showOlder(body.lastElementChild.dataset.jobId);
    }
    showEmpty();
  }

  function onIteration(payload) {
    const job = shown.get(payload.id);
    const row = rowOf(payload.id);
    if (!job || !row || typeof payload.iteration !== "number" || payload.iteration <= job.iteration) return;
    job.iteration = payload.iteration;
    row.querySelector('[data-role="iteration"]').textContent = F.iterationText(job, " / ");
    showPace(job, row, payload);
  }

  /** The speed and time left an iteration event carries (null until two records say), under the iteration. */
  function showPace(job, row, payload) {
    if (!("iterations_per_second" in payload)) return;
    job.iterations_per_second = payload.iterations_per_second;
    job.seconds_left = payload.seconds_left;
    row.querySelector('[data-role="pace"]').textContent = F.paceText(job);
  }

  function onDeleted(payload) {
    shown.delete(payload.id);
    const row = rowOf(payload.id);
    if (row) row.remove();
    showEmpty();
  }

  MP.subscribe("subscribe_jobs", "jobs", onJobs, {
    payload: before ? { limit, before } : { limit }, unsubscribeEvent: "unsubscribe_jobs",
  });
  MP.on("job", onJob);
  MP.on("job_deleted", onDeleted);
  MP.on("job_iteration", onIteration);
  MP.jobsList = { onJobs, onJob, onDeleted, onIteration };
})();
