// The paged lists: queues, connections, topics, durable subscriptions, MQTT sessions.  Each shows one
// page of the API's server-side paging (page, page_size, filter, sort), and only that page is polled,
// so a broker with 10,000 queues costs the console one page of 100 every 2 s.

import { del, enc, get, qs } from "./api.js";
import { DASH, Rates, Table, age, ask, bytes, h, int, notify, pager, rate, showError } from "./ui.js";

const DEFAULT_SIZE = 100;

// A row's DELETE: what it did (or the API's error) as a note, then the page refreshed.
async function removeAndSay(ctx, path, say) {
  try {
    notify("ok", say(await del(path)));
  } catch (e) {
    showError(e);
  }
  ctx.refresh();
}

function listView(ctx, spec) {
  const params = ctx.params;
  const state = {
    page: Math.max(1, Number(params.get("page")) || 1),
    size: Number(params.get("size")) || DEFAULT_SIZE,
    filter: params.get("filter") || "",
    sort: params.get("sort") || spec.defaultSort,
  };
  const rates = new Rates();
  const count = h("span", { class: "count" });
  const filter = h("input", {
    type: "search", class: "filter", placeholder: spec.filterPlaceholder || "Filter by name", value: state.filter,
    "aria-label": "Filter", spellcheck: false,
  });
  const pagerTop = h("div", { class: "pager-slot" });
  const pagerBottom = h("div", { class: "pager-slot" });
  const table = new Table(spec.columns, {
    key: spec.key, sort: state.sort, empty: spec.empty, rowClass: spec.rowClass,
    onSort: (sort) => go({ sort, page: 1 }),
  });
  const el = h("section", { class: `list ${spec.name}` },
    h("div", { class: "title-row" }, h("h2", {}, spec.title), count, h("span", { class: "spacer" }), filter),
    spec.intro ? h("p", { class: "muted intro" }, spec.intro) : null,
    pagerTop, table.el, pagerBottom);

  // Page, sort and page size go into the address (back and forward work); typing a filter replaces it.
  function hash() {
    return `#/${spec.name}${qs({
      filter: state.filter, sort: state.sort === spec.defaultSort ? "" : state.sort,
      page: state.page === 1 ? "" : state.page, size: state.size === DEFAULT_SIZE ? "" : state.size,
    })}`;
  }
  function go(change, replace = false) {
    if (!el.isConnected) return; // a late filter keystroke's timer, after another page was opened
    Object.assign(state, change);
    table.setSort(state.sort);
    if (replace) history.replaceState(null, "", hash());
    else history.pushState(null, "", hash());
    ctx.moved();
    ctx.refresh();
  }

  let typing = null;
  filter.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(() => go({ filter: filter.value.trim(), page: 1 }, true), 250);
  });

  async function load(alive) {
    const query = qs({ page: state.page, page_size: state.size, filter: state.filter, sort: state.sort });
    let answer;
    try {
      answer = await get(`${spec.path}${query}`);
    } catch (e) {
      if (alive()) showError(e, `list-${spec.name}`);
      throw e;
    }
    if (!alive()) return;
    ctx.clearError(`list-${spec.name}`);
    if (answer.pages && state.page > answer.pages) { // the list shrank under us: its last page
      go({ page: answer.pages }, true);
      return;
    }
    const items = answer[spec.items];
    const rated = spec.rates ? rates.update(items, spec.key, spec.rates) : new Map();
    for (const item of items) item._rate = rated.get(spec.key(item)) || {};
    table.update(items);
    const shown = h("span", {}, `${int(answer.total)} ${answer.total === 1 ? spec.one : spec.many}`);
    count.replaceChildren(shown, state.filter ? ` matching “${state.filter}”` : "");
    const p = { page: answer.page, pages: answer.pages, total: answer.total, pageSize: answer.page_size, count: items.length,
      onPage: (page) => go({ page }), onSize: (size) => go({ size, page: 1 }) };
    pagerTop.replaceChildren(pager(p));
    pagerBottom.replaceChildren(answer.pages > 1 ? pager({ ...p, onSize: null }) : "");
    el.dataset.loaded = String(Number(el.dataset.loaded || 0) + 1);
  }

  return {
    el,
    poll: load,
    // A new address for this same list (back/forward): take its parameters, keep the element.
    update(next) {
      state.page = Math.max(1, Number(next.get("page")) || 1);
      state.size = Number(next.get("size")) || DEFAULT_SIZE;
      state.sort = next.get("sort") || spec.defaultSort;
      state.filter = next.get("filter") || "";
      if (filter.value.trim() !== state.filter) filter.value = state.filter;
      table.setSort(state.sort);
      ctx.refresh();
    },
    focus: () => filter.focus(),
  };
}

const n = (id, label, sort, title) => ({ id, label, num: true, sort, title, value: (r) => int(r[id]) });
const r = (id, field, label, title) => ({ id, label, num: true, title, value: (row) => rate(row._rate[field]) });

function queueLink(name, dlq) {
  return h("span", { class: "name-cell" },
    h("a", { href: `#/queues/${enc(name)}`, title: name }, name),
    dlq ? h("span", { class: "badge dlq", title: "A dead-letter queue" }, "DLQ") : null);
}

export function queuesView(ctx) {
  return listView(ctx, {
    name: "queues", title: "Queues", path: "queues", items: "queues", one: "queue", many: "queues",
    key: (q) => q.name, defaultSort: "name", filterPlaceholder: "Filter queues by name",
    empty: "No queues match.", rates: ["enqueued", "dequeued"],
    rowClass: (q) => (q.dead_letter_queue ? "dlq" : ""),
    columns: [
      { id: "name", label: "Name", sort: "name", cls: "name", keep: true, value: (q) => queueLink(q.name, q.dead_letter_queue) },
      n("messages", "Messages", "messages", "Ready plus unacknowledged"),
      n("ready", "Ready", "ready", "Waiting for a consumer"),
      n("unacknowledged", "Unacked", "unacknowledged", "Delivered, not yet acknowledged"),
      n("consumers", "Consumers", "consumers"),
      n("enqueued", "Enqueued", "enqueued", "Messages added since the broker started"),
      n("dequeued", "Dequeued", "dequeued", "Acknowledged, expired or dead-lettered since the broker started"),
      r("in_rate", "enqueued", "In/s", "Enqueued per second, between the last two refreshes"),
      r("out_rate", "dequeued", "Out/s", "Dequeued per second, between the last two refreshes"),
      { id: "oldest", label: "Oldest", num: true, title: "Age of the oldest waiting message", value: (q) => age(q.oldest_message_age_ms) },
      { id: "store", label: "Store", num: true, title: "Bytes of its persistent messages in the store", value: (q) => bytes(q.store_bytes) },
    ],
  });
}

export function connectionsView(ctx) {
  async function close(c) {
    const reason = await ask({
      title: `Close connection ${c.id}?`,
      text: `${c.protocol_name || c.protocol} ${c.client_id ? `client “${c.client_id}” ` : ""}from ${c.remote}. The client is told the reason in its own protocol; its unacknowledged messages go back to their queues.`,
      confirm: "Close connection", danger: true,
      input: { label: "Reason", value: "closed by an administrator" },
    });
    if (reason === null) return;
    await removeAndSay(ctx, `connections/${enc(c.id)}${qs({ reason: reason.trim() })}`, (done) => `Closed ${done.closed}: ${done.reason}`);
  }
  return listView(ctx, {
    name: "connections", title: "Connections", path: "connections", items: "connections", one: "connection", many: "connections",
    key: (c) => c.id, defaultSort: "since", filterPlaceholder: "Filter by id, protocol, client id, user, address",
    empty: "No connections match.", rates: ["messages_in", "messages_out"],
    columns: [
      { id: "id", label: "ID", sort: "id", cls: "mono", value: (c) => c.id },
      // The API's display name (MQTT 3.1.1, STOMP 1.2 over WebSocket); "protocol" is the machine value (mqtt/4).
      { id: "protocol", label: "Protocol", sort: "protocol", title: "Protocol and version, and WebSocket when the client came over it", value: (c) => c.protocol_name || c.protocol },
      { id: "client_id", label: "Client ID", sort: "client_id", cls: "clip", titleFrom: true, value: (c) => c.client_id || DASH },
      { id: "user", label: "User", sort: "user", value: (c) => c.user || DASH },
      { id: "remote", label: "Remote", sort: "remote", cls: "mono", value: (c) => c.remote },
      { id: "since", label: "Connected", sort: "since", num: true, title: "How long ago it connected", value: (c) => age(Date.now() - c.connected_since_ms) },
      n("messages_in", "In", "messages_in", "Messages received from the client"),
      n("messages_out", "Out", "messages_out", "Messages sent to the client"),
      r("in_rate", "messages_in", "In/s"),
      r("out_rate", "messages_out", "Out/s"),
      n("unacknowledged", "Unacked"),
      { id: "subscriptions", label: "Subscriptions", cls: "clip", titleFrom: true, value: (c) => c.subscriptions.join(", ") || DASH },
      { id: "actions", label: "", keep: true, cls: "actions", value: (c) => h("button", { type: "button", class: "small danger", onclick: () => close(c) }, "Close…") },
    ],
  });
}

export function topicsView(ctx) {
  return listView(ctx, {
    name: "topics", title: "Topics", path: "topics", items: "topics", one: "topic", many: "topics",
    key: (t) => t.name, defaultSort: "name", filterPlaceholder: "Filter topics by name",
    intro: "Topics with subscriptions; wildcard filters are listed as subscribed.",
    empty: "No topic has a subscription.",
    columns: [
      { id: "name", label: "Name", sort: "name", cls: "name mono", titleFrom: true, value: (t) => t.name },
      n("subscriptions", "Subscriptions", "subscriptions"),
      n("durable", "Durable"),
      n("consumers", "Consumers", "consumers"),
      n("messages", "Messages", "messages", "Waiting in its subscriptions, plus unacknowledged"),
      n("enqueued", "Enqueued", "enqueued", "Messages its subscriptions were given"),
    ],
  });
}

export function durablesView(ctx) {
  async function remove(s) {
    const ok = await ask({ title: `Delete durable subscription ${s.key}?`, text: `Its ${int(s.messages)} waiting messages go with it.`, confirm: "Delete", danger: true });
    if (!ok) return;
    await removeAndSay(ctx, `durable-subscriptions/${enc(s.key)}`, () => `Deleted durable subscription ${s.key}`);
  }
  return listView(ctx, {
    name: "durable", title: "Durable subscriptions", path: "durable-subscriptions", items: "durable_subscriptions",
    one: "durable subscription", many: "durable subscriptions",
    key: (s) => s.key, defaultSort: "key", filterPlaceholder: "Filter by client, name or topic",
    empty: "No durable subscriptions.",
    columns: [
      { id: "client_id", label: "Client ID", sort: "key", cls: "clip", titleFrom: true, value: (s) => s.client_id },
      { id: "sub_name", label: "Name", cls: "clip", titleFrom: true, value: (s) => s.name || DASH },
      { id: "destination", label: "Topic", sort: "destination", cls: "clip mono", titleFrom: true, value: (s) => s.destination },
      { id: "kind", label: "Kind", value: (s) => s.kind },
      { id: "active", label: "Active", value: (s) => (s.active ? "yes" : "no") },
      n("consumers", "Consumers", "consumers"),
      n("messages", "Messages", "messages"),
      n("ready", "Ready"),
      n("unacknowledged", "Unacked"),
      n("enqueued", "Enqueued"),
      { id: "selector", label: "Selector", cls: "clip mono", titleFrom: true, value: (s) => s.selector || DASH },
      { id: "actions", label: "", cls: "actions", value: (s) => (s.kind === "durable" && !s.active
        ? h("button", { type: "button", class: "small danger", onclick: () => remove(s) }, "Delete…") : "") },
    ],
  });
}

export function mqttView(ctx) {
  async function end(s) {
    const ok = await ask({ title: `End the MQTT session of ${s.client_id}?`, text: `Its subscriptions and ${int(s.messages)} queued messages go with it; the client's next connection starts a new session.`, confirm: "End session", danger: true });
    if (!ok) return;
    await removeAndSay(ctx, `mqtt-sessions/${enc(s.client_id)}`, () => `Ended the MQTT session of ${s.client_id}`);
  }
  return listView(ctx, {
    name: "mqtt", title: "MQTT sessions", path: "mqtt-sessions", items: "mqtt_sessions", one: "session", many: "sessions",
    key: (s) => s.client_id, defaultSort: "client_id", filterPlaceholder: "Filter by client id",
    empty: "No MQTT sessions.",
    columns: [
      { id: "client_id", label: "Client ID", sort: "client_id", cls: "clip mono", titleFrom: true, value: (s) => s.client_id },
      { id: "persistent", label: "Persistent", value: (s) => (s.persistent ? "yes" : "no") },
      { id: "connected", label: "Connected", value: (s) => (s.connected ? "yes" : s.disconnected_at ? `left ${s.disconnected_at.replace("T", " ").replace("Z", "")}` : "no") },
      { id: "user", label: "User", value: (s) => s.user || DASH },
      { id: "subscriptions", label: "Subscriptions", cls: "clip mono", titleFrom: true, value: (s) => s.subscriptions.join(", ") || DASH },
      n("messages", "Messages", "messages"),
      n("ready", "Ready"),
      n("unacknowledged", "Unacked"),
      { id: "expiry", label: "Expiry", num: true, title: "Session expiry interval (MQTT 5), seconds", value: (s) => (s.expiry_interval === undefined || s.expiry_interval === null ? DASH : int(s.expiry_interval)) },
      { id: "actions", label: "", cls: "actions", value: (s) => (s.persistent && !s.connected
        ? h("button", { type: "button", class: "small danger", onclick: () => end(s) }, "End…") : "") },
    ],
  });
}
