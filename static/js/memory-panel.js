/* digits-memplugin: the GPU memory panel (MemPlugin.MemoryPanel).
 *
 * One row per device (server-rendered first, then kept up to date from the `devices` document): a stacked bar of
 * used / reserved / free memory, utilisation and the processes holding memory. Over each bar, the estimated
 * footprint of the network on that device with its verdict ("fits", "fits with iter_size k", "does not fit");
 * below, a chart of memory against batch size with the free memory of the devices of the target's kind as lines
 * (kept, greyed, when an estimate fails: staleCurve), the estimate by kind of memory, and the largest layers.
 * The verdict of one device (a job's target) can be repeated elsewhere, e.g. beside the batch field (showTarget).
 * Terms (iter_size, usable, the kinds of memory) link to their entry in the page's terms section, with their
 * meaning as a tooltip, when the page gives the words (panel_words.py's page_terms).
 * It draws what it is given and fetches nothing, so other pages (a job's page) can reuse it.
 */
(function () {
  "use strict";

  const { el, formatBytes } = window.MemPlugin;

  /** A free-memory line more than this many times the curve's top is not drawn to scale (it would flatten the
   *  curve): the chart says how much is free in words instead. */
  const FREE_LINE_REACH = 3;

  function pct(part, total) {
    if (part === null || part === undefined || !total) return 0;
    return Math.max(0, Math.min(100, (100 * part) / total));
  }

  function deviceLabel(device) {
    const where = device.host ? " of " + device.host : "";
    return (device.kind === "gpu" ? "GPU " + device.index : "CPU") + where;
  }

  /** The words for a plan, as the server says them (model_plan.verdict). */
  function verdictWords(plan) {
    if (!plan || !plan.fits) return "does not fit";
    if (plan.iter_size > 1) return "fits with iter_size " + plan.iter_size;
    return "fits";
  }

  /** Whether a device can be planned on: it was read without error and its free memory is known. */
  function plannable(device) {
    return !device.error && device.memory_free !== null && device.memory_free !== undefined;
  }

  class MemoryPanel {
    constructor(root, terms = null) {
      this.root = root;
      this.terms = terms;
      this.list = root.querySelector("#device-list");
      this.template = root.querySelector("#device-row-template");
      this.updated = root.querySelector("#panel-updated");
      this.layersBody = root.querySelector("#top-layers tbody");
      this.categoriesBody = root.querySelector("#memory-categories tbody");
      this.canvas = root.querySelector("#batch-chart");
      this.chartBox = root.querySelector("#batch-chart-box");
      this.chartMessage = root.querySelector("#chart-message");
      this.chartNote = root.querySelector("#chart-note");
      this.devices = new Map();
      this.estimates = new Map();
      this.chart = null;
      this.target = null;
    }

    /** A term of the page as a link to its entry in the terms section, its meaning as the tooltip; the bare word
     *  when the page has no such entry. */
    term(key, text = null) {
      const known = this.terms && (this.terms.terms[key] || this.terms.engines[key]);
      const word = text || (known ? known.label : key);
      if (!known || !this.root.ownerDocument.getElementById(known.anchor)) return word;
      return el("a", { className: "mp-term", href: "#" + known.anchor, title: known.meaning }, word);
    }

    /** Repeat the verdict of the device `key()` names in `node` (its label first), or show `fallback()` (text)
     *  while that device has none. A copy for the eyes: the panel's own row stays the live region. */
    showTarget(node, key, fallback) {
      this.target = node ? { node, key, fallback } : null;
      this.drawTarget();
    }

    drawTarget() {
      if (!this.target) return;
      const { node, key, fallback } = this.target;
      const target = key();
      const row = target ? this.row(target) : null;
      const verdict = row ? row.querySelector('[data-role="verdict"]') : null;
      if (verdict && verdict.childNodes.length) {
        const label = row.querySelector('[data-role="label"]').textContent;
        node.replaceChildren(el("strong", {}, label + ": "), ...[...verdict.childNodes].map((n) => n.cloneNode(true)));
        node.dataset.deviceKey = target;
      } else {
        node.replaceChildren(fallback());
        delete node.dataset.deviceKey;
      }
    }

    row(key) {
      return [...this.list.children].find((row) => row.dataset.deviceKey === key) || null;
    }

    /** The devices in the order the server lists them (GPUs, then the CPU). */
    deviceList() {
      return [...this.devices.values()];
    }

    plannableDevices() {
      return this.deviceList().filter(plannable);
    }

    /** Take a `devices` document (GET api/devices, or the socketio event). */
    updateDevices(document_) {
      const seen = new Set();
      for (const device of document_.devices) {
        seen.add(device.key);
        let row = this.row(device.key);
        if (!row) {
          row = this.template.content.firstElementChild.cloneNode(true);
          row.dataset.deviceKey = device.key;
        }
        row.dataset.kind = device.kind;
        this.list.append(row); // appending an existing row moves it: rows follow the server's order
        this.fillRow(row, device);
        this.devices.set(device.key, device);
      }
      for (const row of [...this.list.children]) {
        if (!seen.has(row.dataset.deviceKey)) {
          row.remove();
          this.devices.delete(row.dataset.deviceKey);
          this.estimates.delete(row.dataset.deviceKey);
        }
      }
      for (const key of this.devices.keys()) this.drawEstimate(key);
      this.drawTarget();
      if (this.updated) this.updated.textContent = "read " + new Date().toLocaleTimeString();
    }

    fillRow(row, device) {
      const part = (role) => row.querySelector('[data-role="' + role + '"]');
      part("label").textContent = deviceLabel(device);
      part("name").textContent = device.name || "n/a";
      part("utilization").textContent =
        device.kind === "gpu" ? (device.utilization_gpu === null ? "n/a" : device.utilization_gpu + " %") + " busy" : "";
      const total = device.memory_total;
      part("used").style.width = pct(device.memory_used, total) + "%";
      part("reserved").style.width = pct(device.memory_reserved, total) + "%";
      const memory = part("memory");
      if (device.error) {
        memory.replaceChildren(el("span", { className: "text-danger" }, "error: " + device.error));
      } else {
        memory.replaceChildren(
          "used " + formatBytes(device.memory_used) + " · reserved " + formatBytes(device.memory_reserved) + " · ",
          el("strong", {}, "free " + formatBytes(device.memory_free)),
          " of " + formatBytes(total),
        );
      }
      const processes = (device.processes || []).map((p) =>
        el("li", {}, p.pid + " " + (p.name || "n/a") + " (" + formatBytes(p.used_memory) + ")"),
      );
      part("processes").replaceChildren(...processes);
      row.dataset.memoryFree = device.memory_free === null ? "" : String(device.memory_free);
    }

    /** The estimate document of api/estimate for one device (with its plan), or null to clear it. */
    setEstimate(key, estimate) {
      if (estimate) this.estimates.set(key, estimate);
      else this.estimates.delete(key);
      this.drawEstimate(key);
    }

    /** Forget every estimate: the bars, verdicts and tables no longer show a network; the chart of the last good
     *  estimate stays, greyed, saying why (`reason`). */
    clearEstimates(reason = "") {
      for (const key of [...this.estimates.keys()]) this.setEstimate(key, null);
      this.setLayers([]);
      this.setCategories(null);
      this.staleCurve(reason);
    }

    drawEstimate(key) {
      const row = this.row(key);
      if (!row) return;
      const marker = row.querySelector('[data-role="estimate"]');
      const verdict = row.querySelector('[data-role="verdict"]');
      const device = this.devices.get(key);
      const estimate = this.estimates.get(key);
      if (!estimate || !device || !device.memory_total || !estimate.plan) {
        marker.hidden = true;
        verdict.replaceChildren();
        delete row.dataset.verdict;
        delete row.dataset.estimateBytes;
        this.drawTarget();
        return;
      }
      const plan = estimate.plan;
      // What would run: the asked batch when it fits in one pass, the planned batch when iter_size keeps the
      // effective batch, and the asked batch overflowing the bar (red) when not even batch 1 fits.
      const drawn = plan.fits ? plan.bytes : estimate.total_bytes;
      const taken = (device.memory_used || 0) + (device.memory_reserved || 0);
      const left = pct(taken, device.memory_total);
      marker.style.left = left + "%";
      marker.style.width = Math.min(100 - left, pct(drawn, device.memory_total)) + "%";
      marker.classList.toggle("mp-estimate-over", !plan.fits);
      marker.classList.toggle("mp-estimate-iter", plan.fits && plan.iter_size > 1);
      marker.hidden = false;
      marker.title = plan.fits
        ? "this network at batch " + plan.batch_size + " × iter_size " + plan.iter_size + ": " + formatBytes(plan.bytes)
        : "this network at batch " + estimate.batch_size + ": " + formatBytes(estimate.total_bytes);

      const words = verdictWords(plan);
      const badge = el("span", { className: "badge " + (plan.fits ? (plan.iter_size > 1 ? "text-bg-warning" : "text-bg-success") : "text-bg-danger") }, words);
      let detail = [" batch " + plan.batch_size + " × ", this.term("iter_size"), " " + plan.iter_size + ": " +
        formatBytes(plan.bytes) + " of " + formatBytes(estimate.usable_bytes) + " ", this.term("usable")];
      if (plan.fits && plan.iter_size > 1) {
        detail.push(" (batch " + estimate.batch_size + " in one pass: " + formatBytes(estimate.total_bytes) + ")");
      }
      if (!plan.fits) {
        detail = [" even batch 1 is too big: " + formatBytes(estimate.usable_bytes) + " ", this.term("usable"),
          "; batch " + estimate.batch_size + " needs " + formatBytes(estimate.total_bytes)];
      }
      const largest = estimate.max_batch_size ? " · largest batch " + estimate.max_batch_size : "";
      verdict.replaceChildren(badge, ...detail, largest);
      row.dataset.verdict = words;
      row.dataset.estimateBytes = String(estimate.total_bytes);
      row.dataset.maxBatch = String(estimate.max_batch_size);
      this.drawTarget();
    }

    /** The largest consumers of an estimate document, largest first. On a phone the Type column is left out (the
     *  type is the name's tooltip there), so that the Memory column is in sight. */
    setLayers(layers, count = 10) {
      const rows = [...(layers || [])]
        .sort((a, b) => b.bytes - a.bytes)
        .slice(0, count)
        .map((layer) =>
          el("tr", {},
            el("td", { className: "mp-break", title: layer.type }, layer.name),
            el("td", { className: "d-none d-sm-table-cell" }, layer.type), el("td", {}, layer.phase),
            el("td", { className: "text-end text-nowrap" }, formatBytes(layer.bytes))),
        );
      this.layersBody.replaceChildren(...rows);
    }

    /** The estimate by kind of memory (its `categories`), in the memory model's order, with each kind's share of
     *  `total`; kinds the net has none of are left out. null empties the table. */
    setCategories(categories, total = 0) {
      if (!this.categoriesBody) return;
      const order = this.terms ? this.terms.categories : Object.keys(categories || {}).map((key) => ({ key, label: key }));
      const rows = order
        .filter((category) => categories && categories[category.key])
        .map((category) => {
          const bytes = categories[category.key];
          const share = total ? Math.round((100 * bytes) / total) + " %" : "";
          const label = this.root.ownerDocument.getElementById(category.anchor)
            ? el("a", { className: "mp-term", href: "#" + category.anchor, title: category.meaning }, category.label)
            : category.label;
          return el("tr", { dataset: { category: category.key } },
            el("td", {}, label), el("td", { className: "text-end text-nowrap" }, formatBytes(bytes)),
            el("td", { className: "text-end text-nowrap" }, share));
        });
      this.categoriesBody.replaceChildren(...rows);
    }

    /** The estimate failed: the chart of the last good one stays, greyed, and the message above it says so
     *  (`reason`); with no chart yet, the message stands in its place (never an empty 0-1 B grid). */
    staleCurve(reason) {
      if (!this.chartMessage) return;
      const drawn = Boolean(this.chart && this.chart.data.datasets.length);
      const why = reason ? ": " + reason : ".";
      this.chartMessage.textContent = drawn
        ? "Greyed: the chart of the last good estimate. The form has no estimate now" + why
        : "No chart: the form has no estimate" + why;
      this.chartMessage.hidden = false;
      if (this.chartNote) this.chartNote.replaceChildren(); // it spoke of the chart as current
      if (this.chartBox) {
        this.chartBox.hidden = !drawn;
        this.chartBox.classList.toggle("mp-stale", drawn);
        if (drawn) this.chartBox.dataset.stale = "true";
        else delete this.chartBox.dataset.stale;
      }
    }

    /** Memory against batch size: `points` [{batch, bytes}] of one `engine` (the target device's), the current
     *  batch marked, and the free memory of `lined` (the devices of the target's kind) as horizontal lines.
     *  `marks` [{batch, label}] are batches worth a vertical line (the training dataset's size). A free line far
     *  above the curve would flatten it against the axis: the y axis then ends above the curve, and #chart-note
     *  gives that device's free memory in words. */
    drawCurve(points, current, engine, { lined = [], marks = [] } = {}) {
      if (!this.canvas || typeof window.Chart !== "function") return;
      const xs = points.map((p) => p.batch);
      const xmin = Math.min(...xs);
      const xmax = Math.max(...xs);
      const curveTop = Math.max(...points.map((p) => p.bytes));
      const near = lined.filter((device) => device.memory_free <= FREE_LINE_REACH * curveTop);
      const far = lined.filter((device) => device.memory_free > FREE_LINE_REACH * curveTop);
      const ymax = Math.max(curveTop, ...near.map((device) => device.memory_free)) * 1.1;
      const palette = ["#198754", "#fd7e14", "#6f42c1", "#d63384", "#20c997", "#0dcaf0"];
      const datasets = [
        {
          label: "this network (" + engine + ")",
          data: points.map((p) => ({ x: p.batch, y: p.bytes })),
          showLine: true, borderColor: "#0d6efd", backgroundColor: "#0d6efd", pointRadius: 2, borderWidth: 2,
        },
      ];
      if (current) {
        datasets.push({
          label: "batch " + current.batch,
          data: [{ x: current.batch, y: current.bytes }],
          showLine: false, pointRadius: 5, borderColor: "#084298", backgroundColor: "#084298",
        });
      }
      lined.forEach((device, index) => {
        datasets.push({
          label: deviceLabel(device) + " free",
          data: [{ x: xmin, y: device.memory_free }, { x: xmax, y: device.memory_free }],
          showLine: true, borderDash: [6, 4], pointRadius: 0, borderWidth: 2,
          borderColor: palette[index % palette.length], backgroundColor: palette[index % palette.length],
        });
      });
      for (const mark of marks) {
        datasets.push({
          label: mark.label,
          data: [{ x: mark.batch, y: 0 }, { x: mark.batch, y: ymax }],
          showLine: true, borderDash: [2, 3], pointRadius: 0, borderWidth: 1.5, borderColor: "#6c757d",
          backgroundColor: "#6c757d",
        });
      }
      const scales = {
        x: { type: "linear", title: { display: true, text: "batch size" }, min: xmin, max: xmax },
        y: { beginAtZero: true, max: ymax, title: { display: true, text: "memory" }, ticks: { callback: (v) => formatBytes(v) } },
      };
      if (this.chartBox) {
        this.chartBox.hidden = false;
        this.chartBox.classList.remove("mp-stale");
        delete this.chartBox.dataset.stale;
      }
      if (this.chartMessage) {
        this.chartMessage.textContent = "";
        this.chartMessage.hidden = true;
      }
      if (this.chartNote) {
        this.chartNote.replaceChildren(
          "The network's memory with the ", this.term(engine), " ", this.term("engine"), ", from batch " + xmin +
          " to " + xmax + ".",
          ...far.map((device) => " " + deviceLabel(device) + " has " + formatBytes(device.memory_free) +
            " free, far above this range (its line is off the chart)."),
        );
      }
      if (this.chart) {
        this.chart.data.datasets = datasets;
        this.chart.options.scales.x.min = xmin;
        this.chart.options.scales.x.max = xmax;
        this.chart.options.scales.y.max = ymax;
        this.chart.update("none");
        return;
      }
      this.chart = new window.Chart(this.canvas, {
        type: "scatter",
        data: { datasets },
        options: {
          animation: false,
          maintainAspectRatio: false,
          scales,
          plugins: {
            legend: { labels: { boxWidth: 12 } },
            tooltip: {
              callbacks: { label: (ctx) => ctx.dataset.label + ": batch " + ctx.parsed.x + ", " + formatBytes(ctx.parsed.y) },
            },
          },
        },
      });
    }
  }

  Object.assign(window.MemPlugin, { MemoryPanel, verdictWords, deviceLabel, plannable });
})();
