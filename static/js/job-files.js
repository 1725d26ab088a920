/* digits-memplugin: a job page's "Trained model" (templates/memplugin/job_files.html), kept up to date: when the job
 * writes a snapshot (a `job_progress` record with event "snapshot", or a `job` event whose snapshot moved) and after
 * a reconnection, the snapshots are fetched again (GET api/jobs/<id>/snapshots) and the section redrawn, in the
 * template's words. Loaded with `defer`, after the page's own scripts (job-page.js subscribes to the job's room). */
(function () {
  "use strict";

  const MP = window.MemPlugin;
  const section = document.getElementById("job-files");
  const page = document.getElementById("job-page");
  if (!MP || !section || !page || !section.dataset.snapshotsUrl) return;
  const { el, formatBytes } = MP;
  const jobId = page.dataset.jobId;
  const note = document.getElementById("model-download");
  const box = document.getElementById("snapshots-box");
  const body = section.querySelector("#snapshots tbody");
  const shown = MP.readJSON("mp-job");
  let lastSnapshot = shown && shown.snapshot ? shown.snapshot.iteration : null;

  const MODEL_NOTE = (iteration) => "tar.gz: the weights at iteration " + iteration + " with the train/val net, the " +
    "solver and the deploy net that run them (and the mean file, where the net has one), as DIGITS packs them";
  const SHOWN = 20; // as job_files.html: the latest snapshots in the table, the rest in the JSON
  const NONE_YET = "No snapshot yet: the weights can be downloaded once the job writes one (at its snapshot interval, " +
    "when it is cancelled, and at the end of training).";

  function fileCell(kind, file) {
    if (!file) return el("td", { dataset: { role: kind } }, "n/a");
    return el("td", { dataset: { role: kind } }, el("a", { href: file.url, download: "" }, "." + kind), " ",
      el("span", { className: "small text-body-secondary" }, formatBytes(file.bytes)));
  }

  function draw(document_) {
    const snapshots = document_.snapshots || [];
    const latest = snapshots[snapshots.length - 1];
    if (latest) {
      note.replaceChildren(
        el("a", { className: "btn btn-primary btn-sm", href: document_.model_url, id: "download-model", download: "" },
          "Download the trained model"), " ",
        el("span", { className: "small text-body-secondary", dataset: { role: "model-note" } }, MODEL_NOTE(latest.iteration)));
    } else {
      note.replaceChildren(el("span", { className: "small text-body-secondary", dataset: { role: "model-note" } }, NONE_YET));
    }
    box.hidden = !latest;
    const older = document.getElementById("snapshots-older");
    const total = typeof document_.total === "number" ? document_.total : snapshots.length;
    if (older) {
      older.hidden = total <= SHOWN;
      older.replaceChildren("The latest " + SHOWN + " of " + total + " snapshots; ",
        el("a", { href: section.dataset.snapshotsUrl }, "all of them"), " (JSON).");
    }
    body.replaceChildren(...snapshots.slice(-SHOWN).map((snapshot) => el("tr", { dataset: { iteration: String(snapshot.iteration) } },
      el("td", {}, String(snapshot.iteration)), el("td", {}, String(snapshot.attempt)),
      fileCell("caffemodel", snapshot.files.caffemodel), fileCell("solverstate", snapshot.files.solverstate),
      el("td", {}, el("a", { href: snapshot.model_url, download: "" }, "tar.gz")))));
    section.dataset.drawn = String((Number(section.dataset.drawn) || 0) + 1);
  }

  async function refresh() {
    try {
      // The latest SHOWN only: the server opens each listed file for its size (a job may write thousands).
      const answer = await MP.requestJSON(section.dataset.snapshotsUrl + "?limit=" + SHOWN);
      if (answer.ok && answer.data) draw(answer.data);
    } catch (error) {
      /* offline: the next reconnection fetches again */
    }
  }
  const later = MP.debounce(refresh, 300);

  MP.on("job_progress", (record) => {
    if (record && record.job_id === jobId && record.event === "snapshot") later();
  });
  MP.on("job", (job) => {
    if (!job || job.id !== jobId) return;
    const iteration = job.snapshot ? job.snapshot.iteration : null;
    if (iteration !== lastSnapshot) { lastSnapshot = iteration; later(); }
  });
  MP.onReconnect(later);
  MP.jobFiles = { refresh, draw };
})();
