/* digits-memplugin: the Devices page, live. The server drew the table; every `devices` event (the document of
 * GET api/devices, pushed every MEMPLUGIN_DEVICES_POLL_SECONDS while the page is subscribed, as on the New model
 * page) redraws its rows and the line saying where the GPUs come from, in the words of templates/memplugin/devices.html.
 * Text only (MemPlugin.el): device and process names stay text. */
(function () {
  "use strict";

  const MP = window.MemPlugin;
  const { el, formatBytes } = MP;
  const rows = document.getElementById("device-rows");
  if (!rows) return;
  const source = document.getElementById("device-source");
  const updated = document.getElementById("devices-updated");

  const orNA = (value, unit) => (value === null || value === undefined ? "n/a" : value + unit);

  function processes(device) {
    if (device.processes === null || device.processes === undefined) return ["n/a"];
    if (!device.processes.length) return ["none"];
    return device.processes.map((p) => el("div", {}, p.pid + " " + (p.name || "n/a") + " (" + formatBytes(p.used_memory) + ")"));
  }

  function row(device) {
    const name = el("td", { dataset: { role: "name" } }, device.name || "n/a");
    if (device.uuid) {
      name.append(el("div", { className: "mp-muted" }, device.uuid + (device.pci_bus_id ? " · " + device.pci_bus_id : "")));
    }
    if (device.memory_source) name.append(el("div", { className: "mp-muted" }, "memory from " + device.memory_source));
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
    rows.replaceChildren(...document_.devices.map(row));
    const line = sourceLine(document_);
    const text = line.map((part) => (typeof part === "string" ? part : part.textContent)).join("");
    if (source.textContent.trim() !== text) source.replaceChildren(...line);
    updated.textContent = "Read " + new Date().toLocaleTimeString() + ". ";
    document.body.dataset.devicesRead = String((Number(document.body.dataset.devicesRead) || 0) + 1);
  }

  MP.subscribe("subscribe_devices", "devices", onDevices, { unsubscribeEvent: "unsubscribe_devices" });
  MP.devicesPage = { onDevices };
})();
