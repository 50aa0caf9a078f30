// My decisions: what I resolved, submitted for approval, approved or rejected, newest first
// (GET /decisions: the event trail by actor), each with what became of the item since.

import { api } from "./api.js";
import { $, fill, h } from "./dom.js";
import { handle, withRetry } from "./feedback.js";
import { money, when } from "./format.js";
import { state } from "./state.js";

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

function line({ event, item }) {
  const d = event.details || {};
  const outcome = [DONE[event.event], d.resolution ? ` as ${d.resolution}` : "", d.reason ? ` (${d.reason})` : ""].join("");
  return h(
    "tr",
    {},
    h("td", { "data-label": "When" }, when(event.at)),
    h("td", { "data-label": "Decision" }, outcome),
    h("td", { "data-label": "Item" }, `${item.ledger_entity} ${money(item.variance_amount, item.currency)}`),
    h("td", { "data-label": "Now" }, now(item)),
  );
}

export function renderDecisions() {
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
