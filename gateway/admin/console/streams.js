// The Streams pages.  #/streams: every stream the user may read, with its records, bytes, append rate and
// its readers' worst lag (GET /api/v1/streams).  #/streams/NAME: one stream's retention, its partitions,
// its readers with their position and lag in each partition and the lease each holds, and a chart of each
// reader's lag over the last five minutes (GET /api/v1/streams/NAME?history=1).  Rates and the chart are
// the broker's own samples (core/stream_history.py, every traffic_history_interval seconds), so a page
// opened now shows the minutes before it.  A reader with less than a quarter of its lease left is marked
// "expiring" (row class lease-expiring, and the word itself, not only a colour).

import { enc, get } from "./api.js";
import { DASH, Table, age, bytes, h, int, lineChart, rate, showError } from "./ui.js";

const LINES = 8; // readers drawn in the chart, the most behind first (the tables list every one)

const n = (id, label, title, value) => ({ id, label, num: true, title, value: (row) => int(value(row)) });

// Seconds as people read a lease: "45 s", "2.5 min", "10 min", then ui.js's age ("1.5 h").
function duration(seconds) {
  if (seconds < 90) return `${Number(seconds.toFixed(1))} s`;
  if (seconds < 5400) return `${Number((seconds / 60).toFixed(1))} min`;
  return age(seconds * 1000);
}

function streamLink(name) {
  return h("a", { href: `#/streams/${enc(name)}`, title: name }, name);
}

function leaseTitle(stream) {
  return `Flagged with less than ${duration(stream.lease_expiring_below_seconds)} left (a quarter of the `
    + `${duration(stream.reader_lease_seconds)} lease): the reader has not refreshed its offsets for that long. `
    + "When the lease runs out, age retention no longer keeps the records it still needs.";
}

// The marker: a word, with the class that colours it.
function leaseState(r, stream) {
  return r.lease_expiring
    ? h("span", { class: "badge lease-expiring", title: leaseTitle(stream) }, "⚠ expiring")
    : h("span", { class: "badge lease-ok", title: "The reader refreshed its lease recently" }, "ok");
}

export function streamsView(ctx) {
  const count = h("span", { class: "count" });
  const table = new Table([
    { id: "name", label: "Name", cls: "name", keep: true, value: (s) => streamLink(s.name) },
    n("partitions", "Partitions", null, (s) => s.partitions),
    n("records", "Records", "Records kept (latest minus earliest, over the partitions)", (s) => s.records),
    { id: "bytes", label: "Bytes", num: true, title: "Stored chunk bytes", value: (s) => bytes(s.bytes) },
    { id: "rate", label: "Appended/s", num: true, title: "Records appended per second, between the broker's last two samples", value: (s) => rate(s.records_per_second) },
    n("readers", "Readers", "Registered readers (Spark queries)", (s) => s.readers),
    n("max_lag", "Max lag", "Records the reader furthest behind has yet to read", (s) => s.max_lag),
    { id: "expiring", label: "Leases", title: "Readers whose lease is about to run out", value: (s) => (s.readers_expiring
      ? h("span", { class: "badge lease-expiring" }, `⚠ ${int(s.readers_expiring)} expiring`) : DASH) },
  ], {
    key: (s) => s.name,
    empty: "No streams: none is configured ([streams.NAME] in the configuration file), or none this user may read.",
    rowClass: (s) => (s.readers_expiring ? "lease-expiring" : null),
  });
  const el = h("section", { class: "list streams" },
    h("div", { class: "title-row" }, h("h2", {}, "Streams"), count),
    h("p", { class: "muted intro" },
      "Append-only, partitioned logs of what was sent to their destinations, read by offset (Spark, x-stream-offset). ",
      "Lag: records a registered reader has yet to read."),
    table.el);

  async function load(alive) {
    let answer;
    try {
      answer = await get("streams");
    } catch (e) {
      if (alive()) showError(e, "list-streams");
      throw e;
    }
    if (!alive()) return;
    ctx.clearError("list-streams");
    table.update(answer.streams);
    const total = answer.streams.length;
    count.replaceChildren(total ? `${int(total)} ${total === 1 ? "stream" : "streams"}` : "");
    el.dataset.loaded = String(Number(el.dataset.loaded || 0) + 1);
  }

  return { el, poll: load };
}

function stat(field, label, title) {
  return h("div", { class: "stat", title }, h("span", { class: "value", dataset: { field } }, DASH), h("span", { class: "label" }, label));
}

export function streamView(ctx, name) {
  let current = null; // the last answer: the lease cells' titles need its figures
  const stats = h("div", { class: "stats" },
    stat("records", "records", "Records kept, over the partitions"), stat("bytes", "bytes", "Stored chunk bytes"),
    stat("rate", "appended/s", "Records appended per second, between the broker's last two samples"),
    stat("max-age", "max age", "Retention: records older than this are removed (unless a reader's lease holds them)"),
    stat("max-bytes", "max bytes", "Retention: the stream's bytes on disk, shared evenly by its partitions"),
    stat("lease", "reader lease", "How long a reader's registered offsets hold back age retention after its last refresh"),
    stat("readers", "readers", "Registered readers whose lease has not run out"));
  const destinations = h("span", { class: "mono", dataset: { field: "destinations" } });

  const partitions = new Table([
    { id: "partition", label: "Partition", num: true, value: (p) => String(p.partition) },
    n("earliest", "Earliest", "The first offset still kept", (p) => p.earliest),
    n("latest", "Latest", "The offset the next record gets", (p) => p.latest),
    n("records", "Records", "Kept: latest minus earliest", (p) => p.records),
    { id: "bytes", label: "Bytes", num: true, value: (p) => bytes(p.bytes) },
    { id: "rate", label: "Appended/s", num: true, title: "Between the broker's last two samples", value: (p) => rate(p.records_per_second) },
  ], { key: (p) => String(p.partition), empty: "No partitions." });

  const readers = new Table([
    { id: "name", label: "Reader", cls: "name mono", value: (r) => h("span", { title: r.name }, r.name) },
    n("partitions", "Partitions", "Partitions the reader registered an offset for", (r) => Object.keys(r.offsets).length),
    n("total_lag", "Lag", "Records it has yet to read, over its partitions", (r) => r.total_lag),
    { id: "lease", label: "Lease left", num: true, title: "Until the lease runs out, unless the reader refreshes it", value: (r) => duration(r.expires_in_seconds) },
    { id: "state", label: "Lease", value: (r) => leaseState(r, current) },
  ], {
    key: (r) => r.name,
    empty: "No registered readers. A Spark query registers one while it runs (PUT …/readers/NAME).",
    rowClass: (r) => (r.lease_expiring ? "lease-expiring" : null),
  });

  // One row per reader and partition it named: its position there and how far behind the end it is.
  const positions = new Table([
    { id: "reader", label: "Reader", cls: "name mono", value: (x) => x.reader.name },
    { id: "partition", label: "Partition", num: true, value: (x) => String(x.partition) },
    n("position", "Position", "The next offset the reader needs", (x) => x.position),
    n("latest", "Latest", "The partition's end", (x) => x.latest),
    n("lag", "Lag", "Records it has yet to read here", (x) => x.lag),
  ], {
    key: (x) => `${x.reader.name}/${x.partition}`, // reader names have no "/"
    empty: "No registered readers.",
    rowClass: (x) => (x.reader.lease_expiring ? "lease-expiring" : null),
  });

  // Named, for people's scripts and the tests (three tables on one page).
  partitions.el.dataset.table = "partitions";
  readers.el.dataset.table = "readers";
  positions.el.dataset.table = "positions";

  const chart = lineChart({ label: "Each reader's lag in records, the last five minutes", yTitle: "records behind", format: int });
  const legend = h("span", { class: "series-legend" });

  const el = h("section", { class: "stream" },
    h("div", { class: "title-row" },
      h("a", { href: "#/streams", class: "back" }, "← Streams"),
      h("h2", {}, "Stream ", h("span", { class: "qname", dataset: { field: "name" } }, name))),
    stats,
    h("p", { class: "muted intro" }, "Destinations: ", destinations, h("span", { dataset: { field: "lease-rule" } })),
    h("div", { class: "panel" }, h("h3", {}, "Partitions"), partitions.el),
    h("div", { class: "panels" },
      h("div", { class: "panel" }, h("h3", {}, "Readers"), readers.el, h("h4", { class: "positions-title" }, "Position and lag per partition"), positions.el),
      h("div", { class: "panel" }, h("h3", {}, "Lag over time ", legend), chart.el)));

  const set = (field, text) => {
    const node = el.querySelector(`[data-field="${field}"]`);
    if (node.textContent !== text) node.textContent = text;
  };

  async function load(alive) {
    let s;
    try {
      s = await get(`streams/${enc(name)}?history=1`);
    } catch (e) {
      if (alive()) showError(e, "stream");
      throw e;
    }
    if (!alive()) return;
    ctx.clearError("stream");
    current = s;
    const list = [...s.readers].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    set("records", int(s.partitions.reduce((t, p) => t + p.records, 0)));
    set("bytes", bytes(s.partitions.reduce((t, p) => t + p.bytes, 0)));
    set("rate", rate(s.records_per_second));
    set("max-age", s.max_age_seconds > 0 ? age(s.max_age_seconds * 1000) : "no limit");
    set("max-bytes", s.max_bytes > 0 ? bytes(s.max_bytes) : "no limit");
    set("lease", duration(s.reader_lease_seconds));
    set("readers", int(list.length));
    set("destinations", s.destinations.join(", ") || DASH);
    set("lease-rule", ` · a reader is marked expiring with less than ${duration(s.lease_expiring_below_seconds)} of its lease left`);
    partitions.update(s.partitions);
    readers.update(list);
    const latest = new Map(s.partitions.map((p) => [String(p.partition), p.latest]));
    positions.update(list.flatMap((r) => Object.entries(r.offsets).map(([p, position]) => ({
      reader: r, partition: Number(p), position, latest: latest.get(p) ?? null, lag: r.lag[p] ?? null,
    }))));
    // The chart: the readers furthest behind, each its own colour (class series-N) and named in the legend.
    const drawn = [...list].sort((a, b) => b.total_lag - a.total_lag).slice(0, LINES);
    chart.draw(drawn.map((r, i) => ({ cls: `series-${i}`, label: r.name, points: (r.lag_history || []).map((x) => [x.time_ms, x.lag]) })), s.now_ms);
    legend.replaceChildren(...drawn.map((r, i) => h("span", { class: `legend-item series-${i}`, title: r.name }, r.name)),
      ...(list.length > LINES ? [h("span", { class: "muted" }, `and ${int(list.length - LINES)} more`)] : []));
    el.dataset.loaded = String(Number(el.dataset.loaded || 0) + 1);
  }

  return { el, poll: load };
}
