/* digits-memplugin: what every live page shares (window.MemPlugin).
 *
 * - config: where to connect, from the <body data-mp-*> attributes the base template writes;
 * - socket(): one socket.io connection to the plugin's namespace, shared by the page, its state shown in the header;
 * - subscribe(): ask the server for a stream of events (devices, the jobs list, one job) and ask again after
 *   every reconnection, because the server forgets subscriptions when a connection drops; on() listens to an event
 *   of a subscription made elsewhere; onReconnect() runs a catch-up (re-fetching what events were missed while
 *   the connection was down) after every reconnection;
 * - requestJSON(): fetch with JSON in and out, cancellable, sending the page's CSRF token when it has one;
 * - debounce(), formatBytes(), formatTime(), readJSON(), el(): small helpers. el() builds elements with textContent only, so text that came
 *   from a user (layer names, job names) is never parsed as HTML.
 */
(function () {
  "use strict";

  const data = document.body.dataset;
  const config = {
    namespace: data.mpNamespace || "/memplugin",
    socketioPath: data.mpSocketioPath || "/socket.io",
    devicesUrl: data.mpDevicesUrl,
    estimateUrl: data.mpEstimateUrl,
    jobsUrl: data.mpJobsUrl,
  };

  const UNITS = [["TiB", 2 ** 40], ["GiB", 2 ** 30], ["MiB", 2 ** 20], ["KiB", 2 ** 10]];

  /** Bytes for people, as the server writes them (sizes.format_size): "23.6 GiB"; null is "n/a". */
  function formatBytes(bytes) {
    if (bytes === null || bytes === undefined) return "n/a";
    for (const [unit, factor] of UNITS) {
      if (bytes >= factor) return (bytes / factor).toFixed(1) + " " + unit;
    }
    return bytes + " B";
  }

  const pad = (n) => String(n).padStart(2, "0");

  /** Seconds since the epoch as the server writes them (job_pages.format_time), in local time; null is "". */
  function formatTime(seconds) {
    if (seconds === null || seconds === undefined) return "";
    const d = new Date(seconds * 1000);
    return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " + pad(d.getHours()) + ":" +
      pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  }

  /** The JSON a page embeds in <script type="application/json" id="...">, or null. */
  function readJSON(id) {
    const node = document.getElementById(id);
    return node ? JSON.parse(node.textContent) : null;
  }

  /** `fn` called once, `wait` ms after the last of a burst of calls; .now() runs it at once, .cancel() drops it. */
  function debounce(fn, wait) {
    let timer = null;
    let lastArgs = [];
    function debounced(...args) {
      lastArgs = args;
      clearTimeout(timer);
      timer = setTimeout(() => { timer = null; fn(...lastArgs); }, wait);
    }
    debounced.cancel = () => { clearTimeout(timer); timer = null; };
    debounced.now = (...args) => { debounced.cancel(); return fn(...(args.length ? args : lastArgs)); };
    debounced.pending = () => timer !== null;
    return debounced;
  }

  function csrfToken() {
    const meta = document.querySelector('meta[name="csrf-token"]');
    return meta ? meta.content : null;
  }

  /** JSON request; resolves to {ok, status, data} (data: the parsed body, or null). Rejects only when aborted or
   *  when the server cannot be reached. */
  async function requestJSON(url, { method = "GET", body, signal } = {}) {
    const headers = { Accept: "application/json" };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const token = csrfToken();
    if (token && method !== "GET") headers["X-CSRFToken"] = token;
    const response = await fetch(url, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      credentials: "same-origin",
    });
    let parsed = null;
    try {
      parsed = await response.json();
    } catch (error) {
      parsed = null;
    }
    return { ok: response.ok, status: response.status, data: parsed };
  }

  /** An element: el("td", {className: "x", dataset: {key: "1"}}, "text", child). Strings become text nodes. */
  function el(tag, props = {}, ...children) {
    const node = document.createElement(tag);
    for (const [name, value] of Object.entries(props)) {
      if (name === "dataset") Object.assign(node.dataset, value);
      else if (name.startsWith("aria-") || name === "role") node.setAttribute(name, value);
      else node[name] = value;
    }
    for (const child of children) {
      if (child === null || child === undefined || child === false) continue;
      node.append(typeof child === "string" || typeof child === "number" ? String(child) : child);
    }
    return node;
  }

  let sharedSocket = null;
  let connections = 0;
  const subscriptions = [];
  const reconnectHandlers = [];

  function showConnection(state, text) {
    document.body.dataset.mpSocket = state;
    const badge = document.getElementById("mp-connection");
    if (!badge) return;
    badge.hidden = false;
    badge.dataset.state = state;
    badge.textContent = text;
  }

  /** The page's socket.io connection to the plugin's namespace (opened on first use). */
  function socket() {
    if (sharedSocket) return sharedSocket;
    if (typeof window.io !== "function") throw new Error("the socket.io client is not loaded");
    sharedSocket = window.io(config.namespace, { path: config.socketioPath, transports: ["websocket", "polling"] });
    showConnection("connecting", "connecting…");
    sharedSocket.on("connect", () => {
      showConnection("connected", "live");
      for (const { subscribeEvent, payload } of subscriptions) sharedSocket.emit(subscribeEvent, payload);
      connections += 1;
      if (connections > 1) for (const handler of reconnectHandlers) handler();
    });
    sharedSocket.on("disconnect", () => showConnection("disconnected", "reconnecting…"));
    sharedSocket.on("connect_error", () => {
      showConnection("disconnected", "offline: retrying…");
      // Refused by the server itself (it has as many connections as it takes): socket.io does not retry that.
      if (!sharedSocket.active) setTimeout(() => sharedSocket.connect(), 5000 + 5000 * Math.random());
    });
    // Events the server did not handle because it was busy (rate_limited): ask for the subscriptions again once
    // it says we may, a little later for some pages than others.
    sharedSocket.on("rate_limited", (refused) => {
      const delay = 1000 * Math.max(1, Number(refused && refused.retry_after) || 1) * (1 + Math.random());
      setTimeout(() => {
        if (!sharedSocket.connected) return;
        for (const { subscribeEvent, payload } of subscriptions) sharedSocket.emit(subscribeEvent, payload);
      }, delay);
    });
    return sharedSocket;
  }

  /** Receive `event` after emitting `subscribeEvent` (again after every reconnection). Returns a function that
   *  unsubscribes (emitting `unsubscribeEvent` when given). */
  function subscribe(subscribeEvent, event, handler, { payload, unsubscribeEvent } = {}) {
    const io = socket();
    const entry = { subscribeEvent, payload };
    subscriptions.push(entry);
    io.on(event, handler);
    if (io.connected) io.emit(subscribeEvent, payload);
    return () => {
      subscriptions.splice(subscriptions.indexOf(entry), 1);
      io.off(event, handler);
      if (unsubscribeEvent && io.connected) io.emit(unsubscribeEvent, payload);
    };
  }

  /** Listen to `event` on the page's connection (the subscription that brings it is made with subscribe()). */
  function on(event, handler) {
    socket().on(event, handler);
  }

  /** Run `handler` after every reconnection (not the first connection): events sent while the connection was
   *  down are lost, so a page re-fetches what it shows. Subscriptions are renewed before it runs. */
  function onReconnect(handler) {
    reconnectHandlers.push(handler);
  }

  window.MemPlugin = {
    config, formatBytes, formatTime, readJSON, debounce, requestJSON, el, socket, subscribe, on, onReconnect,
  };
})();
