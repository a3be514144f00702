// The console's HTTP API (docs/console.md). A 401 asks the page for the token once, then retries.

export class ApiError extends Error {
  constructor(status, body) {
    super(
      body?.detail ||
        (body?.errors || []).map((e) => (e.field ? `${e.field}: ${e.message}` : e.message)).join("\n") ||
        `HTTP ${status}`,
    );
    this.status = status;
    this.errors = body?.errors || [];
  }
}

let loginHandler = null;

/** `handler()` resolves once the user has logged in (see app.js). */
export function onUnauthorized(handler) {
  loginHandler = handler;
}

export async function api(path, { method = "GET", body } = {}) {
  const init = { method, headers: {}, credentials: "same-origin" };
  if (body !== undefined) {
    init.headers["Content-Type"] = "application/json";
    init.body = JSON.stringify(body);
  }
  let response = await fetch(path, init);
  if (response.status === 401 && loginHandler) {
    await loginHandler();
    response = await fetch(path, init);
  }
  const data = await response.json().catch(() => ({}));
  if (!response.ok) throw new ApiError(response.status, data);
  return data;
}

export function login(token) {
  return fetch("api/login", {
    method: "POST",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ token }),
  }).then((r) => r.ok);
}
