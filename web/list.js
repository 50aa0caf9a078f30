// The work list: every item by state (tabs with counts), filtered and searched, a page at a time
// with the API's cursor, earliest due first; an item opened read-only (and leased from there);
// several held items resolved at once. It refreshes by itself while it is shown.

import { api, describe } from "./api.js";
import { $, fill, h, kept } from "./dom.js";
import { handle, withRetry } from "./feedback.js";
import { money, when } from "./format.js";
import { contextFields, history, itemFields } from "./item.js";
import { decisionRegions, loadDecisions, renderDecisions } from "./decisions.js";
import { takeLeased, syncHeld } from "./review.js";
import { REVIEWER_ROLES, state, touch } from "./state.js";
import { go, registerView, shown } from "./views.js";

const PAGE = 25;
const REFRESH_MS = 15_000;
const TABS = [
  ["PENDING", "Pending"],
  ["ASSIGNED", "Assigned"],
  ["AWAITING_APPROVAL", "Awaiting approval"],
  ["QUARANTINED", "Quarantined"],
  ["RESOLVED", "Resolved"],
  ["ALL", "All"],
];

const fresh = () => ({
  tab: "PENDING",
  counts: null,
  page: null, // {items, next_cursor}
  cursors: [null], // the cursor of each page so far; the last is the page shown
  selected: new Set(), // ids of held items chosen for a bulk resolve
  detail: null, // {item, events}
  message: null,
  bulk: null, // [{item, outcome}] of the last bulk resolve
});
state.list = fresh();

const reviewer = () => REVIEWER_ROLES.includes(state.me?.role);

// --- controls, made once so that typing survives every refresh ------------------------------------

function filterControls() {
  return {
    entity: kept("filter-entity", { maxlength: 200 }),
    overdue: kept("filter-overdue", { type: "checkbox" }),
    currency: kept("filter-currency", { maxlength: 3, placeholder: "any", autocapitalize: "characters", spellcheck: "false" }),
    min: kept("filter-min", { maxlength: 20, inputmode: "decimal", placeholder: "0.00" }),
    max: kept("filter-max", { maxlength: 20, inputmode: "decimal", placeholder: "any" }),
    // GET /items?q=: the start of an id, a key, an entity or any value in the context, in any case.
    search: kept("filter-search", { type: "search", maxlength: 200, placeholder: "id, key, entity, invoice no." }),
    sort: kept("filter-sort", {}, "select"),
  };
}

function regions() {
  const c = filterControls();
  if (!c.sort.options.length) c.sort.append(h("option", { value: "due_at" }, "Due date"), h("option", { value: "created_at" }, "Enqueued"));
  c.overdue.addEventListener("change", () => firstPage());
  c.sort.addEventListener("change", () => firstPage());
  const filters = h(
    "form",
    { class: "row filters", "aria-label": "Filters", on: { submit: (ev) => (ev.preventDefault(), firstPage()) } },
    h("label", { for: "filter-search" }, "Search", c.search),
    h("label", { for: "filter-entity" }, "Ledger entity", c.entity),
    h("label", { for: "filter-currency" }, "Currency", c.currency),
    h("label", { for: "filter-min" }, "Minimum amount", c.min),
    h("label", { for: "filter-max" }, "Maximum amount", c.max),
    h("label", { for: "filter-sort" }, "Sort by", c.sort),
    h("label", { for: "filter-overdue", class: "check" }, c.overdue, "Overdue only"),
    h("button", { type: "submit" }, "Apply filters"),
    h("button", { type: "button", on: { click: () => clearFilters() } }, "Clear filters"),
  );
  return [
    h(
      "section",
      { "aria-label": "Items", id: "items" },
      h("h2", {}, "Items"),
      h("div", { id: "items-audit" }),
      h("div", { role: "tablist", "aria-label": "State", id: "items-tabs", on: { keydown: tabKeys } }),
      filters,
      h("div", { role: "tabpanel", id: "items-panel", "aria-labelledby": "tab-PENDING" }),
    ),
    h("section", { "aria-label": "Item details", id: "item-details", hidden: true }),
    ...(reviewer() ? decisionRegions() : []),
  ];
}

// --- rendering -------------------------------------------------------------------------------

function renderTabs() {
  const box = $("items-tabs");
  if (!box) return;
  const counts = state.list.counts;
  const total = counts ? Object.values(counts).reduce((a, b) => a + b, 0) : null;
  fill(
    box,
    TABS.map(([value, label]) => {
      const count = value === "ALL" ? total : counts?.[value];
      const selected = state.list.tab === value;
      return h(
        "button",
        {
          type: "button",
          role: "tab",
          id: `tab-${value}`,
          "aria-selected": selected ? "true" : "false",
          "aria-controls": "items-panel",
          tabindex: selected ? 0 : -1,
          "data-state": value,
          on: { click: () => chooseTab(value) },
        },
        label,
        count === null || count === undefined ? null : h("span", { class: "count" }, ` ${count}`),
      );
    }),
  );
}

// Arrow keys move between the tabs, as in every tab list.
function tabKeys(ev) {
  if (!["ArrowLeft", "ArrowRight", "Home", "End"].includes(ev.key)) return;
  ev.preventDefault();
  const at = TABS.findIndex(([value]) => value === state.list.tab);
  const next = { ArrowLeft: at - 1, ArrowRight: at + 1, Home: 0, End: TABS.length - 1 }[ev.key];
  chooseTab(TABS[(next + TABS.length) % TABS.length][0]).then(() => $(`tab-${state.list.tab}`)?.focus());
}

function row(item) {
  const mine = reviewer() && item.state === "ASSIGNED" && item.leased_by === state.me.subject && item.lease_token;
  const overdue = Date.parse(item.due_at) < Date.now() && item.state !== "RESOLVED";
  const select = mine
    ? h("input", {
        type: "checkbox",
        "aria-label": `Select ${item.ledger_entity} ${money(item.variance_amount, item.currency)}`,
        checked: state.list.selected.has(item.id),
        on: { change: (ev) => toggle(item.id, ev.target.checked) },
      })
    : null;
  return h(
    "tr",
    {},
    h("td", { "data-label": "Select" }, select),
    h("td", { "data-label": "Due", class: overdue ? "overdue" : null }, when(item.due_at), overdue ? " (overdue)" : null),
    h(
      "td",
      { "data-label": "Ledger entity" },
      h("button", { type: "button", class: "link", on: { click: () => openItem(item.id) } }, item.ledger_entity),
    ),
    h("td", { "data-label": "Amount", class: "num" }, money(item.variance_amount, item.currency)),
    h("td", { "data-label": "Currency" }, item.currency),
    h("td", { "data-label": "State" }, item.state),
    h("td", { "data-label": "Held by" }, item.leased_by && item.state !== "RESOLVED" ? item.leased_by : ""),
  );
}

function renderPanel() {
  const box = $("items-panel");
  if (!box) return;
  $("items-panel").setAttribute("aria-labelledby", `tab-${state.list.tab}`);
  const audit = $("items-audit");
  if (audit && ["auditor", "admin"].includes(state.me.role)) {
    fill(audit, h("p", {}, h("a", { href: "/audit/export", download: "audit.ndjson" }, "Download the audit trail (NDJSON)")));
  }
  const page = state.list.page;
  const parts = [];
  if (state.list.message) parts.push(h("p", { role: "status", class: "error" }, state.list.message));
  if (!page) {
    fill(box, parts, h("p", { class: "muted" }, "Loading…"));
    return;
  }
  parts.push(
    page.items.length
      ? h(
          "table",
          { "aria-label": "Items list", class: "list" },
          h("thead", {}, h("tr", {}, ["Select", "Due", "Ledger entity", "Amount", "Currency", "State", "Held by"].map((c) => h("th", { scope: "col" }, c)))),
          h("tbody", {}, page.items.map(row)),
        )
      : h("p", {}, "No items match."),
    h(
      "div",
      { class: "row" },
      h("button", { type: "button", disabled: state.list.cursors.length < 2, on: { click: () => previousPage() } }, "Previous page"),
      h("button", { type: "button", disabled: !page.next_cursor, on: { click: () => nextPage() } }, "Next page"),
    ),
  );
  if (reviewer()) parts.push(bulkControls());
  if (state.list.bulk) parts.push(bulkResults());
  fill(box, parts);
}

function bulkControls() {
  const code = kept("bulk-resolution", {}, "select");
  const options = [h("option", { value: "" }, "Choose a resolution"), ...state.codes.map((c) => h("option", { value: c.code }, `${c.label} (${c.code})`))];
  const chosen = code.value;
  fill(code, options);
  code.value = chosen;
  const note = kept("bulk-note", { maxlength: 4000 }, "textarea");
  const n = state.list.selected.size;
  return h(
    "div",
    { class: "row bulk", role: "group", "aria-label": "Resolve the selected items" },
    h("label", { for: "bulk-resolution" }, "Resolution for the selected items", code),
    h("label", { for: "bulk-note" }, "Note for the selected items", note),
    h("button", { type: "button", class: "primary", disabled: n === 0, on: { click: () => resolveSelected() } }, `Resolve selected (${n})`),
  );
}

const OUTCOMES = {
  resolved: "Resolved",
  already_resolved: "Already resolved",
  submitted_for_approval: "Submitted for approval",
  already_submitted: "Already submitted for approval",
};

function bulkResults() {
  return h(
    "table",
    { "aria-label": "Bulk results", class: "list" },
    h("thead", {}, h("tr", {}, ["Ledger entity", "Amount", "Outcome"].map((c) => h("th", { scope: "col" }, c)))),
    h(
      "tbody",
      {},
      state.list.bulk.map(({ item, outcome }) =>
        h("tr", {}, h("td", { "data-label": "Ledger entity" }, item.ledger_entity), h("td", { "data-label": "Amount", class: "num" }, money(item.variance_amount, item.currency)), h("td", { "data-label": "Outcome" }, outcome)),
      ),
    ),
  );
}

function renderDetail() {
  const box = $("item-details");
  if (!box) return;
  const detail = state.list.detail;
  box.hidden = !detail;
  if (!detail) return fill(box);
  const { item, events } = detail;
  const canLease = reviewer() && item.state === "PENDING";
  fill(
    box,
    h("h2", { id: "item-details-heading", tabindex: -1 }, `Item: ${item.ledger_entity}`),
    itemFields(item),
    contextFields(item.context),
    history(events),
    detail.message ? h("p", { role: "status" }, detail.message) : null,
    h(
      "div",
      { class: "row" },
      canLease ? h("button", { type: "button", class: "primary", on: { click: () => leaseThis(item) } }, "Lease this item") : null,
      h("button", { type: "button", on: { click: () => closeItem() } }, "Close"),
    ),
  );
}

function renderList() {
  renderTabs();
  renderPanel();
  renderDetail();
  renderDecisions();
}

// --- actions -----------------------------------------------------------------------------------

function query(cursor) {
  const c = filterControls();
  const tab = state.list.tab;
  return {
    state: tab === "ALL" ? null : tab,
    ledger_entity: c.entity.value.trim(),
    due_before: c.overdue.checked ? new Date().toISOString() : null,
    // Without a currency the amount bounds are base-currency equivalents at the latest rates.
    currency: c.currency.value.trim().toUpperCase(),
    min_amount: c.min.value.trim(),
    max_amount: c.max.value.trim(),
    q: c.search.value.trim(),
    sort: c.sort.value || "due_at",
    limit: PAGE,
    cursor,
  };
}

async function loadPage() {
  const cursor = state.list.cursors.at(-1);
  try {
    const [page, stats] = await Promise.all([withRetry(() => api.list(query(cursor))), withRetry(() => api.stats())]);
    state.list.page = page;
    state.list.counts = stats.counts;
    state.list.message = null;
  } catch (error) {
    if (error?.status === 422) state.list.message = error.message;
    else handle(error);
  }
  renderList();
}

function firstPage() {
  touch();
  // A search looks in every state: an id, a key or an invoice number is found wherever the item is.
  if (filterControls().search.value.trim()) state.list.tab = "ALL";
  state.list.cursors = [null];
  return loadPage();
}

function chooseTab(value) {
  state.list.tab = value;
  state.list.selected.clear();
  state.list.cursors = [null];
  touch();
  return loadPage();
}

function nextPage() {
  if (!state.list.page?.next_cursor) return;
  state.list.cursors.push(state.list.page.next_cursor);
  loadPage();
}

function previousPage() {
  if (state.list.cursors.length < 2) return;
  state.list.cursors.pop();
  loadPage();
}

function clearFilters() {
  const c = filterControls();
  for (const input of [c.entity, c.currency, c.min, c.max, c.search]) input.value = "";
  c.overdue.checked = false;
  c.sort.value = "due_at";
  firstPage();
}

function toggle(id, on) {
  touch();
  if (on) state.list.selected.add(id);
  else state.list.selected.delete(id);
  renderPanel();
}

async function openItem(id) {
  touch();
  try {
    const [item, trail] = await Promise.all([withRetry(() => api.item(id)), withRetry(() => api.events(id))]);
    state.list.detail = { item, events: trail.events, message: null };
  } catch (error) {
    handle(error);
    return;
  }
  renderDetail();
  $("item-details-heading")?.focus();
}

function closeItem() {
  state.list.detail = null;
  renderDetail();
}

async function leaseThis(item) {
  touch();
  try {
    const leased = (await withRetry(() => api.leaseItem(item.id))).items[0];
    if (!leased) {
      state.list.detail.message = "You cannot lease this item now: it is no longer pending, or you hold as many items as you may.";
      renderDetail();
      return;
    }
    state.list.detail = null;
    go("review");
    await takeLeased(leased);
  } catch (error) {
    handle(error);
  }
}

async function resolveSelected() {
  touch();
  const resolution = $("bulk-resolution").value;
  const note = $("bulk-note").value.trim();
  const items = (state.list.page?.items || []).filter((i) => state.list.selected.has(i.id));
  if (!resolution || !items.length) {
    state.list.message = "Choose a resolution and at least one item you hold.";
    renderPanel();
    return;
  }
  const entries = items.map((i) => ({ id: i.id, resolution, ...(note ? { note } : {}), lease_token: i.lease_token, source_hash: i.source_hash }));
  try {
    const { results } = await withRetry(() => api.completeMany(entries));
    state.list.bulk = results.map((r, n) => ({
      item: r.item ?? items[n],
      outcome: r.outcome === "refused" ? `Not resolved: ${describe(r.problem)}` : OUTCOMES[r.outcome],
    }));
    state.list.selected.clear();
    $("bulk-note").value = "";
  } catch (error) {
    handle(error);
    return;
  }
  await syncHeld();
  // The decisions just made show in My decisions at once, not at the next refresh.
  await Promise.all([loadPage(), loadDecisions()]);
}

let refresher = null;

function reload() {
  loadPage();
  if (reviewer()) loadDecisions();
}

registerView({
  id: "items",
  label: "Items",
  roles: ["reviewer", "approver", "auditor", "admin"],
  regions,
  render: renderList,
  start() {
    reload();
    // Counts, the page and my decisions refresh by themselves while the list is shown.
    // Elsewhere, my decisions still refresh: the header counts the proposals rejected meanwhile.
    refresher ??= setInterval(() => {
      if (state.me && shown("items")) reload();
      else if (state.me && reviewer()) loadDecisions();
    }, REFRESH_MS);
  },
  // Brought up again: what changed meanwhile (a decision made in another view) shows at once.
  show() {
    if (state.me) reload();
  },
  reset() {
    state.list = fresh();
  },
});
