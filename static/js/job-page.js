/* digits-memplugin: a job's page, live. The server drew the first paint from the job document; this script
 *
 * - draws the chart of loss and accuracy by iteration (and the learning rate) from GET api/jobs/<id>/progress,
 *   then grows it from `job_progress` events; points are kept by iteration, so a record seen twice (in the history
 *   and in an event) is drawn once, in order; a value that is NaN or infinite (the server writes "NaN", "Infinity",
 *   "-Infinity") is a gap in its line and a red ✕ at the top of the chart, listed below the chart too;
 * - draws the current run on top: an attempt that started before an earlier attempt's points (a restart from 0, a
 *   resume from an earlier snapshot) trains those iterations again, so the earlier points move to a dashed, paler
 *   line of their own ("train loss, attempt 1 (trained again)") drawn beneath; the summary's iteration, loss and
 *   validation results are those of the current attempt only;
 * - keeps status, plan, summary and the attempts table up to date from `job` and `job_attempt` events, and the
 *   speed and time left from the iteration events (`iterations_per_second`, `seconds_left`, measured by the server);
 * - shows Caffe's log: its tail from GET api/jobs/<id>/log, then the `job_log` events' lines; the box opens at its
 *   end (how training ended, or what it is doing) and keeps to the end as lines come, until the user scrolls up to
 *   read; scrolling back to the end follows again;
 * - after a reconnection, subscribes again (the server answers with the whole job document) and re-fetches the
 *   progress and the log, so what happened while the connection was down is not missed;
 * - cancels, resumes and deletes through the REST API (the buttons' forms post to the page's routes without
 *   JavaScript); Delete first asks, in the page, whether to delete the job for good, naming its snapshots.
 * Everything from the server is written as text (MemPlugin.el, textContent): job and layer names stay text.
 */
(function () {
  "use strict";

  const MP = window.MemPlugin;
  const F = MP.JobFormat;
  const root = document.getElementById("job-page");
  if (!root) return;

  const jobId = root.dataset.jobId;
  const urls = {
    progress: root.dataset.progressUrl,
    log: root.dataset.logUrl,
    cancel: root.dataset.cancelUrl,
    remove: root.dataset.deleteUrl,
    resume: root.dataset.resumeUrl,
  };
  const labels = MP.readJSON("mp-device-labels") || {};
  let job = MP.readJSON("mp-job");

  const LOG_LINES = 500;
  const LOG_FETCH = 200;
  const ACCURACY = /accuracy|acc$|top-?\d/i;
  // Train loss blue, validation loss orange, validation accuracy green, the rate purple; other outputs after.
  const FIXED = { "train:loss": "#0d6efd", "test0:loss": "#fd7e14", "test0:accuracy": "#198754", lr: "#6f42c1" };
  const COLORS = ["#d63384", "#20c997", "#6c757d", "#dc3545", "#0dcaf0", "#adb5bd"];
  const NON_FINITE_COLOR = "#dc3545";
  const summary = document.getElementById("job-summary");
  const part = (role) => summary.querySelector('[data-role="' + role + '"]');
  const errorBox = document.getElementById("job-error");

  // --- the charts ---------------------------------------------------------------------------------------------

  function makeChart(canvas, scales) {
    return new window.Chart(canvas, {
      type: "line",
      data: { datasets: [] },
      options: {
        animation: false,
        maintainAspectRatio: false,
        interaction: { mode: "nearest", axis: "x", intersect: false },
        elements: { point: { radius: 0 }, line: { borderWidth: 1.5 } },
        plugins: {
          legend: { position: "bottom", labels: { boxWidth: 12 } },
          // A mark of a value that is not finite says which value it stands for, not where it is drawn.
          tooltip: { callbacks: { label: (item) => (item.raw && item.raw.shown ? item.dataset.series + ": " + item.raw.shown : undefined) } },
        },
        scales: {
          x: { type: "linear", title: { display: true, text: "iteration" }, min: 0 },
          ...scales,
          // Marks of values that are not finite, at the top of the chart whatever the other axes show.
          marks: { type: "linear", axis: "y", min: 0, max: 1, display: false },
        },
      },
    });
  }

  const chart = makeChart(document.getElementById("progress-chart"), {
    loss: { type: "linear", position: "left", title: { display: true, text: "loss" }, beginAtZero: true },
    accuracy: {
      type: "linear", position: "right", min: 0, max: 1, display: "auto",
      title: { display: true, text: "accuracy" }, grid: { drawOnChartArea: false },
    },
  });
  const lrChart = makeChart(document.getElementById("lr-chart"), {
    lr: { type: "linear", position: "left", title: { display: true, text: "learning rate" }, beginAtZero: true },
  });
  lrChart.options.plugins.legend.display = false;

  const series = new Map();
  // The training loss and the rate come first in the legends, whichever record arrives first.
  dataset(chart, "train:loss", "train loss", "loss", false);
  dataset(lrChart, "lr", "learning rate", "lr", false);

  /** The dataset of a series, created on first use (colours in the order series appear). */
  function dataset(target, key, label, axis, test) {
    let entry = series.get(key);
    if (!entry) {
      const color = FIXED[key] || COLORS[series.size % COLORS.length];
      const data = {
        label, data: [], yAxisID: axis, borderColor: color, backgroundColor: color,
        pointRadius: test ? 2.5 : 0, stepped: axis === "lr" ? "before" : false, order: 0,
      };
      target.data.datasets.push(data);
      entry = { data, target, key, label, axis, test };
      series.set(key, entry);
    }
    return entry.data;
  }

  /** The points of an earlier attempt that a later one trains again: a dashed, paler line beneath the series'
   *  own, in its colour, named after the attempt. */
  function earlier(key, attempt) {
    const own = series.get(key);
    const earlierKey = key + "@" + attempt;
    let entry = series.get(earlierKey);
    if (!entry) {
      const color = own.data.borderColor + "80";
      const data = {
        label: own.label + ", attempt " + attempt + " (trained again)", data: [], yAxisID: own.axis,
        borderColor: color, backgroundColor: color, borderDash: [5, 4], pointRadius: own.test ? 2 : 0,
        stepped: own.data.stepped, order: 10, attempt,
      };
      own.target.data.datasets.push(data);
      entry = { data, target: own.target, key: earlierKey, label: data.label, axis: own.axis, test: own.test, of: key };
      series.set(earlierKey, entry);
    }
    return entry.data;
  }

  // --- attempts: which points are the current run ---------------------------------------------------------------

  /** The current attempt's latest iteration record, and latest record of each test net (the summary's values). */
  let latestTrain = null;
  const latestTests = [];

  /** Attempt number -> the iteration it started from (job.attempts, job_attempt events). */
  const starts = new Map();
  function knowAttempts(attempts) {
    let changed = false;
    for (const attempt of attempts || []) {
      if (starts.get(attempt.number) !== attempt.start_iteration) {
        starts.set(attempt.number, attempt.start_iteration);
        changed = true;
      }
    }
    return changed;
  }
  knowAttempts(job.attempts);
  const currentAttempt = () => Math.max(0, ...starts.keys());

  /** Whether a later attempt trains `iteration` again (it started before it): attempt's point is no longer the
   *  job's (GET .../progress says the same: `superseded`). */
  function superseded(attempt, iteration) {
    for (const [number, start] of starts) if (number > attempt && iteration > start) return true;
    return false;
  }

  /** Move the points that a newly known attempt supersedes from their series to their attempt's earlier line. */
  function rearrange() {
    for (const entry of [...series.values()]) {
      if (entry.of || entry.key.endsWith(":non-finite")) continue;
      const keep = [];
      for (const point of entry.data.data) {
        if (point.attempt !== undefined && superseded(point.attempt, point.x)) place(earlier(entry.key, point.attempt).data, point);
        else keep.push(point);
      }
      if (keep.length !== entry.data.data.length) entry.data.data = keep;
      const marks = series.get(entry.key + ":non-finite");
      if (marks) marks.data.data = marks.data.data.filter((point) => !(point.attempt !== undefined && superseded(point.attempt, point.x)));
    }
    showNonFinite();
    if (latestTrain && latestTrain.attempt < currentAttempt()) latestTrain = null;
    for (const [net, test] of latestTests.entries()) if (test && test.attempt < currentAttempt()) latestTests[net] = null;
  }

  /** The marks of a series' values that are not finite: a red ✕ at the top of the chart, created on first use. */
  function marks(target, key, label) {
    const markKey = key + ":non-finite";
    let entry = series.get(markKey);
    if (!entry) {
      const data = {
        label: label + " not finite", series: label, data: [], yAxisID: "marks", showLine: false,
        pointStyle: "crossRot", pointRadius: 7, pointHoverRadius: 9, pointBorderWidth: 2.5,
        borderColor: NON_FINITE_COLOR, backgroundColor: NON_FINITE_COLOR,
      };
      target.data.datasets.push(data);
      entry = { data, target };
      series.set(markKey, entry);
    }
    return entry.data;
  }

  /** Put `point` in `data` by iteration: appended in the common case, else in its place (a resumed attempt repeats
   *  iterations after its snapshot; the later attempt's value wins). */
  function place(data, point) {
    const last = data[data.length - 1];
    if (!last || point.x > last.x) {
      data.push(point);
      return;
    }
    let index = data.length - 1;
    while (index > 0 && data[index - 1].x >= point.x) index -= 1;
    if (data[index].x === point.x) data[index] = point;
    else data.splice(index, 0, point);
  }

  function unplace(data, iteration) {
    const index = data.findIndex((point) => point.x === iteration);
    if (index >= 0) data.splice(index, 1);
  }

  /** A point by iteration, of `attempt`: on its series' line, or on its attempt's earlier line when a later attempt
   *  trains the iteration again. A value that is NaN or infinite is a gap in the line (y null) and a mark. */
  function addPoint(target, key, label, axis, iteration, value, test, attempt, gone) {
    const read = F.reported(value);
    if (read === undefined) return; // not reported (null): nothing to draw
    dataset(target, key, label, axis, test);
    if (gone) {
      place(earlier(key, attempt).data, { x: iteration, y: Number.isFinite(read) ? read : null, attempt });
      return;
    }
    const data = series.get(key).data.data;
    if (Number.isFinite(read)) {
      place(data, { x: iteration, y: read, attempt });
      if (series.has(key + ":non-finite")) {
        unplace(marks(target, key, label).data, iteration);
        showNonFinite();
      }
      return;
    }
    const shown = F.number(read);
    place(data, { x: iteration, y: null, shown, attempt });
    place(marks(target, key, label).data, { x: iteration, y: 0.96, shown, attempt });
    showNonFinite();
  }

  /** The values that were not finite, in words under the chart: which series, from which iteration, how many. */
  function showNonFinite() {
    const note = document.getElementById("chart-non-finite");
    const parts = [];
    for (const [markKey, entry] of series) {
      if (!markKey.endsWith(":non-finite") || !entry.data.data.length) continue;
      const points = entry.data.data;
      const kinds = [...new Set(points.map((point) => point.shown))].join(", ");
      parts.push(entry.data.series + " " + kinds + " at iteration " + points[0].x +
        (points.length > 1 ? " and " + (points.length - 1) + " later point" + (points.length > 2 ? "s" : "") : ""));
    }
    note.textContent = parts.length ? "Not finite (✕ above a gap in the line): " + parts.join("; ") + "." : "";
    note.hidden = !parts.length;
  }

  const scalar = (value) => (value && typeof value === "object" && "mean" in value ? value.mean : value);

  /** Whether record `a` is later than `b`: a later attempt, or a later iteration of the same one. */
  const later = (a, b) => !b || a.attempt > b.attempt || (a.attempt === b.attempt && a.iteration >= b.iteration);

  /** One runner record (history or event) into the charts and the latest values of the current run. Records carry
   *  their attempt (the events, the history, the job's progress); one without (stored before they did) is the
   *  current attempt's. */
  function addRecord(given) {
    const iteration = given.iteration;
    if (typeof iteration !== "number") return;
    const record = typeof given.attempt === "number" ? given : { ...given, attempt: currentAttempt() };
    const attempt = record.attempt;
    const gone = record.superseded === true || superseded(attempt, iteration);
    const current = !gone && attempt >= currentAttempt();
    if (record.event === "iteration") {
      addPoint(chart, "train:loss", "train loss", "loss", iteration, record.loss, false, attempt, gone);
      for (const [name, value] of Object.entries(record.outputs || {})) {
        if (name === "loss") continue;
        addPoint(chart, "train:" + name, "train " + name, ACCURACY.test(name) ? "accuracy" : "loss", iteration,
          scalar(value), false, attempt, gone);
      }
      addPoint(lrChart, "lr", "learning rate", "lr", iteration, record.lr, false, attempt, gone);
      if (current && later(record, latestTrain)) latestTrain = record;
    } else if (record.event === "test") {
      const net = record.net || 0;
      const prefix = net ? "validation " + net + " " : "validation ";
      for (const [name, value] of Object.entries(record.outputs || {})) {
        const axis = ACCURACY.test(name) ? "accuracy" : "loss";
        addPoint(chart, "test" + net + ":" + name, prefix + name, axis, iteration, scalar(value), true, attempt, gone);
      }
      if (current && later(record, latestTests[net])) latestTests[net] = record;
    }
  }

  let drawTimer = null;
  function draw() {
    if (drawTimer !== null) return;
    drawTimer = setTimeout(() => {
      drawTimer = null;
      chart.update("none");
      lrChart.update("none");
      showLatest();
    }, 50);
  }

  // --- the summary and the attempts -------------------------------------------------------------------------

  function showLatest() {
    const train = latestTrain;
    part("lr").textContent = train ? F.number(train.lr) : "n/a";
    part("loss").textContent = train ? F.number(train.loss) : "n/a";
    const tests = latestTests.filter(Boolean);
    part("test").textContent = tests.length
      ? tests.map((test) => Object.keys(test.outputs || {}).sort()
        .map((name) => name + " " + F.number(test.outputs[name])).join(", ") + " (iteration " + test.iteration + ")")
        .join("; ")
      : "n/a";
    // A test at iteration N comes after N updates, possibly before the (throttled) record of update N.
    const newest = Math.max(train ? train.iteration : 0, ...tests.map((test) => test.iteration));
    showIteration(Math.max(job.iteration, newest));
  }

  function showIteration(iteration) {
    part("iteration").textContent = iteration + (job.max_iter ? " of " + job.max_iter : "");
    const bar = document.getElementById("job-progress");
    const percent = job.max_iter ? Math.min(100, (100 * iteration) / job.max_iter) : 0;
    bar.setAttribute("aria-valuenow", String(Math.round(percent)));
    bar.firstElementChild.style.width = percent.toFixed(1) + "%";
  }

  /** The speed and time left a job document or an iteration event carries (null until two records say). */
  function showPace(source) {
    if (!("iterations_per_second" in source)) return;
    job.iterations_per_second = source.iterations_per_second;
    job.seconds_left = source.seconds_left;
    setText("pace", F.paceText(job) || "n/a");
  }

  function setText(role, text) {
    part(role).textContent = text;
  }

  /** A job document (a `job` event, or the subscription's answer with the attempts). */
  function showJob(document_) {
    const wasActive = F.ACTIVE.has(job.status);
    job = { ...job, ...document_ };
    document.getElementById("job-status").replaceWith(F.statusBadge(job.status, "job-status"));
    document.getElementById("job-message").textContent = job.message || "";
    const device = part("device");
    device.replaceChildren(
      job.device.assigned ? F.deviceLabel(job.device.assigned, labels) : "not placed yet",
      MP.el("div", { className: "text-body-secondary" }, "asked: " + F.deviceLabel(job.device.requested, labels)),
    );
    setText("wanted", F.wantedBatch(job.batch));
    setText("plan", F.plannedBatch(job.batch));
    setText("validation", job.batch.test_batch_size
      ? "batch " + job.batch.test_batch_size + " × " + job.batch.test_iter + " passes" : "none");
    setText("snapshot", job.snapshot ? "iteration " + job.snapshot.iteration : "none yet");
    showPace(document_);
    setText("created", MP.formatTime(job.created_at));
    setText("started", MP.formatTime(job.started_at) || "not yet");
    setText("finished", MP.formatTime(job.finished_at) || "not yet");
    if (Array.isArray(document_.attempts) && knowAttempts(document_.attempts)) rearrange();
    if (!job.progress) { // a new attempt has no record yet: nothing of an earlier one is the job's now
      latestTrain = null;
      latestTests.length = 0;
    }
    showIteration(Math.max(job.iteration, latestTrain ? latestTrain.iteration : 0));
    draw();
    if (job.progress) {
      if (job.progress.train) addRecord(job.progress.train);
      for (const test of job.progress.test || []) if (test) addRecord(test);
      draw();
    }
    const active = F.ACTIVE.has(job.status);
    document.getElementById("cancel-form").hidden = !active;
    document.getElementById("cancel-job").disabled = job.message === "cancelling";
    document.getElementById("delete-form").hidden = active;
    if (active) document.getElementById("delete-confirm").hidden = true;
    const resumable = F.RESUMABLE.has(job.status);
    document.getElementById("resume-form").hidden = !resumable;
    document.getElementById("resume-job").disabled = false;
    document.getElementById("resume-job").title = "Train on" +
      (job.snapshot ? " from the snapshot at iteration " + job.snapshot.iteration : ", from the start (no snapshot)");
    if (Array.isArray(document_.attempts)) {
      for (const attempt of document_.attempts) showAttempt(attempt);
    }
    if (wasActive && !active) loadHistory(); // the last records, whatever the throttle coalesced
  }

  function showAttempt(attempt) {
    const body = document.querySelector("#attempts tbody");
    const row = F.attemptRow(attempt, labels);
    showTestNets(attempt);
    const old = [...body.children].find((tr) => tr.dataset.attempt === String(attempt.number));
    if (old) old.replaceWith(row);
    else body.append(row);
    document.getElementById("no-attempts").hidden = true;
    if (attempt.number > logAttempt) startLog(attempt.number);
  }

  /** The summary's validation nets: the latest attempt's, and what the job asked for (job.html). */
  let testNetsOf = 0;
  function showTestNets(attempt) {
    if (attempt.number < testNetsOf) return;
    testNetsOf = attempt.number;
    const cell = part("test-net");
    const asked = cell.dataset.asked;
    cell.replaceChildren(...F.testNetParts(attempt, labels, true),
      ...(asked ? [MP.el("div", { className: "text-body-secondary" }, "asked: " + asked)] : []));
  }

  // --- the log --------------------------------------------------------------------------------------------------

  const logBox = document.getElementById("job-log");
  const lastAttempt = () => (job.attempts && job.attempts.length ? job.attempts[job.attempts.length - 1].number : 0);
  let logAttempt = lastAttempt();
  let logLines = logBox.textContent ? logBox.textContent.split("\n") : [];
  /** Whether the box keeps to the end of the log: until the user scrolls up, and again once back at the end. */
  let followLog = true;
  const atLogEnd = () => logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 8;
  logBox.addEventListener("scroll", () => { followLog = atLogEnd(); }, { passive: true });

  function startLog(number) {
    logAttempt = number;
    logLines = [];
    followLog = true; // a new attempt's log: from its start, followed
    document.getElementById("log-attempt").textContent = "(attempt " + number + ", last lines)";
    showLog();
  }

  function showLog() {
    if (logLines.length > LOG_LINES) logLines = logLines.slice(-LOG_LINES);
    const keep = logBox.scrollTop;
    logBox.textContent = logLines.join("\n");
    logBox.scrollTop = followLog ? logBox.scrollHeight : keep;
  }
  logBox.scrollTop = logBox.scrollHeight; // the first paint's tail opens at its end

  async function loadLog() {
    const number = lastAttempt();
    if (!number) return;
    const response = await fetch(urls.log + "?tail=" + LOG_FETCH, { credentials: "same-origin" });
    if (!response.ok) return;
    const text = await response.text();
    if (number > logAttempt) startLog(number);
    logLines = text.replace(/\n$/, "").split("\n");
    showLog();
  }

  // --- history, events, reconnection ------------------------------------------------------------------------------

  async function loadHistory() {
    const answer = await MP.requestJSON(urls.progress);
    if (!answer.ok || !answer.data) return;
    for (const record of answer.data.records) addRecord(record);
    draw();
  }

  function showError(text) {
    errorBox.textContent = text;
    errorBox.hidden = !text;
  }

  const mine = (payload) => payload && (payload.job_id === jobId || payload.id === jobId);

  MP.subscribe("subscribe_job", "job", (document_) => { if (mine(document_)) showJob(document_); },
    { payload: { id: jobId }, unsubscribeEvent: "unsubscribe_job" });
  MP.on("job_progress", (record) => {
    if (!mine(record)) return;
    addRecord(record);
    if (record.event === "iteration" && record.attempt >= lastAttempt()) showPace(record);
    draw();
  });
  MP.on("job_attempt", (attempt) => {
    if (!mine(attempt)) return;
    const attempts = (job.attempts || []).filter((a) => a.number !== attempt.number);
    job.attempts = [...attempts, attempt].sort((a, b) => a.number - b.number);
    if (knowAttempts([attempt])) {
      rearrange();
      draw();
    }
    showAttempt(attempt);
  });
  MP.on("job_log", (payload) => {
    if (!mine(payload) || payload.attempt < logAttempt) return;
    if (payload.attempt > logAttempt) startLog(payload.attempt);
    logLines.push(...payload.lines.map((line) => line.replace(/\n$/, "")));
    showLog();
  });
  MP.on("job_error", (payload) => { if (payload && payload.id === jobId) showError(payload.error); });
  MP.on("job_deleted", (payload) => {
    if (!mine(payload)) return;
    showError("This job was deleted.");
    document.getElementById("cancel-form").hidden = true;
    document.getElementById("delete-form").hidden = true;
    document.getElementById("delete-confirm").hidden = true;
    document.getElementById("resume-form").hidden = true;
  });
  MP.onReconnect(() => { loadHistory(); loadLog(); });

  document.getElementById("cancel-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = document.getElementById("cancel-job");
    button.disabled = true;
    const answer = await MP.requestJSON(urls.cancel, { method: "POST" });
    if (answer.ok) {
      showError("");
      showJob(answer.data);
    } else {
      button.disabled = false;
      showError("The job was not cancelled: " + ((answer.data && answer.data.error) || "HTTP " + answer.status));
    }
  });

  document.getElementById("resume-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = document.getElementById("resume-job");
    button.disabled = true;
    const answer = await MP.requestJSON(urls.resume, { method: "POST" });
    if (answer.ok) {
      showError("");
      showJob(answer.data);
    } else {
      button.disabled = false;
      showError("The job was not resumed: " + ((answer.data && answer.data.error) || "HTTP " + answer.status));
    }
  });

  // Delete asks first (the same question the server asks without JavaScript): what goes with the job, then
  // "Delete for good" or "Keep the job".
  const confirmBox = document.getElementById("delete-confirm");
  const deleteButton = document.getElementById("delete-job");
  const snapshots = new Set(MP.readJSON("mp-snapshots") || []);
  MP.on("job_progress", (record) => {
    if (mine(record) && record.event === "snapshot" && record.model) snapshots.add(record.model);
  });

  /** As job_pages.deletion_words. */
  function deletionWords() {
    if (!snapshots.size) return "It has no snapshot; its attempts' logs go with it.";
    const latest = Math.max(...[...snapshots].map((name) => Number((/_iter_(\d+)\./.exec(name) || [0, 0])[1])));
    return "Its " + snapshots.size + " snapshot" + (snapshots.size > 1 ? "s" : "") + " (the latest at iteration " +
      latest + ") and its attempts' logs go with it.";
  }

  function askDelete(open) {
    confirmBox.hidden = !open;
    deleteButton.setAttribute("aria-expanded", String(open));
    if (open) {
      document.getElementById("delete-confirm-what").textContent = deletionWords();
      document.getElementById("delete-keep").focus();
    }
  }

  document.getElementById("delete-form").addEventListener("submit", (event) => {
    event.preventDefault();
    askDelete(true);
  });
  document.getElementById("delete-keep").addEventListener("click", (event) => {
    event.preventDefault();
    askDelete(false);
    deleteButton.focus();
  });
  document.getElementById("delete-confirm-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const button = document.getElementById("delete-confirmed");
    button.disabled = true;
    const answer = await MP.requestJSON(urls.remove, { method: "DELETE" });
    if (answer.ok) window.location.assign(MP.config.jobsUrl);
    else {
      button.disabled = false;
      showError("The job was not deleted: " + ((answer.data && answer.data.error) || "HTTP " + answer.status));
    }
  });

  loadHistory();
  loadLog();
  MP.jobPage = { chart, lrChart, series, loadHistory, loadLog, state: () => job, latest: () => latestTrain };
})();
