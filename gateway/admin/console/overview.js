// The front page: the broker at a glance, from /api/v1/overview every 2 s.  Messages per second are
// the difference of the "received"/"sent" counters between two answers, over the broker's own clock.

import { get } from "./api.js";
import { DASH, Table, age, bytes, h, int, percent, rate, showError } from "./ui.js";

const HISTORY = 150; // points of the rate chart: 5 minutes at one per 2 s

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

function chart() {
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${HISTORY - 1} 100`);
  svg.setAttribute("preserveAspectRatio", "none");
  svg.classList.add("chart");
  const lines = ["in", "out"].map((cls) => {
    const line = document.createElementNS(ns, "polyline");
    line.classList.add(cls);
    line.setAttribute("vector-effect", "non-scaling-stroke");
    svg.append(line);
    return line;
  });
  const points = [];
  return {
    el: svg,
    add(inRate, outRate) {
      points.push([inRate, outRate]);
      if (points.length > HISTORY) points.shift();
      const top = Math.max(1, ...points.flat()) * 1.1;
      const offset = HISTORY - points.length;
      lines.forEach((line, k) => {
        line.setAttribute("points", points.map((p, i) => `${offset + i},${(97 - (94 * p[k]) / top).toFixed(1)}`).join(" "));
      });
      return top / 1.1;
    },
  };
}

export function overviewView(ctx) {
  const store = meter("store-meter");
  const memory = meter("memory-meter");
  const rates = chart();
  const peak = h("span", { class: "muted" });
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
      h("div", { class: "panel" }, h("h3", {}, "Messages per second ", h("span", { class: "legend in" }, "in"), " ", h("span", { class: "legend out" }, "out"), " ", peak), rates.el),
      h("div", { class: "panel" }, h("h3", {}, "Deepest queues ", h("a", { href: "#/queues?sort=-messages", class: "more" }, "all queues →")), deepest.el)));

  const set = (field, text) => {
    const node = el.querySelector(`[data-field="${field}"]`);
    if (node.textContent !== text) node.textContent = text;
  };
  let previous = null;

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
    try {
      [o, top] = await Promise.all([get("overview"), get("queues?sort=-messages&page_size=10")]);
    } catch (e) {
      if (alive()) showError(e, "overview");
      throw e;
    }
    if (!alive()) return;
    ctx.clearError("overview");
    set("broker", `broker ${o.broker} · ${o.version} · up ${age(o.uptime_seconds * 1000)}`);
    set("connections", int(o.connections.total));
    const families = Object.entries(o.connections.by_protocol).sort();
    protocols.replaceChildren(...(families.length ? families.map(([p, c]) => h("span", { class: "proto", dataset: { protocol: p } }, `${p} `, h("b", {}, int(c)))) : [h("span", { class: "muted" }, "none")]));
    let inRate = null;
    let outRate = null;
    if (previous && o.now_ms > previous.now_ms && o.messages.received >= previous.messages.received) {
      const seconds = (o.now_ms - previous.now_ms) / 1000;
      inRate = (o.messages.received - previous.messages.received) / seconds;
      outRate = Math.max(0, o.messages.sent - previous.messages.sent) / seconds;
      const top = rates.add(inRate, outRate);
      peak.textContent = `(top of the chart: ${rate(top)}/s)`;
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
