/* digits-memplugin: the Devices page, live. The server drew the table; every `devices` event (the document of
 * GET api/devices, pushed every MEMPLUGIN_DEVICES_POLL_SECONDS while the page is subscribed, as on the New model
 * page) redraws its rows and the line saying where the GPUs come from, in the words of templates/memplugin/devices.html.
 * The "Training jobs" column lists this server's attempts on each device (GET api/devices/attempts), fetched again
 * whenever the `jobs` room says an attempt started or ended, a job changed or went, and after a reconnection.
 * Text only (MemPlugin.el): device, process and job names stay text. */
(function () {
  "use strict";

  const MP = window.MemPlugin;
  const { el, formatBytes } = MP;
  const rows = document.getElementById("device-rows");
  if (!rows) return;
  const source = document.getElementById("device-source");
  const updated = document.getElementById("devices-updated");

  const orNA = (value, unit) => (value === null || value === undefined ? "n/a" : value + unit);
  const term = (word) => (MP.term ? MP.term(word) : String(word));
  const engines = MP.readJSON("mp-engines") || {};
  const attemptsNode = document.getElementById("mp-device-attempts");
  let attempts = attemptsNode ? JSON.parse(attemptsNode.textContent) : [];
  let lastDevices = null;
  const CPU_PROCESSES = "NVML lists the processes of GPUs only: the CPU’s are not listed here. This server’s own " +
    "training jobs on it are in the next column.";

  function processes(device) {
    if (device.processes === null || device.processes === undefined) {
      return [el("span", { title: device.kind === "cpu" ? CPU_PROCESSES : "The driver did not say which processes use this GPU." }, "n/a")];
    }
    if (!device.processes.length) return ["none"];
    return device.processes.map((p) => {
      const ours = attempts.find((attempt) => attempt.pid === p.pid);
      const line = el("div", {}, p.pid + " " + (p.name || "n/a") + " (" + formatBytes(p.used_memory) + ")");
      if (ours) line.append(" · ", el("a", { href: ours.url }, ours.job_name));
      return line;
    });
  }

  /** This server's attempts on the device (devices.html: device_jobs). */
  function jobsCell(device) {
    const here = attempts.filter((attempt) => attempt.device === device.key);
    const cell = el("td", { dataset: { role: "jobs" } });
    if (!here.length) { cell.append("none"); return cell; }
    for (const attempt of here) {
      const details = el("div", { className: "mp-muted" }, "attempt " + attempt.attempt + " · batch " + attempt.batch_size +
        " × ", term("iter_size"), " " + attempt.iter_size + (attempt.pid ? " · pid " + attempt.pid : ""));
      cell.append(el("div", { className: "mp-device-job", dataset: { jobId: attempt.job_id } },
        el("a", { href: attempt.url }, attempt.job_name), details));
    }
    return cell;
  }

  function row(device) {
    const name = el("td", { dataset: { role: "name" } }, device.name || "n/a");
    if (device.uuid) {
      name.append(el("div", { className: "mp-muted" }, device.uuid + (device.pci_bus_id ? " · " + device.pci_bus_id : "")));
    }
    if (device.memory_source) name.append(el("div", { className: "mp-muted" }, "memory from ", term(device.memory_source)));
    if (engines[device.kind]) name.append(el("div", { className: "mp-muted", dataset: { role: "engine" } }, "engine ", term(engines[device.kind])));
    const cells = [el("td", { dataset: { role: "label" } }, device.kind === "gpu" ? "GPU " + device.index : "CPU"), name];
    if (device.error) {
      cells.push(el("td", { colSpan: 7, className: "mp-error", dataset: { role: "error" } }, "error: " + device.error));
    } else {
      const number = (role, text) => el("td", { className: "mp-num", dataset: { role } }, text);
      cells.push(
        number("total", formatBytes(device.memory_total)),
        number("free", formatBytes(device.memory_free)),
        number("used", formatBytes(device.memory_used)),
        number("reserved", formatBytes(device.memory_reserved)),
        number("utilization", orNA(device.utilization_gpu, " %")),
        number("temperature", orNA(device.temperature_c, " °C")),
        el("td", { dataset: { role: "processes" } }, ...processes(device)),
      );
    }
    cells.push(jobsCell(device));
    return el("tr", { dataset: { key: device.key } }, ...cells);
  }

  function sourceLine(document_) {
    if (document_.gpu_reason) return ["No GPU is listed: " + document_.gpu_reason + "."];
    if (document_.simulated) {
      return ["GPUs simulated by a fake NVML library (", el("code", {}, "--simulate-gpus"),
        "): no NVIDIA driver is behind them."];
    }
    if (document_.driver_version) return ["NVIDIA driver " + document_.driver_version];
    return [];
  }

  function onDevices(document_) {
    lastDevices = document_;
    rows.replaceChildren(...document_.devices.map(row));
    const line = sourceLine(document_);
    const text = line.map((part) => (typeof part === "string" ? part : part.textContent)).join("");
    if (source.textContent.trim() !== text) source.replaceChildren(...line);
    updated.textContent = "Read " + new Date().toLocaleTimeString() + ". ";
    document.body.dataset.devicesRead = String((Number(document.body.dataset.devicesRead) || 0) + 1);
  }

  /** The attempts fetched again, and the rows redrawn with them (from the last devices document). */
  async function refreshAttempts() {
    if (!attemptsNode) return;
    try {
      const answer = await MP.requestJSON(attemptsNode.dataset.url);
      if (!answer.ok || !answer.data) return;
      attempts = answer.data.attempts;
    } catch (error) {
      return; /* offline: the next reconnection asks again */
    }
    if (lastDevices) onDevices(lastDevices);
    else for (const tr of rows.children) {
      const cell = tr.querySelector('[data-role="jobs"]');
      if (cell) cell.replaceWith(jobsCell({ key: tr.dataset.key }));
    }
    document.body.dataset.attemptsRead = String((Number(document.body.dataset.attemptsRead) || 0) + 1);
  }
  const attemptsLater = MP.debounce(refreshAttempts, 200);

  MP.subscribe("subscribe_devices", "devices", onDevices, { unsubscribeEvent: "unsubscribe_devices" });
  // The jobs room says when an attempt starts or ends (job_attempt), a job changes state (job) or goes (job_deleted);
  // its answer to the subscription (jobs) comes again after every reconnection. A page of one job is enough.
  MP.subscribe("subscribe_jobs", "jobs", attemptsLater, { payload: { limit: 1 }, unsubscribeEvent: "unsubscribe_jobs" });
  for (const event of ["job_attempt", "job", "job_deleted"]) MP.on(event, attemptsLater);
  MP.devicesPage = { onDevices, refreshAttempts };
})();
