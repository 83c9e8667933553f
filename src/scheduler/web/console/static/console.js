// The console's only script: the overview follows the server's event stream.
// Values are written with textContent, never as HTML, so nothing from the database can run.
"use strict";
(function () {
  const root = document.getElementById("overview");
  if (!root || !window.EventSource) { return; }
  const base = root.dataset.stream.replace(/\/console\/stream$/, "");

  function duration(seconds) {
    if (seconds === null || seconds === undefined) { return "-"; }
    const s = Math.round(seconds);
    if (s < 60) { return s + " s"; }
    if (s < 3600) { return Math.floor(s / 60) + " min " + (s % 60) + " s"; }
    if (s < 86400) { return Math.floor(s / 3600) + " h " + Math.floor((s % 3600) / 60) + " min"; }
    return Math.floor(s / 86400) + " d " + Math.floor((s % 86400) / 3600) + " h";
  }
  function pick(data, path) {
    return path.split(".").reduce(function (v, k) { return v === null || v === undefined ? v : v[k]; }, data);
  }
  function cell(row, text) {
    const td = document.createElement("td");
    td.textContent = text === null || text === undefined ? "" : String(text);
    row.appendChild(td);
    return td;
  }
  function fill(tableId, items, columns, empty) {
    const body = document.querySelector("#" + tableId + " tbody");
    const rows = [];
    items.forEach(function (item) {
      const tr = document.createElement("tr");
      columns(tr, item);
      rows.push(tr);
    });
    if (rows.length === 0) {
      const tr = document.createElement("tr");
      cell(tr, empty).colSpan = document.querySelectorAll("#" + tableId + " thead th").length || 1;
      rows.push(tr);
    }
    body.replaceChildren.apply(body, rows);
  }

  const source = new EventSource(root.dataset.stream);
  source.addEventListener("overview", function (event) {
    const data = JSON.parse(event.data);
    root.querySelectorAll("[data-field]").forEach(function (el) {
      const value = pick(data, el.dataset.field);
      el.textContent = el.dataset.format === "duration" ? duration(value) : (value === null ? "-" : String(value));
    });
    fill("replicas", data.replicas, function (tr, r) {
      tr.className = "state-" + r.state;
      [r.state, r.name, r.host, r.pid, r.mode, r.last_poll_at, r.seen_at, r.polls, r.dispatched, r.failed,
       r.expired, r.consecutive_failures].forEach(function (v) { cell(tr, v); });
      cell(tr, r.last_error || "").className = "error-text";
    }, "no replica has recorded a heartbeat");
    fill("failures", data.failures, function (tr, f) {
      const td = document.createElement("td");
      const a = document.createElement("a");
      a.href = base + "/console/events?status=failed&error_contains=" + encodeURIComponent(f.kind);
      a.textContent = f.kind;
      td.appendChild(a);
      tr.appendChild(td);
      cell(tr, f.count);
      cell(tr, f.latest);
    }, "no failures");
    root.dataset.updated = data.generated_at;
  });
})();
