/* digits-memplugin: the jobs list, kept live from the `jobs` room: the `jobs` event (the whole list, sent when
 * subscribing, so again after every reconnection: nothing missed while offline stays missed) redraws the table;
 * `job` events update or add one row; `job_deleted` removes one. The server drew the first paint. */
(function () {
  "use strict";

  const MP = window.MemPlugin;
  const F = MP.JobFormat;
  const body = document.getElementById("jobs-body");
  if (!body) return;
  const empty = document.getElementById("no-jobs");
  const labels = MP.readJSON("mp-device-labels") || {};
  const href = (id) => MP.config.jobsUrl + "/" + encodeURIComponent(id);

  const rowOf = (id) => [...body.children].find((row) => row.dataset.jobId === id) || null;
  const showEmpty = () => { empty.hidden = body.children.length > 0; };

  /** The whole list (oldest first from the server), drawn newest first as the server renders it. */
  function onJobs(document_) {
    body.replaceChildren(...document_.jobs.slice().reverse().map((job) => F.jobRow(job, labels, href(job.id))));
    showEmpty();
  }

  function onJob(job) {
    const row = F.jobRow(job, labels, href(job.id));
    const old = rowOf(job.id);
    if (old) old.replaceWith(row);
    else body.prepend(row);
    showEmpty();
  }

  function onDeleted(payload) {
    const row = rowOf(payload.id);
    if (row) row.remove();
    showEmpty();
  }

  MP.subscribe("subscribe_jobs", "jobs", onJobs, { unsubscribeEvent: "unsubscribe_jobs" });
  MP.on("job", onJob);
  MP.on("job_deleted", onDeleted);
  MP.jobsList = { onJobs, onJob, onDeleted };
})();
