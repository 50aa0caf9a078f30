// The reviewer desk: one state object, one render function per region, one table of shortcuts.
// Everything shown comes from outside (ingest, other reviewers) and is rendered as text only:
// elements are made with createElement and filled with textContent, never with innerHTML.

import { api, ApiError, useCsrfToken } from "./api.js";
// --- Reports view (web/reports.js): for the module split, re-hook these three marked spots -------
import { mountReports } from "./reports.js";

const REPORT_ROLES = ["auditor", "admin"];
// --- end Reports view ----------------------------------------------------------------------------

const REVIEWER_ROLES = ["reviewer", "approver", "admin"];
const APPROVER_ROLES = ["approver", "admin"];

const state = {
  me: null, // {subject, role, csrf_token, lease_s, idle_release_s, max_wait_s}
  signInError: null,
  held: [], // items I hold, queue order; held[0] is the current item
  changed: null, // {before, after}: the current item's figures changed under the lease
  events: [], // audit trail of the current item
  leaseEndsAt: 0, // performance.now() when the current lease ends
  lastRenewAt: 0,
  queue: null, // GET /stats, shown when nothing is pending
  waiting: false, // a long poll is in flight
  paused: null, // why the desk stopped on its own (idle)
  banner: null, // database unavailable, retrying
  notice: null, // {text, error}
  admin: { stats: null, message: null, found: null, foundEvents: [] },
  approval: { item: null, message: null }, // the proposal whose approval lease I hold
  codes: [], // the active resolution codes, as GET /resolutions lists them (the catalogue decides)
  lastActivity: performance.now(),
  helpOpen: false,
  resumed: Promise.resolve(), // sign-in's look at what this reviewer already holds
};

let waitAbort = null;

// --- small DOM helpers: text only ------------------------------------------------------------

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "on") for (const [event, fn] of Object.entries(value)) el.addEventListener(event, fn);
    else if (name === "class") el.className = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

const $ = (id) => document.getElementById(id);

// replaceChildren would turn a null into the text "null": leave the gaps out.
function fill(el, ...children) {
  el.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
}

function duration(seconds) {
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m} min`;
  const hours = Math.floor(m / 60);
  if (hours >= 48) return hours % 24 ? `${Math.floor(hours / 24)} d ${hours % 24} h` : `${hours / 24} d`;
  return m % 60 ? `${hours} h ${m % 60} min` : `${hours} h`;
}

function since(iso) {
  return duration((Date.now() - Date.parse(iso)) / 1000);
}

// The deadline as local time, and whether it has passed: said in words, not by colour alone.
function dueField(iso) {
  const late = (Date.now() - Date.parse(iso)) / 1000;
  const when = new Date(iso).toLocaleString();
  if (late <= 0) return field("Due", h("span", { "data-testid": "due" }, `${when} (in ${duration(-late)})`));
  return field(
    "Due",
    h("span", { class: "overdue", "data-testid": "due" }, h("strong", {}, "Overdue"), ` by ${duration(late)} (was due ${when})`),
  );
}

// --- shortcuts: one table, also rendered as the ? help -----------------------------------------

const typing = (ev) => ev.target instanceof HTMLElement && ev.target.matches("input, textarea, select");

const SHORTCUTS = [
  { keys: "n", label: "Next item", match: (ev) => ev.key === "n", run: () => nextItem() },
  {
    keys: "Ctrl+Enter",
    label: "Resolve with the chosen resolution and note, then go to the next item",
    inFields: true,
    match: (ev) => ev.key === "Enter" && (ev.ctrlKey || ev.metaKey),
    run: () => resolveAndNext(),
  },
  {
    keys: "1 … 9",
    label: "Choose the resolution: the first to the ninth in the Resolution list",
    match: (ev) => /^[1-9]$/.test(ev.key),
    run: (ev) => chooseResolution(Number(ev.key) - 1),
  },
  { keys: "e", label: "Write the note", match: (ev) => ev.key === "e", run: () => $("note")?.focus() },
  {
    keys: "x",
    label: "Release the item back to the queue (with the reason typed under Release reason)",
    match: (ev) => ev.key === "x",
    run: () => releaseCurrent(),
  },
  { keys: "a", label: "Admin: refresh the statistics", match: (ev) => ev.key === "a", run: () => loadAdmin() },
  { keys: "?", label: "Show or hide these shortcuts", match: (ev) => ev.key === "?", run: () => toggleHelp() },
  {
    keys: "Escape",
    label: "Close this list, or leave the field you are typing in",
    inFields: true,
    match: (ev) => ev.key === "Escape",
    run: () => {
      if (state.helpOpen) toggleHelp(false);
      else if (document.activeElement instanceof HTMLElement) document.activeElement.blur();
    },
  },
];

function onKey(ev) {
  if (!state.me) return;
  for (const shortcut of SHORTCUTS) {
    if (typing(ev) && !shortcut.inFields) continue;
    if (ev.altKey || ((ev.ctrlKey || ev.metaKey) && !shortcut.keys.startsWith("Ctrl"))) continue;
    if (shortcut.match(ev)) {
      ev.preventDefault();
      shortcut.run(ev);
      return;
    }
  }
}

// --- rendering: one function per region --------------------------------------------------------

function renderWho() {
  const who = $("who");
  fill(who);
  if (!state.me) return;
  who.append(
    h("span", {}, `Signed in as ${state.me.subject} (${state.me.role})`),
    h("button", { type: "button", on: { click: () => toggleHelp() } }, "Shortcuts (?)"),
    h("button", { type: "button", on: { click: () => signOut() } }, "Sign out"),
  );
}

function renderBanner() {
  const banner = $("banner");
  banner.hidden = !state.banner;
  banner.textContent = state.banner || "";
}

function renderNotice() {
  const notice = $("notice");
  notice.textContent = state.notice ? state.notice.text : "";
  notice.className = state.notice?.error ? "notice error" : "notice";
}

function renderSignIn() {
  const main = $("main");
  const token = h("input", { id: "token", type: "password", autocomplete: "off", required: true });
  const form = h(
    "form",
    {
      on: {
        submit: (ev) => {
          ev.preventDefault();
          signIn(token.value.trim());
        },
      },
    },
    h("label", { for: "token" }, "Token"),
    h("div", { class: "row" }, token, h("button", { type: "submit", class: "primary" }, "Sign in")),
    state.signInError ? h("p", { class: "error", role: "alert" }, state.signInError) : null,
    h("p", { class: "muted" }, "Paste the token you were given (make run prints one). It is exchanged for a session and not kept by this page."),
  );
  fill(main, h("section", { "aria-label": "Sign in" }, h("h2", {}, "Sign in"), form));
  token.focus();
}

function renderDeskSkeleton() {
  // Controls are made once, so a note being typed survives every later render of the item.
  const resolution = h("select", { id: "resolution" }, codeOptions());
  const note = h("textarea", { id: "note", maxlength: 4000 });
  const reason = h("input", { id: "release-reason", maxlength: 500, placeholder: "e.g. needs the FX desk" });
  // A reviewer who handles one ledger entity leases only its items (POST /leases {ledger_entity}),
  // from the next lease call on (a wait for work in flight ends within max_wait_s).
  const entity = h("input", { id: "entity", maxlength: 200, placeholder: "any" });
  const current = h(
    "section",
    { "aria-label": "Current item", id: "current" },
    h("h2", {}, "Current item"),
    h("div", { id: "item" }),
    h(
      "div",
      { class: "row", id: "actions" },
      // Not wrapped in its label: the options' text ("note required") would become part of it.
      h("div", { class: "field" }, h("label", { for: "resolution" }, "Resolution"), resolution),
      h("label", { for: "note" }, "Note", note),
    ),
    h(
      "div",
      { class: "row" },
      h("button", { type: "button", class: "primary", id: "resolve", on: { click: () => resolveAndNext() } }, "Resolve"),
      h("label", { for: "release-reason" }, "Release reason", reason),
      h("button", { type: "button", id: "release", on: { click: () => releaseCurrent() } }, "Release"),
      h("button", { type: "button", id: "next", on: { click: () => nextItem() } }, "Next item"),
      h("label", { for: "entity" }, "Only ledger entity", entity),
    ),
  );
  const queue = h("section", { "aria-label": "Queue", id: "queue", "aria-live": "polite" });
  const sections = [current, queue];
  if (APPROVER_ROLES.includes(state.me.role)) {
    sections.push(h("section", { "aria-label": "Approvals", id: "approvals" }));
  }
  if (state.me.role === "admin") sections.push(h("section", { "aria-label": "Admin", id: "admin" }));
  // --- Reports view: its section ---
  if (REPORT_ROLES.includes(state.me.role)) sections.push(h("section", { "aria-label": "Reports", id: "reports" }));
  $("main").replaceChildren(...sections);
}

function field(label, value, attrs = {}) {
  return [h("dt", {}, label), h("dd", attrs, value)];
}

function eventLine(e) {
  const d = e.details || {};
  const extra = [];
  if (d.resolution) extra.push(`resolution ${d.resolution}`);
  if (d.note) extra.push(`note “${d.note}”`);
  if (d.reason) extra.push(`reason “${d.reason}”`);
  if (d.cause) extra.push(`${d.cause}, was ${d.previous_holder}`);
  if (d.previous && d.current) extra.push(`figures ${d.previous.variance_amount} → ${d.current.variance_amount}`);
  if (d.decertified) extra.push(`decision ${d.previous_resolution} by ${d.previous_resolved_by} decertified`);
  if (d.override) extra.push(`lease of ${d.previous_holder} released`);
  if (e.event === "REASSIGNED") extra.push(`${d.previous_holder} → ${d.leased_by}`);
  const when = new Date(e.at).toLocaleString();
  return h("li", {}, `${when} · ${e.event} by ${e.actor}${extra.length ? " · " + extra.join(", ") : ""}`);
}

function itemFields(item) {
  return h(
    "dl",
    { class: "fields" },
    field("Ledger entity", item.ledger_entity),
    field("Variance amount", h("span", { class: "amount", "data-testid": "amount" }, item.variance_amount)),
    field("Match decision", item.match_decision),
    field("Source hash", item.source_hash, { class: "mono" }),
    field("Trace id", item.trace_id, { class: "mono" }),
    field("Idempotency key", item.idempotency_key, { class: "mono" }),
    field("State", item.state),
    dueField(item.due_at),
    field("Waited", since(item.created_at)),
    field("Attempts", String(item.attempts)),
  );
}

// The matcher's `context` (account, counterparty, value dates, document links) as text. Only an
// http(s) URL becomes a link, so a `javascript:` value stays inert text.
function contextValue(value) {
  if (typeof value === "string" && /^https?:\/\//i.test(value)) {
    return h("a", { href: value, target: "_blank", rel: "noopener noreferrer" }, value);
  }
  return typeof value === "string" ? value : JSON.stringify(value);
}

function contextFields(context) {
  // JSONB keeps no key order, so sort them for a stable page.
  const entries = Object.entries(context || {}).sort(([a], [b]) => a.localeCompare(b));
  if (entries.length === 0) return null;
  return [
    h("h3", {}, "Context"),
    h("dl", { class: "fields", "aria-label": "Context" }, entries.flatMap(([k, v]) => field(k, contextValue(v)))),
  ];
}

// One option per active code, in the catalogue's order, saying what the code asks for. None is
// chosen for you: a decision is an explicit choice, never a default left in place.
function codeOptions() {
  const none = h("option", { value: "" }, state.codes.length ? "Choose a resolution (1 … 9)" : "Loading the resolution codes…");
  return [none, ...state.codes.map((c, i) => {
    const needs = [];
    if (c.requires_note) needs.push("note required");
    if (c.approval_threshold !== null) needs.push(`approver from ${c.approval_threshold}`);
    const text = `${i < 9 ? `${i + 1}. ` : ""}${c.label} (${c.code})${needs.length ? `: ${needs.join(", ")}` : ""}`;
    return h("option", { value: c.code, title: c.description }, text);
  })];
}

async function loadCodes() {
  try {
    state.codes = (await withRetry(() => api.resolutions())).resolutions;
  } catch (error) {
    handle(error);
    return;
  }
  const select = $("resolution");
  if (select) fill(select, codeOptions());
}

function renderCurrent() {
  const box = $("item");
  if (!box) return;
  const item = state.held[0];
  for (const id of ["resolve", "release", "resolution", "note", "release-reason"]) $(id).disabled = !item;
  $("next").disabled = Boolean(item) || state.waiting;
  if (!item) {
    fill(box, h("p", { class: "muted" }, state.paused || "No item open. Press Next item (n) to lease one."));
    return;
  }
  fill(
    box,
    state.changed ? changedFigures(state.changed) : null,
    itemFields(item),
    contextFields(item.context),
    h("p", {}, "Lease: ", h("span", { id: "countdown", class: "countdown", role: "timer" }, "")),
    state.held.length > 1 ? h("p", { class: "muted" }, `You hold ${state.held.length} items; this is the first of them.`) : null,
    h("h3", {}, "Event history"),
    h("ol", { class: "events", "aria-label": "Event history" }, state.events.map(eventLine)),
  );
  renderCountdown();
}

// What changed, old and new side by side: the reviewer decides again on the new figures.
function changedFigures({ before, after }) {
  const rows = [
    ["Variance amount", before.variance_amount, after.variance_amount],
    ["Match decision", before.match_decision, after.match_decision],
    ["Source hash", before.source_hash, after.source_hash],
  ];
  return h(
    "div",
    { role: "alert", "aria-label": "Figures changed", class: "changed" },
    h("p", {}, "The figures changed while you were reviewing. Check the new values, then decide again."),
    h(
      "table",
      { "aria-label": "Changed figures" },
      h("tr", {}, h("th", {}, ""), h("th", {}, "Before"), h("th", {}, "Now")),
      rows.map(([label, was, now]) =>
        h("tr", { class: was === now ? "" : "diff" }, h("th", {}, label), h("td", {}, was), h("td", {}, now)),
      ),
    ),
  );
}

function renderCountdown() {
  const el = $("countdown");
  if (!el) return;
  const left = (state.leaseEndsAt - performance.now()) / 1000;
  el.textContent = left > 0 ? `${duration(left)} left` : "expired";
  el.classList.toggle("low", left < 10);
}

function renderQueue() {
  const box = $("queue");
  if (!box) return;
  const lines = [];
  if (!state.held.length && state.queue) {
    const q = state.queue;
    const pending = q.counts.PENDING ?? 0;
    const others = Object.entries(q.open_leases_by_reviewer)
      .filter(([who]) => who !== state.me.subject)
      .reduce((sum, [, n]) => sum + n, 0);
    let text = pending ? `${pending} items are pending.` : "Nothing pending.";
    text += ` ${others} ${others === 1 ? "item is" : "items are"} with other reviewers`;
    if (q.next_lease_expires_in_s !== null && others) {
      text += q.next_lease_expires_in_s > 0
        ? `; the next lease expires in ${duration(q.next_lease_expires_in_s)}.`
        : "; a lease has expired and will return to the queue when it is reclaimed.";
    } else text += ".";
    lines.push(h("p", {}, text));
  }
  if (state.waiting) lines.push(h("p", {}, "Waiting for work… it will appear here as soon as it arrives."));
  fill(box, h("h2", {}, "Queue"), ...lines);
}

// Four eyes: an approver leases someone else's proposal, reads it, and approves or rejects it.
function renderApprovals() {
  const box = $("approvals");
  if (!box) return;
  const item = state.approval.item;
  const parts = [h("h2", {}, "Approvals")];
  if (state.approval.message) parts.push(h("p", {}, state.approval.message));
  if (!item) {
    parts.push(
      h("button", { type: "button", on: { click: () => leaseApproval() } }, "Lease a proposal"),
    );
    fill(box, parts);
    return;
  }
  const reason = h("input", { id: "reject-reason", maxlength: 500, placeholder: "e.g. posted to the wrong entity" });
  parts.push(
    itemFields(item),
    h(
      "dl",
      { class: "fields", "aria-label": "Proposal" },
      field("Prepared by", item.prepared_by),
      field("Proposed resolution", item.proposed_resolution),
      field("Proposed note", item.proposed_note ?? ""),
    ),
    h(
      "div",
      { class: "row" },
      h("button", { type: "button", class: "primary", on: { click: () => decide(true) } }, "Approve"),
      h("label", { for: "reject-reason" }, "Reject reason", reason),
      h("button", { type: "button", on: { click: () => decide(false) } }, "Reject"),
    ),
  );
  fill(box, parts);
}

// Inputs made once and reused by every render of their region, so that what is being typed survives
// a refresh of the numbers around it.
const keptInputs = {};
function kept(id, attrs) {
  keptInputs[id] ??= h("input", { id, ...attrs });
  return keptInputs[id];
}

function renderAdmin() {
  const box = $("admin");
  if (!box) return;
  const s = state.admin.stats;
  const parts = [h("h2", {}, "Admin")];
  if (s) {
    parts.push(
      h(
        "table",
        { "aria-label": "Items by state" },
        h("tr", {}, h("th", {}, "State"), h("th", {}, "Items")),
        Object.entries(s.counts).map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", { class: "num" }, String(v)))),
      ),
      h("p", {}, `Oldest pending: ${s.oldest_pending_age_s === null ? "none" : duration(s.oldest_pending_age_s)}`),
      h("p", {}, `Expired leases not yet reclaimed: ${s.expired_unreclaimed} (reclaimable now: ${s.reclaimable})`),
      h(
        "p",
        { class: s.overdue ? "overdue" : null },
        `Overdue: ${s.overdue}` +
          (s.oldest_overdue_s === null ? "" : ` (the most overdue by ${duration(s.oldest_overdue_s)})`),
      ),
      h(
        "table",
        { "aria-label": "Open items by age" },
        h("tr", {}, h("th", {}, "Age"), h("th", {}, "Open items")),
        Object.entries(s.aging).map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", { class: "num" }, String(v)))),
      ),
      h(
        "table",
        { "aria-label": "Overdue items per ledger entity" },
        h("tr", {}, h("th", {}, "Ledger entity"), h("th", {}, "Overdue")),
        Object.entries(s.overdue_by_ledger_entity).map(([k, v]) =>
          h("tr", {}, h("td", {}, k), h("td", { class: "num" }, String(v))),
        ),
      ),
      h(
        "table",
        { "aria-label": "Open leases per reviewer" },
        h("tr", {}, h("th", {}, "Reviewer"), h("th", {}, "Open leases")),
        Object.entries(s.open_leases_by_reviewer).map(([k, v]) =>
          h("tr", {}, h("td", {}, k), h("td", { class: "num" }, String(v))),
        ),
      ),
    );
  }
  const lookup = kept("lookup", { maxlength: 200 }); // typed text survives a re-render of this panel
  parts.push(
    h(
      "div",
      { class: "row" },
      h("button", { type: "button", on: { click: () => reclaimNow() } }, "Reclaim now"),
      h("button", { type: "button", on: { click: () => loadAdmin() } }, "Refresh"),
    ),
    state.admin.message ? h("p", { role: "status" }, state.admin.message) : null,
    h(
      "form",
      {
        class: "row",
        on: {
          submit: (ev) => {
            ev.preventDefault();
            lookUp(lookup.value.trim());
          },
        },
      },
      h("label", { for: "lookup" }, "Item id or idempotency key", lookup),
      h("button", { type: "submit" }, "Look up"),
    ),
  );
  // The override: someone went on leave holding work. One reason field for every override.
  const reason = kept("override-reason", { maxlength: 500, placeholder: "e.g. on leave until the 14th" });
  const reviewer = kept("override-reviewer", { maxlength: 128 });
  parts.push(
    h(
      "form",
      {
        class: "row",
        on: {
          submit: (ev) => {
            ev.preventDefault();
            override("release-reviewer", reviewer.value.trim(), reason.value.trim());
          },
        },
      },
      h("label", { for: "override-reason" }, "Override reason", reason),
      h("label", { for: "override-reviewer" }, "Reviewer", reviewer),
      h("button", { type: "submit" }, "Release their items"),
    ),
  );
  const found = state.admin.found;
  if (found && found.state === "ASSIGNED") {
    const to = kept("reassign-to", { maxlength: 128 });
    parts.push(
      h(
        "div",
        { class: "row" },
        h("label", { for: "reassign-to" }, "Reassign to", to),
        h("button", { type: "button", on: { click: () => override("reassign", to.value.trim(), reason.value.trim()) } }, "Reassign"),
        h("button", { type: "button", on: { click: () => override("release-item", null, reason.value.trim()) } }, "Release item"),
      ),
    );
  }
  if (state.admin.found) {
    parts.push(
      h(
        "div",
        { "aria-label": "Looked-up item", role: "region" },
        itemFields(state.admin.found),
        h("h3", {}, "Audit trail"),
        h("ol", { class: "events", "aria-label": "Audit trail" }, state.admin.foundEvents.map(eventLine)),
      ),
    );
  }
  fill(box, ...parts);
}

function renderHelp() {
  const dialog = $("help");
  fill(
    dialog,
    h("h2", {}, "Keyboard shortcuts"),
    h(
      "table",
      {},
      SHORTCUTS.map((s) => h("tr", {}, h("td", {}, h("kbd", {}, s.keys)), h("td", {}, s.label))),
    ),
    h("p", { class: "muted" }, "Single keys work when you are not typing in a field."),
    h("button", { type: "button", on: { click: () => toggleHelp(false) } }, "Close"),
  );
  if (state.helpOpen && !dialog.open) dialog.showModal();
  if (!state.helpOpen && dialog.open) dialog.close();
}

function render() {
  renderWho();
  renderBanner();
  renderNotice();
  if (!state.me) return renderSignIn();
  if (!$("current")) renderDeskSkeleton();
  renderCurrent();
  renderQueue();
  renderApprovals();
  renderAdmin();
}

// --- talking to the service: retries, sign-out on 401 -------------------------------------------

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

function say(text, error = false) {
  state.notice = text ? { text, error } : null;
  renderNotice();
}

// Runs a call; while the database is away it shows the banner and tries again, forever, with a
// growing pause (1 s .. 5 s). Any other error is the caller's to handle.
async function withRetry(fn) {
  for (let attempt = 0; ; attempt++) {
    try {
      const result = await fn();
      if (state.banner) {
        state.banner = null;
        renderBanner();
      }
      return result;
    } catch (error) {
      if (!(error instanceof ApiError) || !error.retryable) throw error;
      state.banner = error.message;
      renderBanner();
      await sleep(Math.min(5000, 1000 * (attempt + 1)));
    }
  }
}

function handle(error) {
  if (error?.name === "AbortError") return;
  if (error instanceof ApiError && error.status === 401) {
    endSession("Your session has ended. Sign in again.");
    return;
  }
  say(error instanceof ApiError ? error.message : "Something went wrong. Please reload the page.", true);
  if (!(error instanceof ApiError)) console.error(error);
}

function endSession(message) {
  stopWaiting();
  Object.assign(state, {
    me: null, held: [], events: [], queue: null, signInError: message, paused: null, changed: null,
  });
  state.admin = { stats: null, message: null, found: null, foundEvents: [] };
  useCsrfToken(null);
  render();
}

// --- what a reviewer does ------------------------------------------------------------------------

async function signIn(token) {
  if (!token) return;
  try {
    const me = await withRetry(() => api.signIn(token));
    startDesk(me);
  } catch (error) {
    state.signInError = error instanceof ApiError && error.status === 401 ? "That token is unknown or revoked." : error.message;
    renderSignIn();
  }
}

async function signOut() {
  stopWaiting();
  try {
    await withRetry(() => api.signOut());
  } catch (error) {
    handle(error);
    return;
  }
  endSession(null);
  say("Signed out.");
}

function startDesk(me) {
  state.me = me;
  state.signInError = null;
  useCsrfToken(me.csrf_token);
  touch();
  render();
  if (REVIEWER_ROLES.includes(me.role)) loadCodes().then(renderCurrent);
  state.resumed = resume();
  if (APPROVER_ROLES.includes(me.role)) loadApprovals();
  if (me.role === "admin") loadAdmin();
  // --- Reports view: mounted once per sign-in, into its section ---
  if (REPORT_ROLES.includes(me.role)) mountReports($("reports"), api);
}

// After sign-in or a reload: carry on with the items this reviewer already holds.
async function resume() {
  if (!REVIEWER_ROLES.includes(state.me.role)) {
    say(`You are signed in as ${state.me.role}; reviewing needs the reviewer, approver or admin role.`, true);
    return;
  }
  try {
    const page = await withRetry(() => api.mine());
    state.held = page.items;
    if (state.held.length) {
      say(`Welcome back: you hold ${state.held.length} ${state.held.length === 1 ? "item" : "items"}.`);
      await showCurrent(true);
    } else {
      await explainQueue();
    }
  } catch (error) {
    handle(error);
  }
}

async function showCurrent(renewNow) {
  const item = state.held[0];
  if (state.changed && state.changed.after.id !== item?.id) state.changed = null;
  if (!item) {
    render();
    return;
  }
  state.leaseEndsAt = performance.now() + (Date.parse(item.lease_expires_at) - Date.parse(item.leased_at)) * 1;
  state.lastRenewAt = performance.now();
  if (renewNow) await renew(); // a reloaded page does not know how much lease is left: refresh it
  try {
    state.events = (await withRetry(() => api.events(item.id))).events;
  } catch (error) {
    state.events = [];
    handle(error);
  }
  render();
}

async function nextItem() {
  if (!state.me || state.waiting) return;
  touch();
  state.paused = null;
  // A lease sent before sign-in's look at the held items has answered would be found by that
  // look, welcomed back as an old item and renewed: wait for it.
  await state.resumed;
  if (state.held.length) return showCurrent(false);
  try {
    const got = await withRetry(() => api.lease(0, undefined, entityFilter()));
    if (got.items.length) return takeItem(got.items[0]);
    await explainQueue();
    waitForWork();
  } catch (error) {
    handle(error);
  }
}

function entityFilter() {
  return $("entity")?.value.trim() || null;
}

async function takeItem(item) {
  state.held = [item];
  state.changed = null;
  state.queue = null;
  $("note").value = "";
  $("resolution").value = "";
  $("release-reason").value = "";
  await showCurrent(false);
  $("resolution").focus();
}

async function explainQueue() {
  try {
    state.queue = await withRetry(() => api.stats());
  } catch (error) {
    handle(error);
  }
  render();
}

// Long poll: the server answers as soon as an item can be leased (or after max_wait_s).
async function waitForWork() {
  if (state.waiting) return;
  state.waiting = true;
  waitAbort = new AbortController();
  const { signal } = waitAbort;
  render();
  try {
    while (!signal.aborted) {
      if (idleFor() >= state.me.idle_release_s * 1000) {
        state.paused = "Stopped waiting for work while you were away. Press Next item (n) to carry on.";
        break;
      }
      const got = await withRetry(() => api.lease(state.me.max_wait_s, signal, entityFilter()));
      if (got.items.length) {
        stopWaiting();
        say("New work arrived.");
        await takeItem(got.items[0]);
        return;
      }
      state.queue = await withRetry(() => api.stats());
      renderQueue();
    }
  } catch (error) {
    handle(error);
  }
  stopWaiting();
  render();
}

function stopWaiting() {
  state.waiting = false;
  if (waitAbort) waitAbort.abort();
  waitAbort = null;
}

function chooseResolution(index) {
  if (!state.held.length || index >= state.codes.length) return;
  $("resolution").value = state.codes[index].code;
  touch();
}

async function resolveAndNext() {
  const item = state.held[0];
  if (!item) return;
  touch();
  const resolution = $("resolution").value;
  const note = $("note").value.trim();
  if (!resolution) {
    say("Choose a resolution first (1 … 9, or the Resolution list).", true);
    $("resolution").focus();
    return;
  }
  try {
    const done = await withRetry(() => api.complete(item, resolution, note || null));
    if (done.outcome === "submitted_for_approval" || done.outcome === "already_submitted") {
      say(`Submitted ${done.item.ledger_entity} ${done.item.variance_amount} as ${resolution} for approval (at or above its threshold).`);
    } else {
      say(`Resolved ${done.item.ledger_entity} ${done.item.variance_amount} as ${resolution}.`);
    }
    $("note").value = "";
    $("resolution").value = "";
    state.changed = null;
    state.held.shift();
    state.events = [];
    if (state.held.length) await showCurrent(false);
    else await nextItem();
  } catch (error) {
    if (await figuresChanged(error) || (await lostLease(error))) return;
    handle(error);
  }
}

async function releaseCurrent(reason) {
  const item = state.held[0];
  if (!item) return;
  touch();
  const why = reason || $("release-reason").value.trim() || "skipped";
  try {
    await withRetry(() => api.release(item, why));
    state.changed = null;
    state.held.shift();
    state.events = [];
    $("release-reason").value = "";
    say(`Released ${item.ledger_entity} back to the queue (${why}). Press Next item (n) to go on.`);
    if (state.held.length) await showCurrent(false);
    else render();
  } catch (error) {
    if (await figuresChanged(error) || (await lostLease(error))) return;
    handle(error);
  }
}

// A source revision moved the lease on: the answer carries the item as it is now, with the new
// lease token. Show old and new figures; the reviewer decides again (nothing was resolved).
async function figuresChanged(error) {
  if (!(error instanceof ApiError && error.code === "SOURCE_CHANGED" && error.problem?.item)) return false;
  const before = state.held[0];
  const after = error.problem.item;
  if (!before || before.id !== after.id) return false;
  state.changed = { before: state.changed?.before ?? before, after };
  state.held[0] = after;
  say(error.message, true);
  try {
    state.events = (await withRetry(() => api.events(after.id))).events;
  } catch (failure) {
    handle(failure);
  }
  render();
  return true;
}

// A stale tab: the lease was reclaimed and leased again (maybe to this very reviewer elsewhere).
async function lostLease(error) {
  if (!(error instanceof ApiError && error.code === "LEASE_NOT_HELD")) return false;
  say(error.message, true);
  state.held.shift();
  state.events = [];
  if (state.held.length) await showCurrent(false);
  else render();
  return true;
}

async function renew() {
  const item = state.held[0];
  if (!item) return;
  state.lastRenewAt = performance.now();
  try {
    const fresh = await withRetry(() => api.renew(item));
    if (state.held[0]?.id !== item.id) return;
    state.held[0] = fresh;
    state.leaseEndsAt = performance.now() + state.me.lease_s * 1000;
    renderCountdown();
  } catch (error) {
    if (await figuresChanged(error) || (await lostLease(error))) return;
    handle(error);
  }
}

// --- heartbeat and idle release ----------------------------------------------------------------

function touch() {
  state.lastActivity = performance.now();
}

const idleFor = () => performance.now() - state.lastActivity;

let ticking = false;

async function tick() {
  if (!state.me || ticking) return;
  ticking = true;
  try {
    await heartbeat();
  } finally {
    ticking = false;
  }
}

async function heartbeat() {
  renderCountdown();
  if (!state.held.length) return;
  if (idleFor() >= state.me.idle_release_s * 1000) {
    const minutes = duration(state.me.idle_release_s);
    const items = [...state.held];
    for (const item of items) {
      try {
        await withRetry(() => api.release(item, "idle"));
      } catch (error) {
        if (error instanceof ApiError && error.code === "SOURCE_CHANGED" && error.problem?.item) {
          await withRetry(() => api.release(error.problem.item, "idle")).catch(handle);
        } else if (!(error instanceof ApiError && error.code === "LEASE_NOT_HELD")) handle(error);
      }
    }
    state.held = [];
    state.events = [];
    state.changed = null;
    state.paused = `Released your ${items.length === 1 ? "item" : "items"} after ${minutes} without activity. Press Next item (n) to carry on.`;
    say(state.paused);
    render();
    return;
  }
  // Renew every third of the lease while the reviewer is active: one lost heartbeat never costs it.
  if (performance.now() - state.lastRenewAt >= (state.me.lease_s * 1000) / 3) await renew();
}

function toggleHelp(open = !state.helpOpen) {
  state.helpOpen = open;
  renderHelp();
}

async function lookUp(query) {
  if (!query) return;
  touch();
  const isId = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(query);
  try {
    const item = isId ? await withRetry(() => api.item(query)) : (await withRetry(() => api.byKey(query))).items[0];
    if (!item) {
      state.admin = { ...state.admin, found: null, foundEvents: [], message: `No item with id or key “${query}”.` };
    } else {
      const events = (await withRetry(() => api.events(item.id))).events;
      state.admin = { ...state.admin, found: item, foundEvents: events, message: null };
    }
  } catch (error) {
    state.admin = { ...state.admin, found: null, foundEvents: [], message: error.message };
  }
  renderAdmin();
}

async function loadApprovals() {
  try {
    const page = await withRetry(() => api.myApprovals());
    state.approval.item = page.items[0] ?? null;
  } catch (error) {
    handle(error);
  }
  renderApprovals();
}

async function leaseApproval() {
  touch();
  try {
    const leased = await withRetry(() => api.leaseApproval());
    state.approval.item = leased.items[0] ?? null;
    state.approval.message = state.approval.item ? null : "No proposal is waiting for you.";
  } catch (error) {
    state.approval.message = error.message;
  }
  renderApprovals();
}

async function decide(approve) {
  const item = state.approval.item;
  if (!item) return;
  touch();
  const reason = $("reject-reason")?.value.trim();
  if (!approve && !reason) {
    state.approval.message = "Please give a reason to reject.";
    renderApprovals();
    return;
  }
  try {
    if (approve) {
      const done = await withRetry(() => api.approve(item));
      state.approval.message = `Approved ${item.ledger_entity} ${item.variance_amount}: resolved as ${done.item.resolution} by ${done.item.resolved_by}.`;
    } else {
      await withRetry(() => api.reject(item, reason));
      state.approval.message = `Rejected ${item.ledger_entity} ${item.variance_amount}: back in the queue (${reason}).`;
    }
    state.approval.item = null;
  } catch (error) {
    state.approval.message = error.message;
    if (error instanceof ApiError && ["LEASE_NOT_HELD", "SEGREGATION_OF_DUTIES"].includes(error.code)) {
      state.approval.item = null;
    }
  }
  renderApprovals();
}

async function loadAdmin() {
  if (state.me?.role !== "admin") return;
  try {
    state.admin.stats = await withRetry(() => api.stats());
  } catch (error) {
    handle(error);
  }
  renderAdmin();
}

async function override(kind, who, reason) {
  touch();
  if (!reason) {
    state.admin.message = "Give a reason: it goes into the audit trail.";
    renderAdmin();
    return;
  }
  const item = state.admin.found;
  try {
    if (kind === "release-reviewer") {
      if (!who) return;
      const result = await withRetry(() => api.adminReleaseReviewer(who, reason));
      state.admin.message = `Released ${result.released} ${result.released === 1 ? "item" : "items"} of ${who}.`;
    } else if (kind === "reassign") {
      if (!who || !item) return;
      await withRetry(() => api.reassign(item.id, who, reason));
      state.admin.message = `Reassigned the item to ${who}.`;
    } else if (item) {
      await withRetry(() => api.adminRelease(item.id, reason));
      state.admin.message = "Released the item back to the queue.";
    }
  } catch (error) {
    state.admin.message = error.message;
  }
  if (item) {
    const message = state.admin.message;
    await lookUp(item.id);
    state.admin.message = message;
  }
  await loadAdmin();
}

async function reclaimNow() {
  touch();
  try {
    const result = await withRetry(() => api.reclaim());
    state.admin.message = `Reclaimed ${result.reclaimed} expired ${result.reclaimed === 1 ? "lease" : "leases"}.`;
  } catch (error) {
    state.admin.message = error.message;
  }
  await loadAdmin();
}

// --- start --------------------------------------------------------------------------------------

async function boot() {
  document.addEventListener("keydown", onKey);
  for (const event of ["keydown", "pointerdown", "input", "wheel"]) {
    document.addEventListener(event, touch, { passive: true });
  }
  $("help").addEventListener("close", () => {
    state.helpOpen = false;
  });
  renderHelp();
  setInterval(tick, 1000);
  try {
    startDesk(await withRetry(() => api.session()));
  } catch (error) {
    state.me = null;
    render();
    if (!(error instanceof ApiError && error.status === 401)) handle(error);
  }
}

boot();
