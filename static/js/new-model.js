/* digits-memplugin: the "New model" page. The form works without this script; with it, the page
 *
 * - shows only the chosen network and solver sections, and copies a standard network into the custom one;
 * - re-estimates the network ~300 ms after the last edit (POST models/estimate.json, api/estimate's twin that
 *   answers a request it cannot estimate with 200 and {"errors"}: no console error per keystroke; once per
 *   device, each against that device's free memory with the engine and margin jobs are planned with there, then
 *   once for the chart), cancelling stale estimates; a batch past Caffe's limit is refused before asking;
 * - shows a definition error beside the field that caused it (a line number only beside text the user typed), and
 *   says in the status line which field is wrong;
 * - draws the chart for the engine of the device the job would be planned on, over the batches that matter there
 *   (up to a little past the batch asked for, the largest that fits and the training dataset's size), and keeps
 *   the last good chart, greyed, while the form has an error;
 * - shows the estimate by kind of memory (parameters, activations, solver state...) beside the largest layers;
 * - after a failed Create, brings the first error into sight with the focus on its field;
 * - says why a batch Caffe cannot build in one pass (a blob over INT_MAX elements) is split with iter_size;
 * - fills in the suggested batch when Auto is pressed (the largest batch that fits on the chosen device, within
 *   the cap of "auto": a twentieth of the training set, at most 256, which the server applies and words), and
 *   estimates a typed "auto" at that batch;
 * - says how long the job trains at that batch: iterations by the epochs, validation once an epoch, one pass;
 * - fills in the item shape and format of a dataset chosen from those found under the dataset folders;
 * - keeps the memory panel live from the `devices` socketio event, re-estimating when free memory moves;
 * - repeats the target device's verdict under the batch field (#batch-verdict), for screens where the panel is
 *   below the form;
 * - says where the plan puts the validation nets (#test-net-note: shared, or apart with the tester's memory, and
 *   why), estimating with the form's "Test nets" choice, and disables "Tester device" while they are shared.
 */
(function () {
  "use strict";

  const MP = window.MemPlugin;
  const form = document.getElementById("new-model-form");
  if (!form) return;
  const panelRoot = document.getElementById("memory-panel");
  const terms = MP.readJSON("mp-terms");
  const panel = new MP.MemoryPanel(panelRoot, terms);
  const estimateUrl = panelRoot.dataset.estimateUrl || MP.config.estimateUrl;
  const networks = JSON.parse(document.getElementById("mp-standard-networks").textContent);
  const datasets = JSON.parse(document.getElementById("mp-datasets").textContent).datasets.filter((d) => !d.error);
  const statusLine = document.getElementById("estimate-status");
  const batchNote = document.getElementById("batch-note");
  const autoButton = document.getElementById("auto-batch");

  const DEBOUNCE_MS = 300;
  const CHART_POINTS = 7;
  const CHART_SPAN = 1.5; // the chart runs to this many times the largest batch that matters on the target
  const MAX_CHART_BATCH = Number(panelRoot.dataset.maxCurveBatch) || 1 << 20; // core.planner.MAX_BATCH
  const INT_MAX = 2147483647;
  const BATCH_LIMIT = "a batch size is at most 2147483647 (Caffe keeps it in a 32-bit int)"; // forms.BATCH_LIMIT
  /** How the status line names a field whose value stops the estimate. */
  const FIELD_WORDS = {
    batch_size: "the batch size", item_shape: "the item shape", classes: "the number of classes",
    custom_network: "the network definition", standard_network: "the standard network", solver_text: "the solver",
    solver_type: "the solver", device: "the device",
  };
  const DATA_LAYER_TYPES = new Set(["Data", "ImageData", "HDF5Data", "WindowData"]);
  const REESTIMATE_FRACTION = 0.005; // of a device's total memory: free memory moving less does not re-estimate

  const field = (name) => form.elements.namedItem(name);
  const value = (name) => {
    const node = field(name);
    return node ? node.value : "";
  };
  const chosenNetwork = () => networks.find((n) => n.key === value("standard_network")) || networks[0];

  // --- sections and standard networks -------------------------------------------------------------------------

  function showSections() {
    for (const section of form.querySelectorAll("[data-network-section]")) {
      section.hidden = section.dataset.networkSection !== value("network");
    }
    for (const section of form.querySelectorAll("[data-solver-section]")) {
      section.hidden = section.dataset.solverSection !== value("solver");
    }
  }

  /** Empty shape and class fields stand for the standard network's dataset (the server does the same). */
  function showDefaults() {
    const network = value("network") === "standard" ? chosenNetwork() : null;
    field("item_shape").placeholder = network ? "default: " + network.item_shape : "channels,height,width";
    field("classes").placeholder = network ? "default: " + network.classes : "";
  }

  // --- datasets found under the dataset folders (dataset_scan.py) ------------------------------------------------

  /** The dataset a source field names (by its name under a root, or its path), of the chosen format first. */
  function datasetNamed(text) {
    const name = text.trim();
    if (!name) return null;
    const named = datasets.filter((d) => d.name === name || d.path === name);
    return named.find((d) => d.format === value("data_backend")) || named[0] || null;
  }

  /** The training dataset, when the form names one that was found: its size caps Auto (planner.auto_batch_limit). */
  const trainDataset = () => datasetNamed(value("train_source"));

  /** A dataset chosen from the list: its format and item shape go into their fields. */
  function useDataset(input) {
    const dataset = datasetNamed(input.value);
    if (!dataset) return;
    if (field("data_backend").value !== dataset.format) field("data_backend").value = dataset.format;
    if (input.name === "train_source" && dataset.shape) {
      field("item_shape").value = dataset.shape.join(",");
      clearError("item_shape");
    }
  }

  for (const button of form.querySelectorAll("[data-customize]")) {
    button.hidden = false;
    button.addEventListener("click", () => {
      const network = networks.find((n) => n.key === button.dataset.customize);
      field("custom_network").value = network.text;
      if (!value("item_shape")) field("item_shape").value = network.item_shape;
      if (!value("classes")) field("classes").value = network.classes;
      field("network").value = "custom";
      showSections();
      showDefaults();
      field("custom_network").focus();
      schedule();
    });
  }

  function readInto(fileInput, textarea) {
    fileInput.addEventListener("change", () => {
      const file = fileInput.files && fileInput.files[0];
      if (!file) return;
      file.text().then((text) => {
        textarea.value = text;
        schedule();
      });
    });
  }
  readInto(field("custom_network_file"), field("custom_network"));
  readInto(field("solver_file"), field("solver_text"));

  // --- errors beside the fields --------------------------------------------------------------------------------

  /** Fields whose text the user typed: only there does a line number point at something they can see. */
  const TYPED_TEXT_FIELDS = new Set(["custom_network", "solver_text"]);

  function errorNode(error, name) {
    if (typeof error === "string") return MP.el("div", {}, error);
    const parts = [];
    if (error.network) parts.push(error.network + ", ");
    if (error.line && TYPED_TEXT_FIELDS.has(name)) {
      parts.push(MP.el("strong", { className: "mp-error-where" },
        "Line " + error.line + (error.column ? ", column " + error.column : "") + ":"), " ");
    }
    if (error.layer) parts.push("layer “" + error.layer + "”" + (error.layer_type ? " (" + error.layer_type + ")" : "") + ": ");
    const message = error.detail || error.message;
    // A request field's own error already names it ("batch must be at most ..."): its name is not said twice.
    if (error.field && !String(message).startsWith(error.field)) parts.push(error.field + ": ");
    parts.push(message);
    return MP.el("div", {}, ...parts);
  }

  function setError(name, error) {
    const box = form.querySelector('[data-error-for="' + name + '"]');
    if (!box) return false;
    box.replaceChildren(errorNode(error, name));
    box.classList.add("d-block");
    box.dataset.from = "estimate";
    const input = field(name);
    if (input && input.classList) {
      input.classList.add("is-invalid");
      input.setAttribute("aria-invalid", "true");
    }
    return true;
  }

  function clearError(name) {
    const box = form.querySelector('[data-error-for="' + name + '"]');
    if (box) {
      box.replaceChildren();
      box.classList.remove("d-block");
      delete box.dataset.from;
    }
    const input = field(name);
    if (input && input.classList) {
      input.classList.remove("is-invalid");
      input.removeAttribute("aria-invalid");
    }
  }

  function clearEstimateErrors() {
    for (const box of form.querySelectorAll('[data-error-for][data-from="estimate"]')) clearError(box.dataset.errorFor);
  }

  /** The form field an error of api/estimate belongs beside: the one that caused it (model_plan._error_field does
   * the same server-side). A standard network builds at its own dataset's shape and batch, so an error in it comes
   * from what the user changed: the item shape if one was typed, else the batch. */
  function fieldFor(key, error) {
    if (key === "net") {
      if (error.field === "top" && DATA_LAYER_TYPES.has(error.layer_type)) return "item_shape";
      if (error.field === "inner_product_param.num_output" && !value("classes")) return "classes";
      if (value("network") === "custom") return "custom_network";
      const standard = chosenNetwork();
      const shape = value("item_shape").trim();
      if (shape && shape.replace(/\s/g, "") !== standard.item_shape) return "item_shape";
      if (/^\d+$/.test(value("batch_size").trim())) return "batch_size";
      return "standard_network";
    }
    if (key === "solver") return value("solver") === "file" ? "solver_text" : "solver_type";
    if (key === "batch") return "batch_size";
    if (key === "classes") return "classes";
    if (key.startsWith("data_shapes")) return "item_shape";
    return value("network") === "custom" ? "custom_network" : "standard_network";
  }

  // --- the estimate request -------------------------------------------------------------------------------------

  /** What memory depends on in the solver: its type, the DIGITS stages, and whether a validation net exists. */
  function solverText() {
    if (value("solver") === "file") return value("solver_text").trim() ? value("solver_text") : null;
    let text = 'type: "' + value("solver_type") + '"\ntrain_state { stage: "train" }\n';
    if (value("val_source").trim()) text += 'test_iter: 1\ntest_interval: 1\ntest_state { stage: "val" }\n';
    return text;
  }

  /** The request shared by every device, or {errors} found before asking the server. With `auto` (the Auto button)
   * or "auto" typed, the batch is the largest that fits on each device, capped at the training dataset's size
   * (`max_batch`, which the server's planner honours): {request, auto: true}. */
  function baseRequest(auto = false) {
    const errors = {};
    const standard = value("network") === "standard" ? chosenNetwork() : null;
    const net = standard ? standard.text : value("custom_network");
    if (!net.trim()) errors.custom_network = "paste a network definition or upload a prototxt file";
    const shapeText = value("item_shape").trim() || (standard ? standard.item_shape : "");
    let shape = null;
    if (shapeText) {
      shape = shapeText.split(/[,x]/).filter((p) => p.trim()).map(Number);
      if (!shape.length || !shape.every((d) => Number.isInteger(d) && d > 0)) {
        errors.item_shape = shapeText + " is not a shape: write dimensions like 3,256,256";
      }
    }
    const classesText = value("classes").trim() || (standard ? String(standard.classes) : "");
    const classes = classesText ? Number(classesText) : null;
    if (classesText && !(Number.isInteger(classes) && classes > 0)) errors.classes = "give a positive number of classes";
    const batchText = auto ? "auto" : value("batch_size").trim().toLowerCase();
    let batch = null;
    if (batchText && batchText !== "auto") {
      batch = Number(batchText);
      if (/^\d+$/.test(batchText) && batch > INT_MAX) {
        errors.batch_size = batchText + " is too large: " + BATCH_LIMIT; // said as the form says it (parse_batch)
      } else if (!(Number.isInteger(batch) && batch > 0)) {
        errors.batch_size = batchText + " is not a batch size: give a positive integer, or 'auto'";
      }
    }
    if (Object.keys(errors).length) return { errors };
    const request = { net, solver: solverText() };
    // Where the validation nets are planned (api/estimate's test_net); "auto", the default, is not sent.
    if (value("test_net") && value("test_net") !== "auto") request.test_net = value("test_net");
    if (shape) request.data_shapes = { data: shape };
    if (classes) request.classes = classes;
    if (batch) request.batch = batch;
    if (batchText !== "auto") return { request };
    // As a job's "auto" is capped (planner.auto_cap: a twentieth of the training set, at most 256): the server
    // applies the cap and says why (auto_cap).
    request.auto = true;
    const dataset = trainDataset();
    if (dataset && dataset.entries) request.train_items = dataset.entries;
    return { request, auto: true };
  }

  /** The device a job would be planned on: the chosen one, or the GPU with the most free memory (model_plan.target_device). */
  function targetDevice() {
    const devices = panel.plannableDevices();
    const choice = value("device");
    if (choice === "next") {
      const gpus = devices.filter((d) => d.kind === "gpu");
      if (!gpus.length) return devices.find((d) => d.kind === "cpu") || null;
      return gpus.reduce((best, d) => (d.memory_free > best.memory_free ? d : best));
    }
    return devices.find((d) => d.key === choice) || null;
  }

  let generation = 0;
  let controller = null;
  let running = null;
  const results = new Map();
  /** The request and the devices of the estimate in flight, and of the last one the server answered (well or with
   * errors): the same definition is not sent again, nor restarted while the server works on it (the pycaffe
   * fallback takes seconds), unless a device's free memory moved (`force`). */
  let answeredKey = null;
  let pendingKey = null;
  let replanAfter = false;
  const requestKey = (request, devices) => JSON.stringify([request, devices.map((d) => d.key).sort()]);

  /** The status line: text, or text and nodes (a term's link). */
  function setStatus(...parts) {
    statusLine.replaceChildren(...parts);
    panel.drawTarget();
  }

  /** "No estimate: the batch size has an error, shown beside it." Names what is wrong: the batch is not the
   * definition. */
  function noEstimate(names) {
    const words = [...new Set(names.map((name) => FIELD_WORDS[name] || "a field"))];
    const which = words.length > 1 ? words.slice(0, -1).join(", ") + " and " + words[words.length - 1] : words[0];
    return "No estimate: " + which + (words.length > 1 ? " have errors, shown beside them." : " has an error, shown beside it.");
  }

  /** An answer of the page's estimate endpoint that is a document: not an HTTP failure, not {"errors"}. */
  const estimated = (answer) => answer.ok && answer.data && !answer.data.errors;

  /** Estimate on every device; resolves when the panel's verdicts are drawn (the chart follows on its own). */
  function runEstimate(force = false, auto = false) {
    running = estimateDevices(force, auto).finally(() => { running = null; });
    return running;
  }

  /** Estimate on every device, unless the server already answered this very request on these devices (an error
   * stays shown until the text, the batch, the shapes or the set of devices change). */
  async function estimateDevices(force, autoButton) {
    const { request, errors, auto } = baseRequest(autoButton);
    const devices = panel.plannableDevices();
    const key = request ? requestKey({ ...request, auto: Boolean(auto) }, devices) : null;
    if (!force && key !== null && (key === answeredKey || key === pendingKey)) return;
    if (force && key !== null && key === pendingKey) {
      // Free memory moved while this very request is in flight: let it finish (the pycaffe fallback takes
      // seconds, and on a busy machine the CPU's free memory moves at every `devices` event, which would restart
      // it for ever), then plan again against the memory free by then.
      replanAfter = true;
      return;
    }
    const current = ++generation;
    if (controller) controller.abort();
    controller = new AbortController();
    const signal = controller.signal;
    answeredKey = null;
    pendingKey = key;
    replanAfter = false;
    clearEstimateErrors();
    if (errors) {
      for (const [name, message] of Object.entries(errors)) setError(name, message);
      const status = noEstimate(Object.keys(errors));
      panel.clearEstimates(status.replace(/^No estimate: /, ""));
      results.clear();
      showTestNet(null);
      setStatus(status);
      return;
    }
    if (!devices.length) return;
    setStatus("Estimating…");
    let answers;
    const ask = (device, extra) => MP.requestJSON(estimateUrl, {
      method: "POST",
      signal,
      body: { ...request, ...extra, device: device.key }, // the server picks the engine jobs train with there
    });
    try {
      answers = await Promise.all(devices.map((device) => ask(device, {})));
      if (auto) {
        // "auto": each device at the largest batch that fits there (capped), as a job would run; one that cannot
        // fit even batch 1 keeps the network's own batch, and its verdict says it does not fit.
        answers = await Promise.all(answers.map((answer, index) => {
          const largest = estimated(answer) && answer.data.max_batch_size;
          return largest && largest !== answer.data.batch_size ? ask(devices[index], { batch: largest }) : answer;
        }));
      }
    } catch (error) {
      if (error.name !== "AbortError" && current === generation) {
        pendingKey = null;
        setStatus("No estimate: the server did not answer.");
      }
      return;
    }
    if (current !== generation) return;
    answeredKey = key;
    pendingKey = null;
    if (replanAfter) {
      replanAfter = false;
      if (answers.every(estimated)) scheduleForced(); // an error does not depend on free memory
    }
    const failed = answers.find((answer) => !estimated(answer));
    if (failed) {
      results.clear();
      showTestNet(null);
      const found = (failed.data && failed.data.errors) || {};
      const shownAt = [];
      let unplaced = null;
      for (const [key, error] of Object.entries(found)) {
        const name = fieldFor(key, error);
        const shown = value("network") === "standard" && typeof error === "object" && error.layer
          ? { ...error, network: chosenNetwork().title } : error;
        if (setError(name, shown)) shownAt.push(name);
        else unplaced = key + ": " + (error.message || error);
      }
      let status;
      if (unplaced) status = "No estimate: " + unplaced;
      else if (shownAt.length) status = noEstimate(shownAt);
      else status = "No estimate: " + ((failed.data && failed.data.error) || "HTTP " + failed.status);
      panel.clearEstimates(status.replace(/^No estimate: /, ""));
      setStatus(status);
      return;
    }
    results.clear();
    devices.forEach((device, index) => {
      results.set(device.key, answers[index].data);
      panel.setEstimate(device.key, answers[index].data);
    });
    answeredRequest = request;
    showTargetEstimate();
    const target = targetDevice();
    const shown = results.get(target ? target.key : devices[0].key);
    showBlobLimit(shown.blob_limit);
    showLength(shown);
    if (auto && !autoButton && target) {
      delete batchNote.dataset.from;
      batchNote.textContent = autoNote(target, results.get(target.key));
    }
  }

  /** The request of the estimate last answered well (the chart and the tables are drawn from it). */
  let answeredRequest = null;

  /** What the panel shows of the target device's estimate: the status line, the kinds of memory, the largest
   * layers and the chart, for the device a job would be planned on (drawn again when the device field changes). */
  function showTargetEstimate() {
    const devices = panel.plannableDevices().filter((d) => results.has(d.key));
    if (!answeredRequest || !devices.length) return;
    const chosen = targetDevice();
    const target = devices.find((d) => chosen && d.key === chosen.key) || devices[0];
    const shown = results.get(target.key);
    panel.setLayers(shown.layers);
    panel.setCategories(shown.categories, shown.total_bytes);
    showTestNet(shown, target);
    setStatus(
      "Estimated: " + MP.formatBytes(shown.total_bytes) + " at batch " + shown.batch_size + " on " +
      MP.deviceLabel(target) + " (", panel.term("engine"), " ", panel.term(shown.engine),
      (shown.flavour === "nvcaffe" ? ", NVcaffe" : "") + ").",
    );
    drawCurve(answeredRequest, target, shown);
  }

  /** Beside the batch field: why the batch asked for is split into passes although memory is not the reason
   * (Caffe cannot build a blob over INT_MAX elements). Cleared when the batch no longer hits the limit. */
  function showBlobLimit(limit) {
    if (limit) {
      batchNote.textContent = limit.message + ".";
      batchNote.dataset.from = "blob-limit";
    } else if (batchNote.dataset.from === "blob-limit") {
      batchNote.textContent = "";
      delete batchNote.dataset.from;
    }
  }

  /** The batches the chart spans on the target device: from 1 to a little past the batches that matter there,
   * the batch asked for, the largest that fits, and the training dataset's size when the form names one (Auto
   * goes no further): LeNet on a dataset of 512 images is drawn up to ~768, not to the 100,000 a GPU would hold. */
  function chartBatches(estimate) {
    const wanted = estimate.batch_size;
    const largest = estimate.max_batch_size || wanted;
    const dataset = trainDataset();
    const entries = dataset && dataset.entries ? dataset.entries : null;
    const top = Math.min(MAX_CHART_BATCH, Math.max(8, Math.ceil(CHART_SPAN * Math.max(wanted, entries ? Math.min(largest, entries) : largest))));
    const batches = new Set([1, wanted]);
    for (let i = 1; i < CHART_POINTS; i++) batches.add(Math.max(1, Math.round((top * i) / (CHART_POINTS - 1))));
    if (largest <= top) batches.add(largest);
    if (entries && entries <= top) batches.add(entries);
    return { batches: [...batches].filter((b) => b <= MAX_CHART_BATCH).sort((a, b) => a - b), entries, dataset };
  }

  let curveController = null;
  const curves = new Map(); // what the server answered, by request: a device change redraws without asking again

  /** Memory against batch size for the target device's engine, in one request (api/estimate's curve_batches). */
  async function drawCurve(request, target, estimate) {
    const engine = estimate.engine; // the engine the server planned with there (its policy)
    const { batches, entries, dataset } = chartBatches(estimate);
    const body = { ...request, engine, batch: estimate.batch_size, curve_batches: batches };
    const key = JSON.stringify(body);
    const current = generation;
    if (curveController) curveController.abort();
    let answer = curves.get(key);
    if (!answer) {
      curveController = new AbortController();
      try {
        answer = await MP.requestJSON(estimateUrl, { method: "POST", signal: curveController.signal, body });
      } catch (error) {
        return;
      }
      if (!estimated(answer)) return;
      if (curves.size > 16) curves.clear();
      curves.set(key, answer);
    }
    const now = targetDevice();
    if (current !== generation || (now && now.key !== target.key)) {
      if (current === generation) showTargetEstimate(); // the device changed while the curve was asked for
      return;
    }
    // A batch past Caffe's limits (a blob over INT_MAX elements) has no estimate: the curve stops before it.
    const points = answer.data.curve.filter((p) => p.total_bytes !== null).map((p) => ({ batch: p.batch, bytes: p.total_bytes }));
    if (points.length < 2) return;
    const mark = points.find((p) => p.batch === estimate.batch_size);
    const lined = panel.plannableDevices().filter((d) => d.kind === target.kind);
    const marks = entries && entries <= points[points.length - 1].batch
      ? [{ batch: entries, label: "dataset: " + entries + " items (" + dataset.name + ")" }] : [];
    panel.drawCurve(points, mark, engine, { lined, marks });
  }

  // --- where the validation nets live (issue 28) -------------------------------------------------------------

  const testNetNote = document.getElementById("test-net-note");

  /** "Test nets shared: ..." as model_plan._why words a plan's test_net_note: its placement said once. */
  function why(note) {
    const text = note.replace(/^test nets (shared|apart): /, "").trim().replace(/\.$/, "");
    return text ? text.charAt(0).toUpperCase() + text.slice(1) + "." : "";
  }

  /** Where the tester would run, as the form chose it (model_plan.apart_words). */
  function testerPlace(target) {
    const choice = value("tester_device");
    const label = MP.deviceLabel(target);
    if (choice === "auto" && target.kind === "gpu" && panel.plannableDevices().some((d) => d.kind === "gpu" && d.key !== target.key)) {
      return "another GPU with room for it, else " + label + " (training pauses meanwhile)";
    }
    if (choice === "auto" || choice === "same" || choice === target.key) return label + " (training pauses meanwhile)";
    const other = panel.plannableDevices().find((d) => d.key === choice);
    return other ? MP.deviceLabel(other) : choice;
  }

  /** Where the target device's plan puts the validation nets, in words (PlannedJob.test_net_words): "Test nets
   * apart: the tester on CPU (training pauses meanwhile), about 5.7 MiB. <why>"; nothing without validation. */
  function testNetWords(estimate, target) {
    if (!estimate || !target) return "";
    if (estimate.test_net === "apart") {
      const bytes = estimate.tester_bytes === null || estimate.tester_bytes === undefined ? ""
        : ", about " + MP.formatBytes(estimate.tester_bytes);
      const reason = estimate.test_net_note ? " " + why(estimate.test_net_note) : "";
      return "Test nets apart: the tester on " + testerPlace(target) + bytes + "." + reason;
    }
    if (estimate.test_net_note) return "Test nets shared. " + why(estimate.test_net_note);
    if (value("test_net") === "shared" && estimate.test_batch_size) return "Test nets shared, as asked.";
    return "";
  }

  function showTestNet(estimate, target) {
    if (testNetNote) testNetNote.textContent = testNetWords(estimate, target);
  }

  /** The tester's device matters only where the test nets may be apart: disabled (so posted as "auto", which is
   * what the job takes) while they are shared. */
  function showTesterField() {
    const tester = field("tester_device");
    if (!tester) return;
    const shared = value("test_net") === "shared";
    if (shared) tester.value = "auto";
    tester.disabled = shared;
  }

  // --- the job's length by epochs ------------------------------------------------------------------------------

  /** How long the job trains at the batch planned on the target device, as the job computes it (core/epochs.py:
   * ceil(training items / batch x iter_size) iterations an epoch; validation once an epoch, one pass over the
   * validation set, unless given); new_model.html's length_note words it the same without JavaScript. */
  function showLength(estimate) {
    const note = document.getElementById("length-note");
    if (!note) return;
    const plan = estimate ? estimate.plan : null;
    const dataset = trainDataset();
    const positive = (name) => (/^\d+$/.test(value(name).trim()) && Number(value(name)) > 0 ? Number(value(name)) : null);
    if (value("solver") !== "settings" || !estimate) { note.textContent = ""; return; }
    const effective = plan ? plan.effective_batch : estimate.batch_size;
    const perEpoch = dataset && dataset.entries && effective ? Math.ceil(dataset.entries / effective) : null;
    const epochs = positive("epochs");
    const maxIter = positive("max_iter") || (epochs && perEpoch ? epochs * perEpoch : null);
    if (!maxIter) {
      note.textContent = perEpoch ? "" : "The iterations follow from the epochs once the training set is chosen.";
      return;
    }
    let text = "Trains " + maxIter + " iterations";
    if (perEpoch) {
      text += " (" + (positive("max_iter") ? perEpoch + " per epoch" : epochs + " epochs of " + perEpoch) +
        " at batch " + effective + ")";
    }
    const validation = datasetNamed(value("val_source"));
    if (value("val_source").trim()) {
      const interval = positive("test_interval") || (perEpoch ? Math.min(perEpoch, maxIter) : null);
      const testBatch = (estimate.test_plan && estimate.test_plan.batch_size) || estimate.test_batch_size;
      const passes = positive("test_iter") || (validation && validation.entries && testBatch
        ? Math.ceil(validation.entries / testBatch) : null);
      if (interval && passes) {
        text += "; validates every " + interval + " iterations, " + passes + (passes === 1 ? " batch of " : " batches of ") +
          testBatch;
      }
    }
    note.textContent = text + ".";
  }

  /** Fields the length depends on but the estimate does not: the note follows them at once. */
  const LENGTH_FIELDS = new Set(["epochs", "max_iter", "test_interval", "test_iter", "val_source", "solver"]);

  const schedule = MP.debounce(() => runEstimate(), DEBOUNCE_MS);
  const scheduleForced = MP.debounce(() => runEstimate(true), DEBOUNCE_MS);

  // --- Auto: the largest batch that fits on the chosen device --------------------------------------------------

  /** Why Auto chose its batch (model_plan.auto_note words it the same without JavaScript). */
  function autoNote(target, estimate) {
    const batch = estimate.batch_size;
    const cap = estimate.auto_cap;
    if (cap && estimate.max_batch_limited_by === "max_batch" && batch >= cap.batch_size) {
      return "Batch " + batch + ": " + cap.note + "; " + MP.deviceLabel(target) + " has memory for more.";
    }
    if (estimate.max_batch_limited_by === "blob_limit") {
      return "Batch " + batch + ": the largest Caffe can build in one pass (one more item would make a blob over " +
        "its limit of 2147483647 elements), though " + MP.deviceLabel(target) + " has memory for more.";
    }
    return "Batch " + batch + ": the largest that fits on " + MP.deviceLabel(target) + " (" +
      MP.formatBytes(estimate.usable_bytes) + " usable of " + MP.formatBytes(estimate.free_bytes) + " free).";
  }

  autoButton.addEventListener("click", async (event) => {
    event.preventDefault();
    schedule.cancel();
    scheduleForced.cancel();
    if (running) await running;
    await runEstimate(false, true);
    const target = targetDevice();
    const estimate = target && results.get(target.key);
    if (!estimate) {
      batchNote.textContent = "No suggestion: the network has no estimate yet (see the errors above).";
      return;
    }
    if (!estimate.max_batch_size) {
      batchNote.textContent = "Does not fit on " + MP.deviceLabel(target) + " even at batch 1: choose another device.";
      return;
    }
    field("batch_size").value = String(estimate.batch_size);
    clearError("batch_size");
    delete batchNote.dataset.from;
    batchNote.textContent = autoNote(target, estimate);
    await runEstimate();
  });

  // --- wiring -----------------------------------------------------------------------------------------------------

  form.addEventListener("input", (event) => {
    if (event.target.name) clearError(event.target.name);
    if (event.target.name === "batch_size") {
      batchNote.textContent = "";
      delete batchNote.dataset.from;
    }
    if (event.target.name === "train_source" || event.target.name === "val_source") useDataset(event.target);
    if (event.target.name === "train_source") showTargetEstimate(); // the chart spans the dataset's size
    if (LENGTH_FIELDS.has(event.target.name)) {
      const target = targetDevice();
      showLength(target ? results.get(target.key) : null);
    }
    schedule();
  });
  form.addEventListener("change", (event) => {
    if (event.target.name === "device") {
      panel.drawTarget();
      showTargetEstimate(); // the chart and the tables follow the device the job would be planned on
    }
    if (event.target.name === "network" || event.target.name === "solver" || event.target.name === "standard_network") {
      showSections();
      showDefaults();
    }
    if (event.target.name === "test_net") showTesterField();
    if (event.target.name === "tester_device") showTargetEstimate();
    schedule();
  });

  /** A devices document: redraw the rows; re-estimate when a device's free memory moved enough to matter, or the
   * set of devices changed (the request's key then differs: the same definition on the same devices is not sent
   * again, so an error stays shown). */
  function onDevices(document_) {
    panel.updateDevices(document_);
    const moved = document_.devices.some((device) => {
      const estimate = results.get(device.key);
      return estimate && plannableDevice(device) &&
        Math.abs(device.memory_free - estimate.free_bytes) > REESTIMATE_FRACTION * (device.memory_total || 0);
    });
    if (moved) scheduleForced();
    else schedule();
  }
  const plannableDevice = (device) => MP.plannable(device);

  // --- after a failed Create: the first error in sight, its field focused ----------------------------------------

  /** The form came back with errors (a plain POST): bring the first into sight with the focus on its field (the
   * server marks it `autofocus` too, for browsers without JavaScript), rather than leave the page at its top. */
  function focusFirstError() {
    const box = [...form.querySelectorAll(".invalid-feedback.d-block")].find((node) => node.textContent.trim());
    if (!box) return;
    const control = field(box.dataset.errorFor);
    const input = control && control.length !== undefined && !control.tagName
      ? [...control].find((node) => node.checked) || control[0] : control;
    const where = input && input.offsetParent !== null ? input : box;
    where.scrollIntoView({ block: "center" });
    if (where === input) input.focus({ preventScroll: true });
  }

  /** A term's link opens the terms section first (a closed <details> hides its entry), and so does an address
   * naming an entry (another page may link to models/new#term-memory-source). */
  const termsSection = document.getElementById("terms");
  document.addEventListener("click", (event) => {
    const link = event.target.closest && event.target.closest("a.mp-term");
    if (link && termsSection) termsSection.open = true;
  });
  function openNamedTerm() {
    const named = location.hash.length > 1 && document.getElementById(decodeURIComponent(location.hash.slice(1)));
    if (!named || !termsSection || !termsSection.contains(named)) return;
    termsSection.open = true;
    named.scrollIntoView({ block: "center" });
  }
  window.addEventListener("hashchange", openNamedTerm);
  openNamedTerm();

  showSections();
  showDefaults();
  showTesterField();
  focusFirstError();
  panel.showTarget(
    document.getElementById("batch-verdict"),
    () => { const target = targetDevice(); return target ? target.key : null; },
    () => statusLine.textContent,
  );
  MP.requestJSON(MP.config.devicesUrl).then((answer) => {
    if (answer.ok) panel.updateDevices(answer.data);
    schedule.cancel();
    runEstimate();
  });
  MP.subscribe("subscribe_devices", "devices", onDevices, { unsubscribeEvent: "unsubscribe_devices" });

  MP.newModel = { panel, results, runEstimate, schedule };
})();
