// My decisions: what I resolved, submitted for approval, approved or rejected, newest first
// (GET /decisions: the event trail by actor), each with what became of the item since.

import { api } from "./api.js";
import { $, fill, h } from "./dom.js";
import { handle, withRetry } from "./feedback.js";
import { money, when } from "./format.js";
import { state } from "./state.js";
import { shown } from "./views.js";

const DONE = {
  RESOLVED: "Resolved",
  SUBMITTED_FOR_APPROVAL: "Submitted for approval",
  APPROVED: "Approved",
  REJECTED: "Rejected",
};

state.decisions = { rows: [], next: null };

export function decisionRegions() {
  return [h("section", { "aria-label": "My decisions", id: "decisions" })];
}

// What the item is now, in words: a proposal's fate is the point of looking.
function now(item) {
  if (item.state === "RESOLVED") return item.approved_by ? `Resolved, approved by ${item.approved_by}` : "Resolved";
  if (item.state === "AWAITING_APPROVAL") return "Awaiting approval";
  return item.state === "PENDING" ? "Pending" : item.state.charAt(0) + item.state.slice(1).toLowerCase();
}

function line({ event, item, rejection }) {
  const d = event.details || {};
  const outcome = [DONE[event.event], d.resolution ? ` as ${d.resolution}` : "", d.reason ? ` (${d.reason})` : ""].join("");
  return h(
    "tr",
    { class: rejection ? "rejected" : null },
    h("td", { "data-label": "When" }, when(event.at)),
    h(
      "td",
      { "data-label": "Decision" },
      outcome,
      // A proposal an approver sent back: who and why, on its own row.
      rejection ? h("strong", { class: "rejection" }, ` · Rejected by ${rejection.by}: ${rejection.reason}`) : null,
    ),
    h("td", { "data-label": "Item" }, `${item.ledger_entity} ${money(item.variance_amount, item.currency)}`),
    h("td", { "data-label": "Now" }, now(item)),
  );
}

// The user's proposals rejected since they last looked at My decisions in this page: counted in the
// header from every view (the newest page, refreshed in the background). Kept in memory only: the
// desk stores nothing in the browser (docs/desk.md), so after a reload the count starts again.
let seenUpTo = "";

function seen() {
  return seenUpTo;
}

function markSeen() {
  const newest = state.decisions.rows.map((d) => d.rejection?.at ?? "").sort().pop();
  if (newest && newest > seenUpTo) seenUpTo = newest;
}

export function rejectedCount() {
  const after = seen();
  const n = state.decisions.rows.filter((d) => d.rejection && d.rejection.at > after).length;
  const text = n === 1 ? "1 proposal rejected" : `${n} proposals rejected`;
  return h(
    "a",
    { id: "rejected-count", href: "#items", hidden: n === 0, title: "Since you last looked at My decisions" },
    text,
  );
}

function renderCount() {
  const old = $("rejected-count");
  if (old) old.replaceWith(rejectedCount());
}

export function renderDecisions() {
  if (shown("items")) markSeen();
  renderCount();
  const box = $("decisions");
  if (!box) return;
  const { rows, next } = state.decisions;
  fill(
    box,
    h("h2", {}, "My decisions"),
    rows.length
      ? h(
          "table",
          { "aria-label": "My decisions", class: "list" },
          h("thead", {}, h("tr", {}, ["When", "Decision", "Item", "Now"].map((c) => h("th", { scope: "col" }, c)))),
          h("tbody", {}, rows.map(line)),
        )
      : h("p", { class: "muted" }, "Nothing decided yet."),
    next ? h("button", { type: "button", on: { click: () => loadDecisions(true) } }, "Older decisions") : null,
  );
}

export async function loadDecisions(more = false) {
  try {
    const page = await withRetry(() => api.decisions(more ? state.decisions.next : null));
    // A refresh reads the newest page again; "Older decisions" appends the next one.
    state.decisions = { rows: more ? [...state.decisions.rows, ...page.decisions] : page.decisions, next: page.next_cursor };
  } catch (error) {
    handle(error);
  }
  renderDecisions();
}
