/* digits-memplugin: a job's page, live. The server drew the first paint from the job document; this script
 *
 * - draws the chart of loss and accuracy by iteration (and the learning rate) from GET api/jobs/<id>/progress,
 *   then grows it from `job_progress` events; points are kept by iteration, so a record seen twice (in the history
 *   and in an event) is drawn once, in order; a value that is NaN or infinite (the server writes "NaN", "Infinity",
 *   "-Infinity") is a gap in its line and a red ✕ at the top of the chart, listed below the chart too;
 * - keeps status, plan, summary and the attempts table up to date from `job` and `job_attempt` events, and the
 *   speed and time left from the iteration events (`iterations_per_second`, `seconds_left`, measured by the server);
 * - shows Caffe's log: its tail from GET api/jobs/<id>/log, then the `job_log` events' lines;
 * - after a reconnection, subscribes again (the server answers with the whole job document) and re-fetches the
 *   progress and the log, so what happened while the connection was down is not missed;
 * - cancels, resumes and deletes through the REST API (the buttons' forms post to the page's routes without
 *   JavaScript).
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
        pointRadius: test ? 2.5 : 0, stepped: axis === "lr" ? "before" : false,
      };
      target.data.datasets.push(data);
      entry = { data, target };
      series.set(key, entry);
    }
    return entry.data;
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

  /** A point by iteration. A value that is NaN or infinite is a gap in the line (y null) and a mark. */
  function addPoint(target, key, label, axis, iteration, value, test = false) {
    const read = F.reported(value);
    if (read === undefined) return; // not reported (null): nothing to draw
    const data = dataset(target, key, label, axis, test).data;
    if (Number.isFinite(read)) {
      place(data, { x: iteration, y: read });
      if (series.has(key + ":non-finite")) {
        unplace(marks(target, key, label).data, iteration);
        showNonFinite();
      }
      return;
    }
    const shown = F.number(read);
    place(data, { x: iteration, y: null, shown });
    place(marks(target, key, label).data, { x: iteration, y: 0.96, shown });
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

  let latestTrain = null;
  const latestTests = [];

  /** One runner record (history or event) into the charts and the latest values. */
  function addRecord(record) {
    const iteration = record.iteration;
    if (typeof iteration !== "number") return;
    if (record.event === "iteration") {
      addPoint(chart, "train:loss", "train loss", "loss", iteration, record.loss);
      for (const [name, value] of Object.entries(record.outputs || {})) {
        if (name === "loss") continue;
        addPoint(chart, "train:" + name, "train " + name, ACCURACY.test(name) ? "accuracy" : "loss", iteration, scalar(value));
      }
      addPoint(lrChart, "lr", "learning rate", "lr", iteration, record.lr);
      if (!latestTrain || iteration >= latestTrain.iteration) latestTrain = record;
    } else if (record.event === "test") {
      const net = record.net || 0;
      const prefix = net ? "validation " + net + " " : "validation ";
      for (const [name, value] of Object.entries(record.outputs || {})) {
        const axis = ACCURACY.test(name) ? "accuracy" : "loss";
        addPoint(chart, "test" + net + ":" + name, prefix + name, axis, iteration, scalar(value), true);
      }
      if (!latestTests[net] || iteration >= latestTests[net].iteration) latestTests[net] = record;
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
    if (newest > job.iteration) showIteration(newest);
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
    showIteration(Math.max(job.iteration, latestTrain ? latestTrain.iteration : 0));
    if (job.progress) {
      if (job.progress.train) addRecord(job.progress.train);
      for (const test of job.progress.test || []) if (test) addRecord(test);
      draw();
    }
    const active = F.ACTIVE.has(job.status);
    document.getElementById("cancel-form").hidden = !active;
    document.getElementById("cancel-job").disabled = job.message === "cancelling";
    document.getElementById("delete-form").hidden = active;
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
    const row = F.attemptRow(attempt);
    const old = [...body.children].find((tr) => tr.dataset.attempt === String(attempt.number));
    if (old) old.replaceWith(row);
    else body.append(row);
    document.getElementById("no-attempts").hidden = true;
    if (attempt.number > logAttempt) startLog(attempt.number);
  }

  // --- the log --------------------------------------------------------------------------------------------------

  const logBox = document.getElementById("job-log");
  const lastAttempt = () => (job.attempts && job.attempts.length ? job.attempts[job.attempts.length - 1].number : 0);
  let logAttempt = lastAttempt();
  let logLines = logBox.textContent ? logBox.textContent.split("\n") : [];

  function startLog(number) {
    logAttempt = number;
    logLines = [];
    document.getElementById("log-attempt").textContent = "(attempt " + number + ", last lines)";
    showLog();
  }

  function showLog() {
    const atBottom = logBox.scrollTop + logBox.clientHeight >= logBox.scrollHeight - 8;
    if (logLines.length > LOG_LINES) logLines = logLines.slice(-LOG_LINES);
    logBox.textContent = logLines.join("\n");
    if (atBottom) logBox.scrollTop = logBox.scrollHeight;
  }

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

  document.getElementById("delete-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const answer = await MP.requestJSON(urls.remove, { method: "DELETE" });
    if (answer.ok) window.location.assign(MP.config.jobsUrl);
    else showError("The job was not deleted: " + ((answer.data && answer.data.error) || "HTTP " + answer.status));
  });

  loadHistory();
  loadLog();
  MP.jobPage = { chart, lrChart, series, loadHistory, loadLog, state: () => job };
})();
