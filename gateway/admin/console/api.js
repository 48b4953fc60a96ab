// The admin JSON API, as the console calls it.  Paths are relative to the page (/console/), so the
// console also works behind a proxy that mounts the admin listener under a prefix.  The browser sends
// the Basic credentials it cached when the page itself asked for a login.

export class ApiError extends Error {
  constructor(status, message, code, detail) {
    super(message);
    this.status = status;
    this.code = code;
    this.detail = detail;
  }
}

const READ_TIMEOUT_MS = 15000;
const BASE = new URL("../api/v1/", document.baseURI);
// A page opened with a user name and password in its address (user:password@host) has them in its
// base too, and fetch refuses URLs that carry credentials.
BASE.username = "";
BASE.password = "";

export const enc = encodeURIComponent;

// Query string from an object, leaving out empty values.
export function qs(params) {
  const parts = [];
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === null || v === "") continue;
    parts.push(`${enc(k)}=${enc(v)}`);
  }
  return parts.length ? `?${parts.join("&")}` : "";
}

// One call; resolves with the parsed JSON answer, rejects with an ApiError carrying the API's own
// "error" text (or what went wrong on the way), never a bare status.
export async function api(method, path, body) {
  const init = { method, headers: { Accept: "application/json" }, credentials: "same-origin", cache: "no-store" };
  // A read that hangs would hold up the page's refreshes; an action waits as long as the broker works on it
  // (replaying 100,000 dead letters takes seconds).
  if (method === "GET") init.signal = AbortSignal.timeout(READ_TIMEOUT_MS);
  if (body !== undefined) {
    init.body = JSON.stringify(body);
    init.headers["Content-Type"] = "application/json";
  }
  let answer;
  try {
    answer = await fetch(new URL(path, BASE), init);
  } catch (e) {
    throw new ApiError(0, `${method} /api/v1/${path}: the broker did not answer (${e.message})`, "network");
  }
  const text = await answer.text();
  let doc = null;
  try {
    doc = text ? JSON.parse(text) : null;
  } catch {
    doc = null;
  }
  if (!answer.ok) {
    const why = doc && typeof doc.error === "string" ? doc.error : `${answer.status} ${answer.statusText}`.trim();
    throw new ApiError(answer.status, `${method} /api/v1/${path.split("?")[0]}: ${why}`, doc?.code, doc);
  }
  if (doc === null && text) throw new ApiError(answer.status, `${method} /api/v1/${path}: the answer is not JSON`, "bad_answer");
  return doc;
}

export const get = (path) => api("GET", path);
export const post = (path, body) => api("POST", path, body ?? {});
export const del = (path) => api("DELETE", path);
export const index = () => api("GET", "../v1"); // /api/v1 itself: the broker's name and version
