/* digits-memplugin: how a job and its attempts read on the pages (MemPlugin.JobFormat), the same words and
 * badges the server renders (templates/memplugin/macros.html: status_badge, wanted_batch, planned_batch, job_row,
 * attempt_row), so a row redrawn from an event looks like the row the server drew. Elements only, via el(). */
(function () {
  "use strict";

  const { el, formatBytes, formatTime } = window.MemPlugin;
  const ACTIVE = new Set(["queued", "running"]);
  /** The states the API resumes (jobs/manager.py resume; job.html: resumable). */
  const RESUMABLE = new Set(["interrupted", "cancelled", "failed"]);

  function statusBadge(status, id, title) {
    const props = { className: "badge mp-status mp-status-" + status, dataset: { status } };
    if (id) props.id = id;
    if (title) props.title = title;
    return el("span", props, status.replace(/_/g, " "));
  }

  /** An attempt's outcome in plain words (glossary.py's "How an attempt ended"; macros.html: attempt_row), or "". */
  function outcomeWords(status) {
    const glossary = window.MemPlugin.glossary;
    const entry = glossary ? glossary.find("outcome_" + status) : null;
    return entry ? entry.short : "";
  }

  function wantedBatch(batch) {
    if (batch.requested === null || batch.requested === undefined) return "the network's own";
    if (batch.requested === "auto") return "auto (the largest that fits)";
    return String(batch.requested);
  }

  function plannedBatch(batch) {
    if (!batch.batch_size) return "not planned yet";
    return batch.batch_size + " × iter_size " + batch.iter_size + " = " + batch.batch_size * batch.iter_size;
  }

  function deviceLabel(key, labels) {
    return (labels && labels[key]) || key;
  }

  /** JSON has no NaN and no infinity: the server writes them as these strings (core/nonfinite.py). */
  const NON_FINITE = { NaN: NaN, Infinity: Infinity, "-Infinity": -Infinity };

  /** A reported number as a JavaScript number: a number as it is, "NaN" / "Infinity" / "-Infinity" as NaN and the
   *  infinities; undefined for anything else (null, a missing value). */
  function reported(value) {
    if (typeof value === "number") return value;
    if (typeof value === "string" && Object.prototype.hasOwnProperty.call(NON_FINITE, value)) return NON_FINITE[value];
    return undefined;
  }

  /** A number as the server formats it ("%.4g"; NaN and the infinities by name); an output reported by its mean:
   *  "0.5 (mean of 20)". */
  function number(value) {
    if (value && typeof value === "object" && "mean" in value) return number(value.mean) + " (mean of " + value.count + ")";
    const read = reported(value);
    if (read === undefined) return "n/a";
    if (!Number.isFinite(read)) return Number.isNaN(read) ? "NaN" : read > 0 ? "Infinity" : "-Infinity";
    return String(Number(read.toPrecision(4)));
  }

  /** As job_pages.format_duration: "12.3 s", "4 min 05 s", "1 h 02 min"; "" while running. */
  function duration(seconds) {
    if (seconds === null || seconds === undefined) return "";
    if (seconds < 60) return seconds.toFixed(1) + " s";
    const total = Math.round(seconds);
    const minutes = Math.floor(total / 60);
    if (minutes < 60) return minutes + " min " + String(total % 60).padStart(2, "0") + " s";
    return Math.floor(minutes / 60) + " h " + String(minutes % 60).padStart(2, "0") + " min";
  }

  /** As pace.format_rate: "45.2 it/s", "0.587 it/s", whole ones from 100. */
  function rate(perSecond) {
    return (perSecond >= 100 ? String(Math.round(perSecond)) : String(Number(perSecond.toPrecision(3)))) + " it/s";
  }

  /** As pace.format_duration: a time left as people say it ("45 s", "3 min 05 s", "1 h 40 min", "2 d 3 h"). */
  function timeLeft(seconds) {
    if (!Number.isFinite(seconds)) return "unknown";
    const whole = Math.max(0, Math.round(seconds));
    if (whole < 60) return whole + " s";
    const minutes = Math.floor(whole / 60);
    if (minutes < 60) return minutes + " min " + String(whole % 60).padStart(2, "0") + " s";
    const hours = Math.floor(minutes / 60);
    if (hours < 24) return hours + " h " + String(minutes % 60).padStart(2, "0") + " min";
    return Math.floor(hours / 24) + " d " + (hours % 24) + " h";
  }

  /** A running job's speed and time left (job_pages.pace_text): "14.6 it/s · 3 min 05 s left"; "measuring the
   *  speed…" until two records say; "" once it is not running. */
  function paceText(job) {
    if (job.status !== "running") return "";
    const perSecond = job.iterations_per_second;
    if (typeof perSecond !== "number" || !(perSecond > 0)) return "measuring the speed…";
    const left = typeof job.seconds_left === "number" ? " · " + timeLeft(job.seconds_left) + " left" : "";
    return rate(perSecond) + left;
  }

  function iterationText(job, joiner) {
    return job.iteration + (job.max_iter ? joiner + job.max_iter : "");
  }

  /** A row of the jobs list (macros.html: job_row). */
  function jobRow(job, labels, href) {
    const device = job.device.assigned || job.device.requested;
    return el("tr", { dataset: { jobId: job.id, status: job.status } },
      el("td", { dataset: { role: "name" } }, el("a", { href }, job.name)),
      el("td", { dataset: { role: "status" } }, statusBadge(job.status)),
      el("td", { dataset: { role: "device" } }, deviceLabel(device, labels)),
      el("td", { dataset: { role: "batch" } }, plannedBatch(job.batch)),
      el("td", { dataset: { role: "progress" }, className: "text-nowrap" },
        el("span", { dataset: { role: "iteration" } }, iterationText(job, " / ")),
        el("div", { dataset: { role: "pace" }, className: "small text-body-secondary" }, paceText(job))),
      el("td", { dataset: { role: "created" }, className: "text-nowrap" }, formatTime(job.created_at)),
      el("td", { dataset: { role: "message" }, className: "small" }, job.message || ""),
      el("td", { dataset: { role: "actions" }, className: "text-nowrap" }, jobActions(job, href)));
  }

  /** The list's action for a job (macros.html: job_actions): a form post to its confirmation step, with the
   *  page's CSRF token (job-actions.js asks in a dialog instead). */
  function jobActions(job, href) {
    const action = ACTIVE.has(job.status) ? "cancel" : "delete";
    const meta = document.querySelector('meta[name="csrf-token"]');
    const label = action.charAt(0).toUpperCase() + action.slice(1);
    return el("form", { method: "post", action: href + "/confirm/" + action, className: "d-inline mp-job-action",
      dataset: { action } },
    el("input", { type: "hidden", name: "csrf_token", value: meta ? meta.content : "" }),
    el("button", { type: "submit", className: "btn btn-sm " + (action === "cancel" ? "btn-outline-danger" : "btn-outline-secondary"),
      "aria-label": label + " the job " + job.name }, label));
  }

  /** The memory cell of an attempt, each figure labelled with what it counts, one to a line (macros.html:
   *  attempt_row). */
  function memoryParts(attempt) {
    const part = (role, title, text) => el("span", { dataset: { role }, title }, text);
    const parts = [part("estimated", "What the estimator predicted for this batch",
      "estimated " + formatBytes(attempt.estimated_bytes))];
    if (attempt.allocated_bytes !== null && attempt.allocated_bytes !== undefined) {
      parts.push(" ", part("allocated",
        "What Caffe itself allocated at most (malloc's growth): the figure the estimate predicts",
        "Caffe " + formatBytes(attempt.allocated_bytes)));
    }
    const onGpu = attempt.allocated_bytes === null || attempt.allocated_bytes === undefined;
    parts.push(" ", part("peak", onGpu ? "The process at its largest as NVML reports it"
      : "How much the process grew at most (Caffe, Python and the libraries): what the limit applies to",
    "process " + formatBytes(attempt.peak_bytes)));
    parts.push(" ", part("limit", "What the attempt could use: the memory cap less the stacks of Caffe's threads, or the device's free memory when it started",
      "limit " + formatBytes(attempt.limit_bytes)));
    return parts;
  }

  /** What the signal that ended an attempt means (core/oom.py SIGNAL_WORDS, which the job page carries as JSON). */
  let signalWords = null;
  function signalText(name) {
    if (signalWords === null) signalWords = window.MemPlugin.readJSON("mp-signal-words") || {};
    return signalWords[name] || "the training process ended on " + name;
  }
  /** A word linked to its glossary entry (glossary.js, loaded later on the page: looked up when drawn). */
  const term = (word, text) => (window.MemPlugin.term ? window.MemPlugin.term(word, text) : String(text === undefined ? word : text));

  /** Where an attempt's validation nets were (macros.html: test_nets): "shared", or "apart" with its tester's
   *  device, the snapshots it tested, its memory and what pausing for it cost, as far as the record says; a tester
   *  that failed said plainly; "none" without validation. `brief` (the summary): where the tester ran, and its
   *  failure. */
  function testNetParts(attempt, labels, brief = false) {
    const tester = attempt.tester;
    if (attempt.test_net !== "apart") return [attempt.test_batch_size ? term("shared") : "none"];
    const parts = [term("apart")];
    if (!tester) return parts;
    parts.push(":");
    const span = (role, text, props) => el("span", { dataset: { role }, ...(props || {}) }, text);
    if (tester.device) {
      let where = "tester on " + deviceLabel(tester.device, labels);
      if (tester.same_device) {
        where += " (the training device" + (tester.pauses
          ? ": training paused " + tester.pauses + " time" + (tester.pauses !== 1 ? "s" : "") + " for it" : "") + ")";
      }
      parts.push(" ", span("tester-device", where));
    }
    const failure = tester.failed
      ? span("tester-failed", "The tester failed: " + tester.failed.replace("tester: ", ""), { className: "text-danger" })
      : null;
    if (brief) return failure ? [...parts, " ", failure] : parts;
    const tested = tester.tested || [];
    parts.push(" ", span("tested", tested.length + " snapshot" + (tested.length !== 1 ? "s" : "") + " tested" +
      (tested.length ? " (the latest at iteration " + tested[tested.length - 1] + ")" : "")));
    const known = (value) => value !== null && value !== undefined;
    if (known(tester.estimated_bytes)) {
      parts.push(" ", span("tester-estimated", "tester estimated " + formatBytes(tester.estimated_bytes),
        { title: "What the estimator predicted for the tester: the validation nets alone, at their own batch" }));
    }
    if (known(tester.peak_bytes)) {
      parts.push(" ", span("tester-peak", "tester peak " + formatBytes(tester.peak_bytes), { title: "The tester process at its largest" }));
    }
    if (known(tester.stop_cost)) {
      parts.push(" ", span("stop-cost", "stop cost " + (100 * tester.stop_cost).toFixed(1) + "% of an interval", {
        title: "Pausing training for the tester and resuming it (" + tester.setup_seconds.toFixed(1) + " s), against the " +
          "training time of one validation interval (" + tester.interval_seconds.toFixed(1) + " s)",
      }));
    }
    if (failure) parts.push(" ", failure);
    return parts;
  }

  /** A row of a job's attempts table (macros.html: attempt_row); `labels`: the devices' names, by key. */
  function attemptRow(attempt, labels) {
    const why = [];
    if (attempt.out_of_memory) {
      why.push(el("abbr", { dataset: { role: "signature" }, title: "out-of-memory signature: " + attempt.out_of_memory.signature },
        term(attempt.out_of_memory.signature, attempt.out_of_memory.ambiguous ? "Likely out of memory" : "Out of memory")), ": ");
    }
    why.push(attempt.message || "");
    if (attempt.signal) {
      why.push("; ", el("abbr", { dataset: { role: "signal" }, title: attempt.signal }, term(attempt.signal, signalText(attempt.signal))));
    }
    const test = attempt.test_batch_size ? attempt.test_batch_size + " × " + attempt.test_iter : "none";
    const end = attempt.end_iteration === null || attempt.end_iteration === undefined ? "…" : attempt.end_iteration;
    return el("tr", { dataset: { attempt: String(attempt.number), status: attempt.status } },
      el("td", { dataset: { role: "number" } }, String(attempt.number)),
      el("td", { dataset: { role: "status" } }, statusBadge(attempt.status, null, outcomeWords(attempt.status))),
      el("td", { dataset: { role: "batch" } }, String(attempt.batch_size)),
      el("td", { dataset: { role: "iter_size" } }, String(attempt.iter_size)),
      el("td", { dataset: { role: "test" } }, test),
      el("td", { dataset: { role: "test-net" }, className: "small mp-attempt-test-net" }, ...testNetParts(attempt, labels)),
      el("td", { dataset: { role: "iterations" }, className: "text-nowrap" }, attempt.start_iteration + " → " + end),
      el("td", { dataset: { role: "memory" }, className: "small mp-attempt-memory" }, ...memoryParts(attempt)),
      el("td", { dataset: { role: "duration" }, className: "text-nowrap" }, duration(attempt.duration)),
      el("td", { dataset: { role: "why" }, className: "small mp-attempt-why" }, ...why));
  }

  window.MemPlugin.JobFormat = {
    ACTIVE, RESUMABLE, statusBadge, wantedBatch, plannedBatch, deviceLabel, reported, number, duration, iterationText, jobRow,
    attemptRow, testNetParts, outcomeWords, jobActions, rate, timeLeft, paceText,
  };
})();
