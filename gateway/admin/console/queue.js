// One queue: its figures (polled every 2 s), its consumers, browsing its messages a page at a time
// (from/next, not polled, so a selection stays put), and the actions: send, purge, move, delete, and
// for a dead-letter queue replay (all, or the selected messages).

import { del, enc, get, post, qs } from "./api.js";
import { DASH, Rates, Table, age, ask, bytes, h, int, notify, rate, showError, time } from "./ui.js";

const BROWSE_SIZES = [20, 50, 100, 200];
const PREVIEW = 1024; // body bytes asked for; the table shows the start, a row's details the rest

function stat(field, label, title) {
  return h("div", { class: "stat", title }, h("span", { class: "value", dataset: { field } }, DASH), h("span", { class: "label" }, label));
}

// "name: value" lines (or name=value) -> an object; throws on a line that is neither.
export function parseHeaders(text) {
  const headers = {};
  text.split("\n").forEach((line, i) => {
    if (!line.trim()) return;
    const m = /^\s*([^:=\s][^:=]*?)\s*[:=]\s?(.*)$/.exec(line);
    if (!m) throw new Error(`header line ${i + 1} is not "name: value": ${line.slice(0, 60)}`);
    headers[m[1]] = m[2];
  });
  return headers;
}

function bodyText(m) {
  if (m.encoding === "base64") return `(binary, ${bytes(m.size)}) base64:${m.body}`;
  return m.body;
}

export function queueView(ctx, name) {
  const path = `queues/${enc(name)}`;
  const rates = new Rates();
  const selected = new Set();
  let info = null;
  let browseFrom = 0;
  const earlier = []; // the from of earlier pages, for Previous
  let browseNext = null;
  let browseSize = 20;
  let messages = [];

  const badge = h("span", { class: "badge dlq", hidden: true }, "DLQ");
  const stats = h("div", { class: "stats" },
    stat("messages", "messages", "Ready plus unacknowledged"), stat("ready", "ready", "Waiting for a consumer"),
    stat("unacknowledged", "unacked", "Delivered, not yet acknowledged"), stat("consumers", "consumers"),
    stat("in-rate", "in/s", "Enqueued per second"), stat("out-rate", "out/s", "Dequeued per second"),
    stat("enqueued", "enqueued", "Since the broker started"), stat("dequeued", "dequeued", "Acknowledged, expired or dead-lettered"),
    stat("expired", "expired"), stat("dead_lettered", "dead-lettered"), stat("oldest", "oldest", "Age of the oldest waiting message"),
    stat("memory", "in memory"), stat("paged", "paged out", "Messages kept only in the store"), stat("store", "in store"));

  // -- actions --------------------------------------------------------------------------------

  const replayAll = h("button", { type: "button", class: "primary", hidden: true, onclick: () => replay(false) }, "Replay all");
  const replaySelected = h("button", { type: "button", hidden: true, disabled: true, onclick: () => replay(true) }, "Replay selected");
  const toolbar = h("div", { class: "toolbar" },
    replayAll, replaySelected,
    h("button", { type: "button", class: "danger", onclick: purge }, "Purge…"),
    h("button", { type: "button", class: "quiet", onclick: remove }, "Delete queue…"));

  // Send
  const sendBody = h("textarea", { name: "body", rows: "4", placeholder: "Message body (text)", spellcheck: false });
  const sendHeaders = h("textarea", { name: "headers", rows: "4", placeholder: "Headers, one per line: name: value", spellcheck: false });
  const sendPersistent = h("input", { type: "checkbox", name: "persistent", checked: true });
  const sendPriority = h("select", { name: "priority" }, h("option", { value: "" }, "default"), [...Array(10).keys()].map((p) => h("option", { value: String(p) }, String(p))));
  const sendForm = h("form", { class: "send", onsubmit: (e) => { e.preventDefault(); send(); } },
    h("div", { class: "two" }, h("label", {}, "Body", sendBody), h("label", {}, "Headers", sendHeaders)),
    h("div", { class: "row" },
      h("label", { class: "inline" }, sendPersistent, " persistent"),
      h("label", { class: "inline" }, "priority ", sendPriority),
      h("button", { type: "submit", class: "primary" }, "Send")));

  // Move
  const moveTo = h("input", { type: "text", name: "to", placeholder: "target queue, e.g. orders.retry", spellcheck: false, required: true });
  const moveSelector = h("input", { type: "text", name: "selector", placeholder: "optional selector, e.g. priority > 4", spellcheck: false });
  const moveSelected = h("button", { type: "button", disabled: true, onclick: () => move(true) }, "Move selected");
  const moveForm = h("form", { class: "move", onsubmit: (e) => { e.preventDefault(); move(false); } },
    h("div", { class: "row" },
      h("label", { class: "grow" }, "To queue", moveTo),
      h("label", { class: "grow" }, "Selector", moveSelector),
      moveSelected,
      h("button", { type: "submit" }, "Move all…")));

  // -- consumers and browse ----------------------------------------------------------------------

  const consumers = new Table([
    { id: "id", label: "Consumer", cls: "mono", value: (c) => c.id },
    { id: "connection", label: "Connection", cls: "mono", value: (c) => c.connection || DASH },
    { id: "client_id", label: "Client ID", value: (c) => c.client_id || DASH },
    { id: "ack_mode", label: "Ack", value: (c) => c.ack_mode },
    { id: "prefetch", label: "Prefetch", num: true, value: (c) => int(c.prefetch) },
    { id: "unacknowledged", label: "Unacked", num: true, value: (c) => int(c.unacknowledged) },
    { id: "selector", label: "Selector", cls: "clip mono", titleFrom: true, value: (c) => c.selector || DASH },
    { id: "exclusive", label: "Exclusive", value: (c) => (c.exclusive ? "yes" : "no") },
  ], { key: (c) => `${c.connection}/${c.id}`, empty: "No consumers." });

  const allBox = h("input", { type: "checkbox", title: "Select every message on this page", "aria-label": "Select all" });
  allBox.addEventListener("change", () => {
    for (const m of messages) if (allBox.checked) selected.add(m.id); else selected.delete(m.id);
    drawBrowse();
  });
  const browseBody = h("tbody");
  const browseInfo = h("span", { class: "muted" });
  const sizeSelect = h("select", { onchange: (e) => { browseSize = Number(e.target.value); browse(browseFrom); } },
    BROWSE_SIZES.map((s) => h("option", { value: String(s), selected: s === browseSize }, String(s))));
  const firstButton = h("button", { type: "button", class: "quiet", onclick: () => { earlier.length = 0; browse(0); } }, "« First");
  const prevButton = h("button", { type: "button", class: "quiet", onclick: () => browse(earlier.pop() ?? 0, true) }, "‹ Previous");
  const nextButton = h("button", { type: "button", class: "quiet", onclick: () => { earlier.push(browseFrom); browse(browseNext, true); } }, "Next ›");
  const browseTable = h("div", { class: "table-wrap" }, h("table", { class: "grid browse" },
    h("thead", {}, h("tr", {},
      h("th", { class: "check" }, allBox), h("th", { class: "num" }, "Seq"), h("th", {}, "Message ID"), h("th", {}, "Time"),
      h("th", { class: "num", title: "Priority" }, "Pri"), h("th", { title: "Persistent" }, "Pers"),
      h("th", { class: "num", title: "Redeliveries" }, "Redel"), h("th", { class: "num" }, "Size"),
      h("th", {}, "Body"), h("th", {}, "Headers"))),
    browseBody));

  const el = h("section", { class: "queue" },
    h("div", { class: "title-row" },
      h("a", { href: "#/queues", class: "back" }, "← Queues"),
      h("h2", {}, "Queue ", h("span", { class: "qname", dataset: { field: "name" } }, name)), badge,
      h("span", { class: "spacer" }), toolbar),
    stats,
    h("div", { class: "panels" },
      h("details", { class: "panel send-panel" }, h("summary", {}, "Send a message"), sendForm),
      h("details", { class: "panel move-panel" }, h("summary", {}, "Move messages"), moveForm)),
    h("div", { class: "panel" },
      h("div", { class: "title-row" }, h("h3", {}, "Messages"), browseInfo, h("span", { class: "spacer" }),
        firstButton, prevButton, nextButton, h("label", { class: "size" }, "per page ", sizeSelect),
        h("button", { type: "button", class: "quiet", onclick: () => browse(browseFrom) }, "Refresh")),
      browseTable),
    h("div", { class: "panel" }, h("h3", {}, "Consumers"), consumers.el));

  const set = (field, text) => {
    const node = stats.querySelector(`[data-field="${field}"]`);
    if (node && node.textContent !== text) node.textContent = text;
  };

  function showSelection() {
    const n = selected.size;
    replaySelected.disabled = moveSelected.disabled = n === 0;
    replaySelected.textContent = n ? `Replay selected (${n})` : "Replay selected";
    moveSelected.textContent = n ? `Move selected (${n})` : "Move selected";
    allBox.checked = messages.length > 0 && messages.every((m) => selected.has(m.id));
  }

  function drawBrowse() {
    if (!messages.length) {
      browseBody.replaceChildren(h("tr", { class: "empty" }, h("td", { colspan: "10" }, browseFrom ? "No more messages." : "No messages waiting.")));
    } else {
      browseBody.replaceChildren(...messages.flatMap((m) => {
        const box = h("input", { type: "checkbox", checked: selected.has(m.id), "aria-label": `Select ${m.id}` });
        box.addEventListener("change", () => { if (box.checked) selected.add(m.id); else selected.delete(m.id); showSelection(); });
        const headers = Object.entries(m.headers).map(([k, v]) => `${k}: ${v}`);
        const detail = h("tr", { class: "detail", hidden: true }, h("td", { colspan: "10" },
          h("div", { class: "detail-grid" },
            h("div", {}, h("h4", {}, "Body", m.truncated ? ` (first ${bytes(PREVIEW)} of ${bytes(m.size)})` : ""), h("pre", {}, bodyText(m))),
            h("div", {}, h("h4", {}, "Headers"), h("pre", {}, [
              ...headers,
              m.correlation_id ? `(correlation-id: ${m.correlation_id})` : null,
              m.reply_to ? `(reply-to: ${m.reply_to})` : null,
              m.group_id ? `(group: ${m.group_id} #${m.group_seq})` : null,
              m.expires ? `(expires: ${time(m.expires)})` : null,
            ].filter(Boolean).join("\n") || "none")))));
        const toggle = h("button", { type: "button", class: "link mono", title: "Show the body and headers", onclick: () => { detail.hidden = !detail.hidden; } }, m.id);
        const row = h("tr", { class: m.in_flight ? "in-flight" : null, dataset: { id: m.id } },
          h("td", { class: "check" }, box),
          h("td", { class: "num" }, int(m.seq)),
          h("td", { class: "id" }, toggle, m.in_flight ? h("span", { class: "badge", title: "Delivered to a consumer, not yet acknowledged" }, "in flight") : null),
          h("td", { class: "nowrap" }, time(m.timestamp)),
          h("td", { class: "num" }, String(m.priority)),
          h("td", {}, m.persistent ? "yes" : "no"),
          h("td", { class: "num" }, int(m.redeliveries)),
          h("td", { class: "num" }, bytes(m.size)),
          h("td", { class: `body clip${m.encoding === "base64" ? " binary" : ""}`, title: bodyText(m).slice(0, 500) }, bodyText(m).slice(0, 200)),
          h("td", { class: "headers clip mono", title: headers.join("\n") }, headers.join(", ") || DASH));
        return [row, detail];
      }));
    }
    showSelection();
  }

  async function browse(from, keepHistory = false) {
    if (!keepHistory && from === 0) earlier.length = 0;
    try {
      const page = await get(`${path}/messages${qs({ from, limit: browseSize, preview: PREVIEW })}`);
      browseFrom = from;
      browseNext = page.next;
      messages = page.messages;
      const ids = new Set(messages.map((m) => m.id));
      for (const id of [...selected]) if (!ids.has(id)) selected.delete(id);
      browseInfo.textContent = `${int(page.depth)} ready, ${int(page.in_flight)} in flight · page as of ${time(Date.now()).slice(11, 19)}`;
      prevButton.disabled = earlier.length === 0;
      firstButton.disabled = from === 0;
      nextButton.disabled = page.next === null;
      drawBrowse();
      el.dataset.browsed = String(Number(el.dataset.browsed || 0) + 1);
    } catch (e) {
      showError(e, "browse");
    }
  }

  // -- the actions ---------------------------------------------------------------------------

  // One action: its call, then a message saying what it did (or the API's error), then fresh figures.
  async function act(call, describe) {
    try {
      const answer = await call();
      notify("ok", describe(answer));
    } catch (e) {
      showError(e);
    }
    ctx.refresh();
    await browse(0);
  }

  async function purge() {
    const ready = info ? info.ready : null;
    const ok = await ask({
      title: `Purge ${info ? info.destination : name}?`,
      text: `Removes the ${ready === null ? "" : `${int(ready)} `}messages waiting in it. Messages in flight to consumers stay.`,
      confirm: "Purge", danger: true,
    });
    if (ok) await act(() => post(`${path}/purge`), (a) => `Purged ${int(a.purged)} messages from ${a.destination}`);
  }

  async function remove() {
    const ok = await ask({ title: `Delete ${info ? info.destination : name}?`, text: "Its waiting messages are deleted with it. Refused while it has consumers.", confirm: "Delete", danger: true });
    if (!ok) return;
    try {
      const a = await del(path);
      notify("ok", `Deleted ${a.destination} and ${int(a.purged)} messages`);
      location.hash = "#/queues";
    } catch (e) {
      showError(e);
    }
  }

  async function send() {
    let headers;
    try {
      headers = parseHeaders(sendHeaders.value);
    } catch (e) {
      showError(e);
      return;
    }
    const doc = { body: sendBody.value, headers, persistent: sendPersistent.checked };
    if (sendPriority.value !== "") doc.priority = Number(sendPriority.value);
    await act(() => post(`${path}/messages`, doc), (a) => `Sent ${a.id} to ${a.destination}${a.persistent ? " (persistent)" : ""}`);
  }

  async function move(onlySelected) {
    const to = moveTo.value.trim();
    const doc = { to };
    if (moveSelector.value.trim()) doc.selector = moveSelector.value.trim();
    if (onlySelected) doc.ids = [...selected];
    else {
      const ok = await ask({ title: `Move ${doc.selector ? "matching" : "all"} waiting messages to ${to || "?"}?`, text: doc.selector ? `Those matching ${doc.selector}.` : "", confirm: "Move" });
      if (!ok) return;
    }
    await act(() => post(`${path}/move`, doc), (a) => `Moved ${int(a.moved)} messages from ${a.destination} to ${a.to}`);
  }

  async function replay(onlySelected) {
    const doc = onlySelected ? { ids: [...selected] } : {};
    if (!onlySelected) {
      const ok = await ask({ title: `Replay ${info ? int(info.ready) : "all"} dead letters?`, text: "Each goes back to the destination it came from.", confirm: "Replay all" });
      if (!ok) return;
    }
    await act(() => post(`${path}/replay`, doc), (a) => {
      const skipped = a.skipped_count ? `; ${int(a.skipped_count)} skipped (${a.skipped.slice(0, 3).map((s) => `${s.id}: ${s.reason}`).join("; ")}${a.skipped_count > 3 ? "; …" : ""})` : "";
      return `Replayed ${int(a.replayed)} messages from ${a.destination}${skipped}`;
    });
  }

  // -- the poll --------------------------------------------------------------------------------

  async function load(alive) {
    let q;
    try {
      q = await get(path);
    } catch (e) {
      if (alive()) showError(e, "queue");
      throw e;
    }
    if (!alive()) return;
    ctx.clearError("queue");
    info = q;
    const r = rates.update([q], (x) => x.name, ["enqueued", "dequeued"]).get(q.name) || {};
    for (const f of ["messages", "ready", "unacknowledged", "consumers", "enqueued", "dequeued", "expired", "dead_lettered", "paged"]) set(f, int(q[f]));
    set("in-rate", rate(r.enqueued));
    set("out-rate", rate(r.dequeued));
    set("oldest", age(q.oldest_message_age_ms));
    set("memory", bytes(q.memory_bytes));
    set("store", bytes(q.store_bytes));
    badge.hidden = !q.dead_letter_queue;
    replayAll.hidden = replaySelected.hidden = !q.dead_letter_queue;
    consumers.update(q.consumer_list);
    el.dataset.loaded = String(Number(el.dataset.loaded || 0) + 1);
  }

  browse(0);
  return { el, poll: load };
}
