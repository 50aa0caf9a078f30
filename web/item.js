// An item, read-only: its figures, the matcher's context and its event history. Shared by every
// view that shows an item (reviewing, approvals, admin's look-up).

import { field, h } from "./dom.js";
import { duration, since } from "./format.js";

// The deadline as local time, and whether it has passed: said in words, not by colour alone.
export function dueField(iso) {
  const late = (Date.now() - Date.parse(iso)) / 1000;
  const when = new Date(iso).toLocaleString();
  if (late <= 0) return field("Due", h("span", { "data-testid": "due" }, `${when} (in ${duration(-late)})`));
  return field(
    "Due",
    h("span", { class: "overdue", "data-testid": "due" }, h("strong", {}, "Overdue"), ` by ${duration(late)} (was due ${when})`),
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
  const when = new Date(e.at).toLocaleString();
  return h("li", {}, `${when} · ${e.event} by ${e.actor}${extra.length ? " · " + extra.join(", ") : ""}`);
}

export function itemFields(item) {
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

export function contextFields(context) {
  // JSONB keeps no key order, so sort them for a stable page.
  const entries = Object.entries(context || {}).sort(([a], [b]) => a.localeCompare(b));
  if (entries.length === 0) return null;
  return [
    h("h3", {}, "Context"),
    h("dl", { class: "fields", "aria-label": "Context" }, entries.flatMap(([k, v]) => field(k, contextValue(v)))),
  ];
}
