// Four eyes: an approver leases someone else's proposal, reads it, and approves or rejects it.

import { api, ApiError } from "./api.js";
import { $, field, fill, h } from "./dom.js";
import { handle, withRetry } from "./feedback.js";
import { itemFields } from "./item.js";
import { APPROVER_ROLES, state, touch } from "./state.js";
import { registerView } from "./views.js";

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

registerView({
  id: "approvals",
  roles: APPROVER_ROLES,
  regions: () => [h("section", { "aria-label": "Approvals", id: "approvals" })],
  render: renderApprovals,
  start: loadApprovals,
  reset() {
    state.approval = { item: null, message: null };
  },
});
