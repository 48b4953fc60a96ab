// The console's shell: hash routes (#/, #/queues, #/queues/NAME, #/connections, #/topics, #/durable,
// #/mqtt, #/streams, #/streams/NAME, #/bridges), the nav, and one poller that refreshes the current page
// every 2 s while the tab is visible.

import { bridgesView } from "./bridges.js";
import { durablesView, connectionsView, mqttView, queuesView, topicsView } from "./lists.js";
import { overviewView } from "./overview.js";
import { queueView } from "./queue.js";
import { streamView, streamsView } from "./streams.js";
import { Poller, clearNote, h, time } from "./ui.js";
import { index } from "./api.js";

const ROUTES = {
  "": ["overview", overviewView],
  queues: ["queues", queuesView],
  connections: ["connections", connectionsView],
  topics: ["topics", topicsView],
  durable: ["durable", durablesView],
  mqtt: ["mqtt", mqttView],
  streams: ["streams", streamsView],
  bridges: ["bridges", bridgesView],
};

const main = document.getElementById("main");
const status = document.getElementById("status");
const pause = document.getElementById("pause");

const poller = new Poller((ok, ms) => {
  const at = time(Date.now()).slice(11, 19);
  status.textContent = (ok ? `updated ${at} · ${Math.round(ms)} ms` : `refresh failed ${at}`) + (poller.paused ? " · paused" : "");
  status.classList.toggle("failed", !ok);
  if (ok) main.dataset.shown = location.hash || "#/"; // what the page now shows (for people's scripts and the tests)
});

let current = null; // {route, arg, view}
let shown = null; // the address rendered last: popstate and hashchange both come for one navigation

// "#/queues/orders.eu?x=1" -> {route: "queues", arg: "orders.eu", params}
function parse() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [pathPart, query = ""] = raw.split(/\?(.*)/s, 2);
  const [route, ...rest] = pathPart.split("/");
  let arg = rest.length ? rest.join("/") : null;
  if (arg !== null) {
    try {
      arg = decodeURIComponent(arg);
    } catch {
      // a hand-typed name with a stray %: as written
    }
  }
  return { route: route || "", arg, params: new URLSearchParams(query) };
}

function render() {
  if (location.href === shown) return;
  shown = location.href;
  const { route, arg, params } = parse();
  if (current && current.route === route && current.arg === arg && current.view.update) {
    current.view.update(params); // the same list, another page or sort: keep the element, refetch
    return;
  }
  const known = route === "queues" && arg !== null ? ["queues", (ctx) => queueView(ctx, arg)]
    : route === "streams" && arg !== null ? ["streams", (ctx) => streamView(ctx, arg)] : ROUTES[route];
  for (const a of document.querySelectorAll("#nav a")) {
    const active = known !== undefined && a.dataset.route === known[0];
    a.classList.toggle("active", active);
    if (active) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  poller.stop();
  if (!known) {
    current = null;
    main.replaceChildren(h("section", {}, h("h2", {}, "Not found"), h("p", {}, "No such page: ", h("code", {}, location.hash), ". ", h("a", { href: "#/" }, "Overview"))));
    return;
  }
  const ctx = {
    params,
    refresh: () => poller.now(),
    clearError: clearNote,
    moved: () => { shown = location.href; }, // the view changed the address itself (pushState)
  };
  const view = known[1](ctx);
  current = { route, arg, view };
  main.replaceChildren(view.el);
  document.title = `${arg ?? (main.querySelector("h2")?.textContent || "Console")} · gateway console`;
  poller.start(view.poll);
}

window.addEventListener("hashchange", render);
window.addEventListener("popstate", render);
document.addEventListener("visibilitychange", () => {
  if (!document.hidden) poller.wake();
});
pause.addEventListener("click", () => {
  const paused = !poller.paused;
  poller.setPaused(paused);
  pause.textContent = paused ? "Resume" : "Pause";
  pause.classList.toggle("active", paused);
  if (paused) status.textContent = "paused";
});

// The index first, alone: with users configured the browser sends its first request outside /console/
// without credentials, and the broker counts that 401 as a failed login (towards a ban of the address).
// Once this one is answered, the browser sends the credentials at once with every /api/ request after it,
// instead of the first few of the page going out together without them.  It also names the broker.
try {
  document.getElementById("broker-name").textContent = (await index()).broker;
} catch {
  // a failure here says nothing the page's own requests will not say, visibly
}
render();
