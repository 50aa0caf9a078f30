// The admin's view: queue statistics, Reclaim now, a look-up with the audit trail, and the override
// (release a reviewer's items, reassign or release one item).

import { api } from "./api.js";
import { $, fill, h, kept } from "./dom.js";
import { handle, withRetry } from "./feedback.js";
import { duration } from "./format.js";
import { history, itemFields } from "./item.js";
import { state, touch } from "./state.js";
import { registerView } from "./views.js";

function countsTable(name, heading, entries) {
  return h(
    "table",
    { "aria-label": name },
    h("tr", {}, h("th", {}, heading[0]), h("th", {}, heading[1])),
    entries.map(([k, v]) => h("tr", {}, h("td", {}, k), h("td", { class: "num" }, String(v)))),
  );
}

function statsParts(s) {
  return [
    countsTable("Items by state", ["State", "Items"], Object.entries(s.counts)),
    h("p", {}, `Oldest pending: ${s.oldest_pending_age_s === null ? "none" : duration(s.oldest_pending_age_s)}`),
    h("p", {}, `Expired leases not yet reclaimed: ${s.expired_unreclaimed} (reclaimable now: ${s.reclaimable})`),
    h(
      "p",
      { class: s.overdue ? "overdue" : null },
      `Overdue: ${s.overdue}` +
        (s.oldest_overdue_s === null ? "" : ` (the most overdue by ${duration(s.oldest_overdue_s)})`),
    ),
    countsTable("Open items by age", ["Age", "Open items"], Object.entries(s.aging)),
    countsTable("Overdue items per ledger entity", ["Ledger entity", "Overdue"], Object.entries(s.overdue_by_ledger_entity)),
    countsTable("Open leases per reviewer", ["Reviewer", "Open leases"], Object.entries(s.open_leases_by_reviewer)),
    countsTable("Open items per currency", ["Currency", "Open items"], Object.entries(s.open_by_currency ?? {})),
    h(
      "p",
      { class: s.open_without_rate ? "overdue" : null },
      `Waiting without an exchange rate (each needs an approver): ${s.open_without_rate ?? 0}` +
        (s.currencies_without_rate?.length ? ` (${s.currencies_without_rate.join(", ")})` : ""),
    ),
  ];
}

function onSubmit(run) {
  return {
    submit: (ev) => {
      ev.preventDefault();
      run();
    },
  };
}

function renderAdmin() {
  const box = $("admin");
  if (!box) return;
  const parts = [
    h("h2", {}, "Admin"),
    h("p", {}, h("a", { href: "/audit/export", download: "audit.ndjson" }, "Download the audit trail (NDJSON)")),
  ];
  if (state.admin.stats) parts.push(...statsParts(state.admin.stats));
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
      { class: "row", on: onSubmit(() => lookUp(lookup.value.trim())) },
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
      { class: "row", on: onSubmit(() => override("release-reviewer", reviewer.value.trim(), reason.value.trim())) },
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
  if (found) {
    parts.push(
      h(
        "div",
        { "aria-label": "Looked-up item", role: "region" },
        itemFields(found),
        history(state.admin.foundEvents, "Audit trail"),
      ),
    );
  }
  fill(box, ...parts);
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

export async function loadAdmin() {
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

registerView({
  id: "admin",
  label: "Admin",
  roles: ["admin"],
  regions: () => [h("section", { "aria-label": "Admin", id: "admin" })],
  render: renderAdmin,
  start: loadAdmin,
  reset() {
    state.admin = { stats: null, message: null, found: null, foundEvents: [] };
  },
});
