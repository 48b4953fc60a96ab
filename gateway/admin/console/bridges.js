// The Bridges page: each configured bridge's link (connected or not, since when, the last error) and
// its traffic per direction.  A broker has a handful of bridges, so the whole list is asked for at every
// refresh (GET /api/v1/bridges, not paged) and the rates come from successive answers, as on the lists.

import { get } from "./api.js";
import { DASH, Rates, Table, age, h, int, rate, showError, time } from "./ui.js";

const STATES = {
  connected: "The link is up: queued messages are being sent",
  connecting: "Not connected yet: the first connection is being made",
  disconnected: "The link is down: the bridge reconnects with backoff, and outbound messages wait in its queue",
  stopped: "Not running: see the last error and the broker's log",
};

function stateCell(b) {
  return h("span", { class: `badge state state-${b.state}`, title: STATES[b.state] || b.state }, b.state);
}

// How long it has been in that state; the moment itself (local time) on hover.
function sinceCell(b) {
  return h("span", { title: `${b.state} since ${time(b.since)} (${b.since_iso})` }, `${age(Math.max(0, Date.now() - b.since))} ago`);
}

const n = (id, label, title, value) => ({ id, label, num: true, title, value: (b) => int(value(b)) });

export function bridgesView(ctx) {
  const rates = new Rates();
  const count = h("span", { class: "count" });
  const table = new Table([
    { id: "name", label: "Name", cls: "name", value: (b) => h("span", { title: `client id at the remote: ${b.client_id}` }, b.name) },
    { id: "state", label: "State", title: "The link to the remote broker", value: stateCell },
    { id: "since", label: "Since", num: true, title: "How long it has been in this state", value: sinceCell },
    // The remote gateway's own name, when it told it (another gateway does), on hover: the table is wide enough.
    { id: "url", label: "Remote", cls: "clip mono", value: (b) => h("span", { title: b.remote_broker ? `${b.url}: gateway ${b.remote_broker}` : b.url }, b.url) },
    n("queued", "Queued", "Out: waiting in the bridge's queue for the remote", (b) => b.out.queued),
    n("inflight", "In flight", "Out: sent to the remote, not yet confirmed", (b) => b.out.inflight),
    n("forwarded", "Forwarded", "Out: confirmed by the remote (QoS 0: sent) since the broker started", (b) => b.out.forwarded),
    { id: "out_rate", label: "Out/s", num: true, title: "Forwarded per second, between the last two refreshes", value: (b) => rate(b._rate.forwarded) },
    n("received", "Received", "In: from the remote, stored here, since the broker started", (b) => b.in.received),
    { id: "in_rate", label: "In/s", num: true, title: "Received per second, between the last two refreshes", value: (b) => rate(b._rate.received) },
    n("refused", "Refused", "Out: refused by the remote (an error code, or over its maximum packet size)", (b) => b.out.refused),
    n("connects", "Connects", "Times the link came up", (b) => b.connects),
    { id: "last_error", label: "Last error", cls: "last-error", titleFrom: true, value: (b) => b.last_error || DASH },
  ], {
    key: (b) => b.name,
    empty: "No bridges are configured ([[bridges]] in the configuration file).",
    rowClass: (b) => `bridge-${b.state}`,
  });
  const el = h("section", { class: "list bridges" },
    h("div", { class: "title-row" }, h("h2", {}, "Bridges"), count),
    h("p", { class: "muted intro" },
      "Links to other brokers. Out: messages matching a bridge's out patterns wait in its queue (kept across restarts), ",
      "are sent, and count as forwarded once the remote confirms them. In: messages from the remote, counted once stored here."),
    table.el);

  async function load(alive) {
    let answer;
    try {
      answer = await get("bridges");
    } catch (e) {
      if (alive()) showError(e, "list-bridges");
      throw e;
    }
    if (!alive()) return;
    ctx.clearError("list-bridges");
    const bridges = answer.bridges.map((b) => ({ ...b, forwarded: b.out.forwarded, received: b.in.received }));
    const rated = rates.update(bridges, (b) => b.name, ["forwarded", "received"]);
    for (const b of bridges) b._rate = rated.get(b.name) || {};
    table.update(bridges);
    const up = bridges.filter((b) => b.state === "connected").length;
    count.replaceChildren(bridges.length ? `${int(bridges.length)} ${bridges.length === 1 ? "bridge" : "bridges"}, ${int(up)} connected` : "");
    el.dataset.loaded = String(Number(el.dataset.loaded || 0) + 1);
  }

  return { el, poll: load };
}
