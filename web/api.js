// The only module that talks to the service. It calls the public REST API (the same one scripts
// use), adds the session's CSRF token to writes, and turns problem+json codes into sentences a
// person understands, so no view ever parses an error itself.

let csrfToken = null;

export function useCsrfToken(token) {
  csrfToken = token;
}

export class ApiError extends Error {
  constructor(status, code, message, problem) {
    super(message);
    this.status = status;
    this.code = code;
    this.problem = problem;
  }

  // 503 (database away), a gateway in trouble, or no answer at all: worth trying again.
  get retryable() {
    return this.status === 0 || this.status === 502 || this.status === 503 || this.status === 504;
  }
}

const MESSAGES = {
  UNAUTHENTICATED: () => "Your session has ended. Sign in again.",
  FORBIDDEN: (p) => {
    const roles = Array.isArray(p?.required_roles) ? p.required_roles.join(" or ") : "another";
    return `This needs the ${roles} role; your token does not have it.`;
  },
  CSRF_REJECTED: () => "The page's security check failed. Reload the page and try again.",
  LEASE_NOT_HELD: () => "This item was taken back and leased again, so it is no longer yours. Moving on.",
  RESOLUTION_CONFLICT: () => "You already resolved this item with a different resolution.",
  SEGREGATION_OF_DUTIES: () => "You prepared this proposal, so another approver must decide it.",
  SOURCE_CHANGED: () => "The figures changed while you were reviewing. Check the new values, then decide again.",
  NOT_ASSIGNED: () => "Nobody holds this item now, so there is no lease to release or move.",
  ALREADY_HELD: () => "That reviewer already holds this item.",
  NOT_A_REVIEWER: () => "There is no reviewer by that name with a live token.",
  REVIEWER_AT_CAP: () => "That reviewer already holds as many items as anyone may.",
  NOT_FOUND: () => "No such item.",
  PAYLOAD_TOO_LARGE: () => "That is too long to send.",
  VALIDATION_ERROR: (p) => {
    const first = Array.isArray(p?.errors) && p.errors.length ? p.errors[0] : null;
    const field = first && Array.isArray(first.loc) ? first.loc[first.loc.length - 1] : null;
    return field ? `Please check ${field}: ${first.msg}.` : "Please check what you entered.";
  },
  DATABASE_UNAVAILABLE: () => "Database unavailable, retrying…",
  NETWORK: () => "The service cannot be reached, retrying…",
};

function explain(status, code, problem) {
  const message = MESSAGES[code];
  if (message) return message(problem);
  if (status >= 500) return "The service is having trouble, retrying…";
  return "Something went wrong. Please try again.";
}

// A problem document that arrived inside a 200 answer (one refused entry of a batch), as a sentence.
export function describe(problem) {
  return explain(problem?.status ?? 0, problem?.code, problem);
}

async function call(method, path, body, { signal } = {}) {
  const headers = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && csrfToken) headers["X-CSRF-Token"] = csrfToken;
  let response;
  try {
    response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      credentials: "same-origin",
      signal,
    });
  } catch (error) {
    if (error.name === "AbortError") throw error;
    throw new ApiError(0, "NETWORK", explain(0, "NETWORK", null), null);
  }
  if (response.status === 204) return null;
  let data = null;
  try {
    data = await response.json(); // amounts are strings on the wire, so no float is ever made
  } catch {
    data = null;
  }
  if (!response.ok) {
    const code = data && typeof data.code === "string" ? data.code : `HTTP_${response.status}`;
    throw new ApiError(response.status, code, explain(response.status, code, data), data);
  }
  return data;
}

export const api = {
  signIn: (token) => call("POST", "/session", { token }),
  session: () => call("GET", "/session"),
  signOut: () => call("DELETE", "/session"), // null, or {end_session_url} after a provider's sign-in
  oidcProvider: () => call("GET", "/auth/oidc"),
  lease: (waitS, signal, entity) =>
    call("POST", "/leases", { batch_size: 1, wait_s: waitS, ...(entity ? { ledger_entity: entity } : {}) }, { signal }),
  mine: () => call("GET", "/items?state=ASSIGNED&leased_by=me&limit=200"),
  item: (id) => call("GET", `/items/${encodeURIComponent(id)}`),
  byKey: (key) => call("GET", `/items?idempotency_key=${encodeURIComponent(key)}`),
  events: (id) => call("GET", `/items/${encodeURIComponent(id)}/events`),
  complete: (item, resolution, note) =>
    call("POST", `/items/${item.id}/complete`, {
      resolution,
      ...(note ? { note } : {}),
      lease_token: item.lease_token,
      // The figures this decision was made on: anything else is refused with SOURCE_CHANGED.
      source_hash: item.source_hash,
    }),
  renew: (item) => call("POST", `/items/${item.id}/renew`, { lease_token: item.lease_token }),
  release: (item, reason) =>
    call("POST", `/items/${item.id}/release`, { reason, lease_token: item.lease_token }),
  // Maker-checker: proposals awaiting approval (roles approver, admin).
  leaseApproval: () => call("POST", "/leases", { batch_size: 1, queue: "approval" }),
  myApprovals: () => call("GET", "/items?state=AWAITING_APPROVAL&leased_by=me&limit=200"),
  approve: (item) => call("POST", `/items/${item.id}/approve`, { lease_token: item.lease_token }),
  comment: (id, text) => call("POST", `/items/${encodeURIComponent(id)}/comments`, { text }),
  reject: (item, reason) =>
    call("POST", `/items/${item.id}/reject`, { reason, lease_token: item.lease_token }),
  // The work list: GET /items with the list's filters (only the ones given), and one page of it.
  list: (params) => {
    const query = new URLSearchParams(Object.entries(params).filter(([, v]) => v !== null && v !== undefined && v !== ""));
    return call("GET", `/items?${query}`);
  },
  leaseItem: (id) => call("POST", "/leases", { item_id: id }),
  completeMany: (entries) => call("POST", "/items/complete", { items: entries }),
  decisions: (cursor) => call("GET", `/decisions?limit=20${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`),
  resolutions: () => call("GET", "/resolutions"),
  stats: () => call("GET", "/stats"),
  // Exchange rates: the latest of each (and the base currency), and one currency's every rate.
  rates: () => call("GET", "/fx-rates"),
  rateHistory: (code) => call("GET", `/fx-rates/${encodeURIComponent(code)}/history?limit=1000`),
  reclaim: () => call("POST", "/admin/reclaim", {}),
  adminRelease: (id, reason) => call("POST", `/admin/items/${encodeURIComponent(id)}/release`, { reason }),
  adminReleaseReviewer: (reviewer, reason) =>
    call("POST", `/admin/reviewers/${encodeURIComponent(reviewer)}/release`, { reason }),
  reassign: (id, reviewer, reason) =>
    call("POST", `/admin/items/${encodeURIComponent(id)}/reassign`, { reviewer, reason }),
  // Reports (web/reports.js; roles auditor and admin). The CSV is downloaded by a plain link: the
  // browser sends the session cookie with it, as with every call here.
  reportSla: (query) => call("GET", `/reports/sla?${new URLSearchParams(query)}`),
  reportThroughput: (query) => call("GET", `/reports/throughput?${new URLSearchParams(query)}`),
  reportBacklog: (query) => call("GET", `/reports/backlog?${new URLSearchParams(query)}`),
  decisionsCsvUrl: (query) => `/reports/decisions.csv?${new URLSearchParams(query)}`,
};
