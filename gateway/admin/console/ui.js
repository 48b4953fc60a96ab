// Small pieces every page uses: an element builder, number formats, the message area, a confirm
// dialog, a table that updates in place, a pager, rates from successive polls, the 2 s poller, and a
// line chart of the last five minutes.

export function h(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") node.className = v;
    else if (k === "dataset") Object.assign(node.dataset, v);
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k in node && typeof v !== "string") node[k] = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  append(node, children);
  return node;
}

function append(node, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(node, c);
    else node.append(c instanceof Node ? c : String(c));
  }
}

// -- formats ----------------------------------------------------------------------------

const intFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
const rateFormat = new Intl.NumberFormat(undefined, { maximumFractionDigits: 1, minimumFractionDigits: 1 });

export const DASH = "–";

export function int(n) {
  return n === null || n === undefined ? DASH : intFormat.format(n);
}

export function rate(r) {
  if (r === null || r === undefined || Number.isNaN(r)) return DASH;
  return r >= 100 ? intFormat.format(r) : rateFormat.format(r);
}

export function bytes(n) {
  if (n === null || n === undefined) return DASH;
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${v} B` : `${v.toFixed(v >= 100 ? 0 : 1)} ${units[i]}`;
}

export function age(ms) {
  if (ms === null || ms === undefined) return DASH;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

export function time(ms) {
  if (!ms) return DASH;
  const d = new Date(ms);
  const pad = (n, w = 2) => String(n).padStart(w, "0");
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

export function percent(part, whole) {
  if (!whole) return null;
  return Math.min(100, (100 * part) / whole);
}

// -- the message area -----------------------------------------------------------------------

const MAX_NOTES = 6;

// Shows a message until dismissed; a key replaces the earlier message with the same key (a poll that
// keeps failing shows one error, not one per poll).  Errors are never hidden by a timer.
export function notify(kind, text, key) {
  const area = document.getElementById("messages");
  if (key) clearNote(key);
  const note = h("div", { class: `note ${kind}`, role: kind === "error" ? "alert" : "status", dataset: { key: key || "" } },
    h("span", { class: "note-text" }, kind === "error" ? h("b", { class: "label" }, "Error: ") : null, text),
    h("button", { type: "button", class: "close", title: "Dismiss", "aria-label": "Dismiss", onclick: () => note.remove() }, "×"));
  area.append(note);
  while (area.children.length > MAX_NOTES) area.firstElementChild.remove();
  if (kind !== "error") setTimeout(() => note.remove(), 8000);
  return note;
}

export function clearNote(key) {
  for (const n of document.querySelectorAll("#messages .note")) if (n.dataset.key === key) n.remove();
}

export function showError(e, key) {
  console.error(e);
  return notify("error", e && e.message ? e.message : String(e), key);
}

// -- a modal dialog: confirm, optionally with one text input -------------------------------------

// Resolves with the input's text (or true without an input) when confirmed, null when cancelled.
export function ask({ title, text, confirm = "OK", danger = false, input = null }) {
  return new Promise((resolve) => {
    const field = input ? h("input", { type: "text", name: "answer", value: input.value || "", placeholder: input.placeholder || "", maxlength: "1000" }) : null;
    const dialog = h("dialog", { class: "ask" },
      h("form", { method: "dialog" },
        h("h3", {}, title),
        text ? h("p", {}, text) : null,
        field ? h("label", {}, input.label || "", field) : null,
        h("div", { class: "buttons" },
          h("button", { type: "button", value: "cancel", class: "quiet", onclick: () => dialog.close("cancel") }, "Cancel"),
          h("button", { type: "submit", value: "ok", class: danger ? "danger" : "primary" }, confirm))));
    dialog.addEventListener("close", () => {
      const ok = dialog.returnValue === "ok";
      dialog.remove();
      resolve(ok ? (field ? field.value : true) : null);
    });
    document.body.append(dialog);
    dialog.showModal();
    (field || dialog.querySelector("button[value=ok]")).focus();
  });
}

// -- tables -------------------------------------------------------------------------------

// columns: [{id, label, num, sort (the API's sort field), title, value(row) -> string | Node, cls}]
// Rows are updated in place while the same keys come back in the same order (a poll of the same page),
// so a refresh of 100 rows touches only the cells whose text changed and keeps buttons and focus.
export class Table {
  constructor(columns, { key, sort = null, onSort = null, empty = "Nothing here.", rowClass = null } = {}) {
    this.columns = columns;
    this.key = key;
    this.onSort = onSort;
    this.emptyText = empty;
    this.rowClass = rowClass;
    this.keys = [];
    this.tbody = h("tbody");
    this.head = h("tr");
    this.el = h("div", { class: "table-wrap" }, h("table", { class: "grid" }, h("thead", {}, this.head), this.tbody));
    this.setSort(sort);
  }

  setSort(sort) {
    this.sort = sort;
    this.head.replaceChildren(...this.columns.map((c) => {
      const classes = [c.num ? "num" : ""]; // a column's own class styles its cells, not its heading
      if (!c.sort || !this.onSort) return h("th", { class: classes.join(" "), title: c.title }, c.label);
      const active = sort === c.sort || sort === `-${c.sort}`;
      const descending = sort === `-${c.sort}`;
      classes.push("sortable");
      if (active) classes.push(descending ? "desc" : "asc");
      const next = active && !descending ? `-${c.sort}` : active ? c.sort : (c.num ? `-${c.sort}` : c.sort);
      return h("th", { class: classes.join(" "), title: c.title, "aria-sort": active ? (descending ? "descending" : "ascending") : null },
        h("button", { type: "button", class: "sort", onclick: () => this.onSort(next) }, c.label));
    }));
  }

  update(rows) {
    const keys = rows.map(this.key);
    if (!rows.length) {
      this.keys = [];
      this.tbody.replaceChildren(h("tr", { class: "empty" }, h("td", { colspan: String(this.columns.length) }, this.emptyText)));
      return;
    }
    const same = keys.length === this.keys.length && keys.every((k, i) => k === this.keys[i]);
    if (!same) {
      this.keys = keys;
      this.tbody.replaceChildren(...rows.map((row) => this.row(row)));
      return;
    }
    rows.forEach((row, i) => {
      const tr = this.tbody.children[i];
      if (this.rowClass) tr.className = this.rowClass(row) || "";
      this.columns.forEach((c, j) => this.fill(tr.children[j], c, row));
    });
  }

  row(row) {
    const tr = h("tr", { class: this.rowClass ? this.rowClass(row) : null, dataset: { key: this.key(row) } });
    for (const c of this.columns) {
      const td = h("td", { class: [c.num ? "num" : "", c.cls || ""].join(" ").trim() || null, dataset: { col: c.id } });
      this.fill(td, c, row);
      tr.append(td);
    }
    return tr;
  }

  fill(td, column, row) {
    if (column.keep && td.firstChild) return; // controls built once per row (buttons, checkboxes)
    const value = column.value(row);
    if (value instanceof Node) {
      td.replaceChildren(value);
    } else {
      const text = value === null || value === undefined ? DASH : String(value);
      if (td.textContent !== text || td.firstElementChild) td.textContent = text;
      if (column.titleFrom) td.title = text;
    }
  }
}

// -- a pager: "1–100 of 10,000"  « ‹ page › » -----------------------------------------------------

export function pager({ page, pages, total, pageSize, count, onPage, onSize, sizes = [25, 50, 100, 250, 500] }) {
  const first = total ? (page - 1) * pageSize + 1 : 0;
  const last = total ? (page - 1) * pageSize + count : 0;
  const button = (label, to, title) => h("button", { type: "button", class: "quiet", title, disabled: to < 1 || to > pages || to === page, onclick: () => onPage(to) }, label);
  return h("div", { class: "pager" },
    h("span", { class: "range" }, total ? `${int(first)}–${int(last)} of ${int(total)}` : "none"),
    button("«", 1, "First page"), button("‹", page - 1, "Previous page"),
    h("span", { class: "page" }, `page ${int(page)} of ${int(Math.max(pages, 1))}`),
    button("›", page + 1, "Next page"), button("»", pages, "Last page"),
    onSize ? h("label", { class: "size" }, "per page ",
      h("select", { onchange: (e) => onSize(Number(e.target.value)) },
        sizes.map((s) => h("option", { value: String(s), selected: s === pageSize }, String(s))))) : null);
}

// -- rates from successive polls -----------------------------------------------------------------

// Per-second rates of counters, from the previous answer that had the same key.  Only what was polled
// is remembered (one page), so memory stays bounded with 10,000 queues.
export class Rates {
  constructor() {
    this.last = new Map();
  }

  // rows: items with counters; fields: the counter names; returns key -> {field: rate}.
  update(rows, key, fields, at = performance.now()) {
    const out = new Map();
    const next = new Map();
    for (const row of rows) {
      const k = key(row);
      const before = this.last.get(k);
      const now = { at, values: fields.map((f) => row[f]) };
      next.set(k, now);
      if (before && at > before.at) {
        const seconds = (at - before.at) / 1000;
        const r = {};
        fields.forEach((f, i) => {
          const d = now.values[i] - before.values[i];
          r[f] = d >= 0 ? d / seconds : null; // a counter that went back: the broker restarted
        });
        out.set(k, r);
      }
    }
    this.last = next;
    return out;
  }
}

// -- the poller: one page's refresh every 2 s, never two at once ------------------------------------

export const POLL_MS = 2000;

export class Poller {
  constructor(onStatus) {
    this.task = null;
    this.timer = null;
    this.generation = 0;
    this.paused = false;
    this.onStatus = onStatus;
  }

  // Runs task() now and then every POLL_MS after the previous run ended; a new start() ends the old one.
  start(task) {
    this.stop();
    this.task = task;
    const generation = ++this.generation;
    const run = async () => {
      if (generation !== this.generation) return;
      this.timer = null;
      const started = performance.now();
      let ok = true;
      try {
        await task(() => generation === this.generation);
      } catch (e) {
        ok = false;
      }
      if (generation !== this.generation) return;
      this.onStatus(ok, performance.now() - started);
      if (!this.paused && !document.hidden) this.timer = setTimeout(run, POLL_MS);
    };
    run();
  }

  stop() {
    this.generation++;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
  }

  // Once more now (after an action), keeping the schedule.
  now() {
    if (!this.task) return;
    const task = this.task;
    this.start(task);
  }

  setPaused(paused) {
    this.paused = paused;
    if (!paused && !this.timer && this.task) this.now();
  }

  wake() {
    if (!this.paused && !this.timer && this.task) this.now();
  }
}

// -- a line chart of the last five minutes ---------------------------------------------------------

// The overview's chart, for any number of series: the same markup and stylesheet (figure.chart-box, its
// axis titles and ticks around a stretched SVG whose viewBox units are seconds), drawn from points on the
// broker's clock.  draw(series, end) replaces every line: series is [{cls, label, points: [[ms, value]]}],
// end the broker's "now" (the right edge).  Lines get the class "line" plus their own cls (colours in CSS).
export const CHART_WINDOW_MS = 5 * 60 * 1000;
const CHART_MINUTES = [5, 4, 3, 2, 1, 0];

// 1, 2, 5, 10, 20, 50...: the smallest at or above n, so the y-axis ticks are round numbers.
export function niceCeil(n) {
  if (n <= 1) return 1;
  const power = 10 ** Math.floor(Math.log10(n));
  for (const step of [1, 2, 5, 10]) if (step * power >= n) return step * power;
  return 10 * power;
}

export function lineChart({ label, yTitle, xTitle = "time, the last 5 minutes", empty = "Collecting: a point every few seconds", format = rate }) {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  const width = CHART_WINDOW_MS / 1000;
  svg.setAttribute("viewBox", `0 0 ${width} 100`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", label);
  svg.classList.add("chart");
  const grid = (x1, y1, x2, y2) => {
    const line = document.createElementNS(ns, "line");
    Object.entries({ x1, y1, x2, y2 }).forEach(([k, v]) => line.setAttribute(k, String(v)));
    line.classList.add("grid");
    line.setAttribute("vector-effect", "non-scaling-stroke");
    svg.append(line);
  };
  grid(0, 50, width, 50);
  for (const m of CHART_MINUTES.slice(1, -1)) grid(width - m * 60, 0, width - m * 60, 100);
  const layer = document.createElementNS(ns, "g");
  svg.append(layer);
  const yTicks = [h("span", {}, "1"), h("span", {}, "0.5"), h("span", {}, "0")];
  const note = h("div", { class: "chart-empty" }, empty);
  const el = h("figure", { class: "chart-box", dataset: { points: "0" } },
    h("div", { class: "axis-title y", dataset: { axis: "y" } }, yTitle),
    h("div", { class: "ticks y" }, ...yTicks),
    h("div", { class: "plot" }, svg, note),
    h("div", { class: "ticks x" }, ...CHART_MINUTES.map((m) => h("span", {}, m ? `−${m} min` : "now"))),
    h("div", { class: "axis-title x", dataset: { axis: "x" } }, xTitle));

  function draw(series, end) {
    const shown = series.map((s) => ({ ...s, points: s.points.filter((p) => p[0] >= end - CHART_WINDOW_MS && p[0] <= end) }));
    const top = niceCeil(Math.max(0, ...shown.flatMap((s) => s.points.map((p) => p[1]))));
    [top, top / 2, 0].forEach((v, i) => { yTicks[i].textContent = format(v).replace(/\.0$/, ""); });
    layer.replaceChildren(...shown.map((s) => {
      const line = document.createElementNS(ns, "polyline");
      line.setAttribute("class", `line ${s.cls || ""}`.trim());
      line.setAttribute("vector-effect", "non-scaling-stroke");
      line.setAttribute("points", s.points.map((p) => `${(width - (end - p[0]) / 1000).toFixed(1)},${(100 - (98 * p[1]) / top).toFixed(1)}`).join(" "));
      const title = document.createElementNS(ns, "title");
      title.textContent = s.label; // text, never markup: a name is shown as written
      line.append(title);
      return line;
    }));
    const points = shown.reduce((n, s) => n + s.points.length, 0);
    el.dataset.points = String(points);
    note.hidden = points > 0;
    return top;
  }

  return { el, draw };
}
