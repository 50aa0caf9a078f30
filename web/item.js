// An item, read-only: the amount first, its figures, the matcher's context, the technical details
// (collapsed) and its event history. Shared by every view that shows an item.

import { field, h } from "./dom.js";
import { currency, duration, money, since, when } from "./format.js";

// The deadline in UTC, and whether it has passed: said in words, not by colour alone.
export function dueField(iso) {
  const late = (Date.now() - Date.parse(iso)) / 1000;
  if (late <= 0) return field("Due", h("span", { "data-testid": "due" }, `${when(iso)} (in ${duration(-late)})`));
  return field(
    "Due",
    h("span", { class: "overdue", "data-testid": "due" }, h("strong", {}, "Overdue"), ` by ${duration(late)} (was due ${when(iso)})`),
  );
}

export function eventLine(e) {
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
  if (e.event === "COMMENTED") extra.push(`“${d.text}”`);
  return h("li", {}, `${when(e.at)} · ${e.event} by ${e.actor}${extra.length ? " · " + extra.join(", ") : ""}`);
}

export function history(events, label = "Event history") {
  return [h("h3", {}, label), h("ol", { class: "events", "aria-label": label }, events.map(eventLine))];
}

// The figure the eye finds first: grouped digits, the sign, and the item's currency (an older
// server's item has none: then the one the matcher's context names, if any).
export function amountFigure(item) {
  const code = item.currency || currency(item.context);
  return h(
    "p",
    { class: "figure" },
    h("span", { class: "figure-label" }, "Variance amount"),
    h("span", { class: "amount", "data-testid": "amount" }, money(item.variance_amount, item.currency)),
    code ? h("span", { class: "currency", "data-testid": "currency" }, code) : null,
  );
}

export function itemFields(item) {
  return [
    amountFigure(item),
    h(
      "dl",
      { class: "fields" },
      field("Ledger entity", item.ledger_entity),
      field("Match decision", item.match_decision),
      field("State", item.state),
      dueField(item.due_at),
      field("Waited", since(item.created_at)),
      field("Attempts", String(item.attempts)),
    ),
    // Identifiers nobody decides on: there when needed, out of the way otherwise.
    h(
      "details",
      { class: "technical" },
      h("summary", {}, "Technical details"),
      h(
        "dl",
        { class: "fields" },
        field("Item id", item.id, { class: "mono" }),
        field("Source hash", item.source_hash, { class: "mono" }),
        field("Trace id", item.trace_id, { class: "mono" }),
        field("Idempotency key", item.idempotency_key, { class: "mono" }),
      ),
    ),
  ];
}

// The matcher's `context` (account, counterparty, value dates, document links) as text. Only an
// http(s) URL becomes a link, so a `javascript:` value stays inert text.
function contextValue(value) {
  if (typeof value === "string" && /^https?:\/\//i.test(value)) {
    return h("a", { href: value, target: "_blank", rel: "noopener noreferrer" }, value);
  }
  return typeof value === "string" ? value : JSON.stringify(value);
}

export function contextFields(context) {
  // JSONB keeps no key order, so sort them for a stable page.
  const entries = Object.entries(context || {}).sort(([a], [b]) => a.localeCompare(b));
  if (entries.length === 0) return null;
  return [
    h("h3", {}, "Context"),
    h("dl", { class: "fields", "aria-label": "Context" }, entries.flatMap(([k, v]) => field(k, contextValue(v)))),
  ];
}

const DECISIONS = ["RESOLVED", "SUBMITTED_FOR_APPROVAL", "APPROVED", "REJECTED", "REOPENED"];

// A proposal rejected by an approver comes back with the approver's reason, not only as a line of
// the history: the last decision in the trail is the rejection.
export function rejection(events) {
  const last = [...events].reverse().find((e) => DECISIONS.includes(e.event));
  if (!last || last.event !== "REJECTED") return null;
  const d = last.details || {};
  return h(
    "div",
    { role: "alert", "aria-label": "Proposal rejected", class: "rejected" },
    h("p", {}, h("strong", {}, `Rejected by ${last.actor}: ${d.reason ?? ""}`)),
    h("p", { class: "muted" }, `The proposal was ${d.resolution} by ${d.prepared_by}${d.note ? `: “${d.note}”` : ""}.`),
  );
}

// What changed, old and new side by side: the reviewer decides again on the new figures.
export function changedFigures({ before, after }) {
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
