// The front page: the broker at a glance, from /api/v1/overview every 2 s.  Messages per second are
// the difference of the "received"/"sent" counters between two answers, over the broker's own clock;
// the chart starts with the last five minutes the broker sampled (/api/v1/overview/history).

import { get } from "./api.js";
import { DASH, Table, age, bytes, h, int, percent, rate, showError } from "./ui.js";

const WINDOW_MS = 5 * 60 * 1000; // what the chart spans: the broker keeps the same five minutes of samples
const MINUTES = [5, 4, 3, 2, 1, 0]; // x-axis ticks, minutes before the latest point

// People's names for the overview's protocol families (the API keeps the machine value).
const FAMILIES = { stomp: "STOMP", mqtt: "MQTT", http: "HTTP" };

function card(title, ...body) {
  return h("div", { class: "card" }, h("h3", {}, title), ...body);
}

function figure(field, label) {
  return h("div", { class: "figure" }, h("span", { class: "value", dataset: { field } }, DASH), h("span", { class: "label" }, label));
}

function meter(field) {
  const fill = h("div", { class: "fill" });
  return { el: h("div", { class: "meter", dataset: { field } }, fill), fill };
}

// 1, 2, 5, 10, 20, 50...: the smallest at or above n, so the y-axis ticks are round numbers.
function niceCeil(n) {
  if (n <= 1) return 1;
  const power = 10 ** Math.floor(Math.log10(n));
  for (const step of [1, 2, 5, 10]) if (step * power >= n) return step * power;
  return 10 * power;
}

// Messages per second in and out over the last five minutes, by the broker's clock: the samples the broker
// kept (/api/v1/overview/history, one per 5 s) first, then one point per refresh.  x is time (viewBox units
// are seconds), y is messages per second; the axes are labelled in HTML around the SVG, which is stretched.
function chart() {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  const width = WINDOW_MS / 1000;
  svg.setAttribute("viewBox", `0 0 ${width} 100`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.setAttribute("role", "img");
  svg.setAttribute("aria-label", "Messages per second in and out, the last five minutes");
  svg.classList.add("chart");
  const grid = (x1, y1, x2, y2) => {
    const line = document.createElementNS(ns, "line");
    Object.entries({ x1, y1, x2, y2 }).forEach(([k, v]) => line.setAttribute(k, String(v)));
    line.classList.add("grid");
    line.setAttribute("vector-effect", "non-scaling-stroke");
    svg.append(line);
  };
  grid(0, 50, width, 50);
  for (const m of MINUTES.slice(1, -1)) grid(width - m * 60, 0, width - m * 60, 100);
  const lines = ["in", "out"].map((cls) => {
    const line = document.createElementNS(ns, "polyline");
    line.classList.add(cls);
    line.setAttribute("vector-effect", "non-scaling-stroke");
    svg.append(line);
    return line;
  });
  const yTicks = [h("span", {}, "1"), h("span", {}, "0.5"), h("span", {}, "0")];
  const empty = h("div", { class: "chart-empty" }, "Collecting: a point every few seconds");
  const el = h("figure", { class: "chart-box", dataset: { points: "0" } },
    h("div", { class: "axis-title y", dataset: { axis: "y" } }, "messages / s"),
    h("div", { class: "ticks y" }, ...yTicks),
    h("div", { class: "plot" }, svg, empty),
    h("div", { class: "ticks x" }, ...MINUTES.map((m) => h("span", {}, m ? `−${m} min` : "now"))),
    h("div", { class: "axis-title x", dataset: { axis: "x" } }, "time, the last 5 minutes"));
  const points = []; // [broker ms, in/s, out/s], oldest first

  function draw() {
    const end = points.length ? points[points.length - 1][0] : 0;
    const top = niceCeil(Math.max(0, ...points.map((p) => Math.max(p[1], p[2]))));
    [top, top / 2, 0].forEach((v, i) => { yTicks[i].textContent = rate(v).replace(/\.0$/, ""); });
    lines.forEach((line, k) => {
      line.setAttribute("points", points.map((p) => `${(width - (end - p[0]) / 1000).toFixed(1)},${(100 - (98 * p[k + 1]) / top).toFixed(1)}`).join(" "));
    });
    el.dataset.points = String(points.length);
    empty.hidden = points.length > 0;
    return top;
  }

  draw();
  return {
    el,
    // A point at broker time t; one not after the last is dropped (a history sample the live refreshes passed).
    add(t, inRate, outRate) {
      if (points.length && t <= points[points.length - 1][0]) return null;
      points.push([t, inRate, outRate]);
      while (points.length && points[0][0] < t - WINDOW_MS) points.shift();
      return draw();
    },
  };
}

export function overviewView(ctx) {
  const store = meter("store-meter");
  const memory = meter("memory-meter");
  const rates = chart();
  const dlqLink = h("a", { class: "sub", hidden: true, dataset: { field: "dlq-link" } }, "dead-letter queue →");
  const protocols = h("div", { class: "protocols", dataset: { field: "connections-by-protocol" } });
  const deepest = new Table([
    { id: "name", label: "Queue", cls: "name", keep: true, value: (q) => h("a", { href: `#/queues/${encodeURIComponent(q.name)}`, title: q.name }, q.name) },
    { id: "messages", label: "Messages", num: true, value: (q) => int(q.messages) },
    { id: "unacknowledged", label: "Unacked", num: true, value: (q) => int(q.unacknowledged) },
    { id: "consumers", label: "Consumers", num: true, value: (q) => int(q.consumers) },
    { id: "oldest", label: "Oldest", num: true, value: (q) => age(q.oldest_message_age_ms) },
  ], { key: (q) => q.name, empty: "No queues." });

  const el = h("section", { class: "overview" },
    h("div", { class: "title-row" }, h("h2", {}, "Overview"), h("span", { class: "muted", dataset: { field: "broker" } })),
    h("div", { class: "cards" },
      card("Connections", figure("connections", "open"), protocols),
      card("Messages in", figure("in-rate", "per second"), h("div", { class: "sub" }, "received ", h("span", { dataset: { field: "received" } }, DASH))),
      card("Messages out", figure("out-rate", "per second"), h("div", { class: "sub" }, "sent ", h("span", { dataset: { field: "sent" } }, DASH))),
      card("Queues", figure("queues", "queues"),
        h("div", { class: "sub" }, h("span", { dataset: { field: "queue-messages" } }, DASH), " messages: ",
          h("span", { dataset: { field: "queue-ready" } }, DASH), " ready, ",
          h("span", { dataset: { field: "queue-unacked" } }, DASH), " unacked"),
        h("div", { class: "sub" }, h("span", { dataset: { field: "queue-consumers" } }, DASH), " consumers"),
        dlqLink),
      card("Store", figure("store", "used"), store.el, h("div", { class: "sub", dataset: { field: "store-detail" } }, DASH)),
      card("Memory", figure("memory", "pending messages"), memory.el, h("div", { class: "sub", dataset: { field: "memory-detail" } }, DASH)),
      card("Topics", figure("subscriptions", "subscriptions"),
        h("div", { class: "sub" }, h("span", { dataset: { field: "durables" } }, DASH), " durable, ",
          h("span", { dataset: { field: "retained" } }, DASH), " retained messages, ",
          h("span", { dataset: { field: "streams" } }, DASH), " streams"))),
    h("div", { class: "panels" },
      h("div", { class: "panel" }, h("h3", {}, "Messages per second ", h("span", { class: "legend in" }, "in"), " ", h("span", { class: "legend out" }, "out")), rates.el),
      h("div", { class: "panel" }, h("h3", {}, "Deepest queues ", h("a", { href: "#/queues?sort=-messages", class: "more" }, "all queues →")), deepest.el)));

  const set = (field, text) => {
    const node = el.querySelector(`[data-field="${field}"]`);
    if (node.textContent !== text) node.textContent = text;
  };
  let previous = null;
  let seeded = false; // the broker's history is drawn once, by the first refresh

  function gauge(m, field, used, limit) {
    const p = percent(used, limit);
    m.fill.style.width = `${p ?? 0}%`;
    m.el.classList.toggle("warn", p !== null && p >= 80);
    set(field, p === null ? bytes(used) : `${p.toFixed(p < 10 ? 1 : 0)}%`);
    set(`${field}-detail`, limit ? `${bytes(used)} of ${bytes(limit)}` : `${bytes(used)}, no limit`);
  }

  async function load(alive) {
    let o;
    let top;
    let history = null;
    try {
      // The history only once: a broker that has none (or an older one) leaves the chart to the refreshes.
      [o, top, history] = await Promise.all([get("overview"), get("queues?sort=-messages&page_size=10"),
        seeded ? null : get("overview/history").catch(() => null)]);
    } catch (e) {
      if (alive()) showError(e, "overview");
      throw e;
    }
    if (!alive()) return;
    ctx.clearError("overview");
    set("broker", `broker ${o.broker} · ${o.version} · up ${age(o.uptime_seconds * 1000)}`);
    set("connections", int(o.connections.total));
    const families = Object.entries(o.connections.by_protocol).sort();
    protocols.replaceChildren(...(families.length ? families.map(([p, c]) => h("span", { class: "proto", dataset: { protocol: p } }, `${FAMILIES[p] || p} `, h("b", {}, int(c)))) : [h("span", { class: "muted" }, "none")]));
    let inRate = null;
    let outRate = null;
    if (!seeded) {
      seeded = true;
      for (const s of history ? history.samples : []) {
        if (s.in_per_second === null || s.out_per_second === null) continue;
        rates.add(s.time_ms, s.in_per_second, s.out_per_second);
        [inRate, outRate] = [s.in_per_second, s.out_per_second]; // the figures show the latest until a refresh has its own
      }
    }
    if (previous && o.now_ms > previous.now_ms && o.messages.received >= previous.messages.received) {
      const seconds = (o.now_ms - previous.now_ms) / 1000;
      inRate = (o.messages.received - previous.messages.received) / seconds;
      outRate = Math.max(0, o.messages.sent - previous.messages.sent) / seconds;
      rates.add(o.now_ms, inRate, outRate);
    }
    previous = o;
    set("in-rate", rate(inRate));
    set("out-rate", rate(outRate));
    set("received", int(o.messages.received));
    set("sent", int(o.messages.sent));
    set("queues", int(o.queues.count));
    set("queue-messages", int(o.queues.messages));
    set("queue-ready", int(o.queues.ready));
    set("queue-unacked", int(o.queues.unacknowledged));
    set("queue-consumers", int(o.queues.consumers));
    gauge(store, "store", o.store.usage_bytes, o.store.limit_bytes);
    if (o.store.full) set("store-detail", `FULL: ${bytes(o.store.usage_bytes)} of ${bytes(o.store.limit_bytes)}`);
    gauge(memory, "memory", o.memory.pending_bytes, o.memory.limit_bytes);
    set("subscriptions", int(o.topics.subscriptions));
    set("durables", int(o.topics.durable_subscriptions));
    set("retained", int(o.topics.retained_messages));
    set("streams", int(o.streams));
    if (o.dead_letter_queue) {
      const plain = o.dead_letter_queue.replace(/^queue:\/\//, "");
      dlqLink.href = `#/queues/${encodeURIComponent(plain)}`;
      dlqLink.hidden = false;
    }
    deepest.update(top.queues.filter((q) => q.messages > 0));
    el.dataset.loaded = String(Number(el.dataset.loaded || 0) + 1);
  }

  return { el, poll: load };
}
