// Four eyes: an approver leases someone else's proposal and decides it with everything the preparer
// saw: the amount, the figures and context, the whole history, the proposal and its note, the
// threshold that called for an approver, and the lease's countdown.

import { api, ApiError } from "./api.js";
import { $, field, fill, h } from "./dom.js";
import { handle, withRetry } from "./feedback.js";
import { duration, money } from "./format.js";
import { commentBox, mergeTrail } from "./comments.js";
import { contextFields, history, itemFields } from "./item.js";
import { APPROVER_ROLES, idleFor, state, touch } from "./state.js";
import { registerView, shown } from "./views.js";

const fresh = () => ({ item: null, events: [], conversion: null, message: null, waiting: null, endsAt: 0, renewedAt: 0 });
state.approval = fresh();

// The threshold the proposal met: the one that applies to its code (its own or the catalogue's
// materiality, whichever is lower) as the catalogue states it (a decimal string), else as the
// submission recorded it.
function threshold(item, events) {
  const code = state.codes.find((c) => c.code === item.proposed_resolution);
  if (code?.effective_approval_threshold) return money(code.effective_approval_threshold);
  const submitted = [...events].reverse().find((e) => e.event === "SUBMITTED_FOR_APPROVAL");
  return submitted ? String(submitted.details?.approval_threshold ?? "") : "";
}

// How the submission converted the amount into the base currency, as its event recorded it, and who
// set that rate when (the newest rate set at or before the submission: the one it used). Null for an
// item in the base currency, or when nothing was recorded (before currencies).
async function conversion(item, events) {
  const submitted = [...events].reverse().find((e) => e.event === "SUBMITTED_FOR_APPROVAL");
  if (!submitted || !("rate" in (submitted.details ?? {}))) return null;
  const { base_currency: base } = await withRetry(() => api.rates());
  if (item.currency === base) return null;
  const { rate, base_amount: baseAmount } = submitted.details;
  if (rate === null || rate === undefined) return { base, rate: null };
  const { rates } = await withRetry(() => api.rateHistory(item.currency));
  const used = rates.find((r) => Date.parse(r.set_at) <= Date.parse(submitted.at) && Number(r.rate) === Number(rate));
  // The event's numbers arrive as JSON numbers (1.0850 reads as 1.085): the rate's own decimal string
  // from its history, and the product worked out from the two strings, exactly.
  if (!used) return { base, rate: String(rate), baseAmount: String(baseAmount) };
  return { base, rate: used.rate, baseAmount: times(item.variance_amount, used.rate), setBy: used.set_by, setOn: used.set_at.slice(0, 10) };
}

// The exact product of two decimal strings, as a decimal string (BigInt: never a float).
function times(a, b) {
  const parse = (text) => {
    const [, sign, whole, fraction = ""] = /^(-?)(\d+)(?:\.(\d+))?$/.exec(text);
    return { value: BigInt(`${sign}${whole}${fraction}`), scale: fraction.length };
  };
  const x = parse(a), y = parse(b);
  const product = x.value * y.value;
  const scale = x.scale + y.scale;
  const digits = (product < 0n ? -product : product).toString().padStart(scale + 1, "0");
  const text = scale ? `${digits.slice(0, -scale)}.${digits.slice(-scale)}` : digits;
  return product < 0n ? `-${text}` : text;
}

// "EUR 9,500.00 ≈ USD 10,307.50 at 1.0850, set by treasury-feed on 2026-12-05"
function conversionLine(item, c) {
  const amount = `${item.currency} ${money(item.variance_amount, item.currency)}`;
  if (c.rate === null) return `${amount}: no exchange rate into ${c.base} when submitted, so an approver is needed whatever the amount`;
  const set = c.setBy ? `, set by ${c.setBy} on ${c.setOn}` : "";
  return `${amount} ≈ ${c.base} ${money(c.baseAmount, c.base)} at ${c.rate}${set}`;
}

function waitingLine() {
  const n = state.approval.waiting;
  if (n === null) return null;
  return h("p", { "data-testid": "waiting" }, n === 1 ? "1 proposal is waiting for an approver." : `${n} proposals are waiting for an approver.`);
}

function renderApprovals() {
  const box = $("approvals");
  if (!box) return;
  const { item, events, message } = state.approval;
  const parts = [h("h2", {}, "Approvals"), waitingLine()];
  if (message) parts.push(h("p", { role: "status" }, message));
  if (!item) {
    parts.push(h("button", { type: "button", on: { click: () => leaseApproval() } }, "Lease a proposal"));
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
      field("Threshold", `Needs an approver from ${threshold(item, events)} (abs amount ${money(item.variance_amount.replace("-", ""))})`),
      state.approval.conversion ? field("In the base currency", conversionLine(item, state.approval.conversion)) : null,
    ),
    h("p", {}, "Approval lease: ", h("span", { id: "approval-countdown", class: "countdown", role: "timer" }, "")),
    contextFields(item.context),
    history(events),
    commentBox("approval-comment", item, (event) => {
      state.approval.events = [...state.approval.events, event];
      renderApprovals();
    }),
    h(
      "div",
      { class: "row" },
      h("button", { type: "button", class: "primary", on: { click: () => decide(true) } }, "Approve"),
      h("label", { for: "reject-reason" }, "Reject reason", reason),
      h("button", { type: "button", on: { click: () => decide(false) } }, "Reject"),
    ),
  );
  fill(box, parts);
  renderCountdown();
}

function renderCountdown() {
  const el = $("approval-countdown");
  if (!el) return;
  const left = (state.approval.endsAt - performance.now()) / 1000;
  el.textContent = left > 0 ? `${duration(left)} left` : "expired";
  el.classList.toggle("low", left < 10);
}

async function loadWaiting() {
  try {
    const stats = await withRetry(() => api.stats());
    state.approval.waiting = Math.max(0, (stats.counts.AWAITING_APPROVAL ?? 0) - stats.approval_leases);
  } catch (error) {
    handle(error);
  }
}

// The proposal I hold, with its whole trail and a fresh countdown.
async function hold(item) {
  // The same proposal held again: keep what it shows (its comments sent meanwhile).
  const same = item !== null && state.approval.item?.id === item.id;
  state.approval.item = item;
  if (!same) state.approval.events = [];
  state.approval.conversion = null;
  if (!item) return;
  state.approval.endsAt = performance.now() + (Date.parse(item.lease_expires_at) - Date.now());
  state.approval.renewedAt = performance.now();
  try {
    const read = (await withRetry(() => api.events(item.id))).events;
    state.approval.events = mergeTrail(read, state.approval.events, item.id);
    state.approval.conversion = await conversion(item, state.approval.events);
  } catch (error) {
    handle(error);
  }
}

let loaded = Promise.resolve(); // the view's latest look at the proposals I hold (loadApprovals)

async function loadApprovals() {
  try {
    const page = await withRetry(() => api.myApprovals());
    await hold(page.items[0] ?? null);
  } catch (error) {
    handle(error);
  }
  await loadWaiting();
  renderApprovals();
}

let leasing = null; // the lease in progress: clicks meanwhile join it, never lease a second

function leaseApproval() {
  leasing ??= leaseOne().finally(() => {
    leasing = null;
  });
  return leasing;
}

async function leaseOne() {
  touch();
  // The view's look at the proposals I hold, answered before this lease and delivered after it,
  // would take the proposal leased off the desk (the likely cause of a desk test failing in a
  // loaded CI run): wait for that look, and show what it found rather than lease another.
  await loaded.catch(() => {});
  if (state.approval.item) {
    renderApprovals();
    return;
  }
  try {
    const leased = await withRetry(() => api.leaseApproval());
    await hold(leased.items[0] ?? null);
    state.approval.message = state.approval.item ? null : "No proposal is waiting for you.";
  } catch (error) {
    state.approval.message = error.message;
  }
  await loadWaiting();
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
      state.approval.message = `Approved ${item.ledger_entity} ${money(item.variance_amount, item.currency)}: resolved as ${done.item.resolution} by ${done.item.resolved_by}.`;
    } else {
      await withRetry(() => api.reject(item, reason));
      state.approval.message = `Rejected ${item.ledger_entity} ${money(item.variance_amount, item.currency)}: back in the queue (${reason}).`;
    }
    await hold(null);
  } catch (error) {
    state.approval.message = error.message;
    if (error instanceof ApiError && ["LEASE_NOT_HELD", "SEGREGATION_OF_DUTIES"].includes(error.code)) await hold(null);
  }
  await loadWaiting();
  renderApprovals();
}

// Every second: the countdown; while the approver is active, a renewal every third of the lease;
// every 15 s while shown, the count of proposals waiting.
let beats = 0;
async function heartbeat() {
  if (!state.me || !APPROVER_ROLES.includes(state.me.role)) return;
  renderCountdown();
  const item = state.approval.item;
  const active = idleFor() < state.me.idle_release_s * 1000;
  if (item && active && performance.now() - state.approval.renewedAt >= (state.me.lease_s * 1000) / 3) {
    state.approval.renewedAt = performance.now();
    try {
      const fresh = await withRetry(() => api.renew(item));
      if (state.approval.item?.id === fresh.id) {
        state.approval.item = fresh;
        state.approval.endsAt = performance.now() + state.me.lease_s * 1000;
      }
    } catch (error) {
      if (error instanceof ApiError && error.code === "LEASE_NOT_HELD") {
        await hold(null);
        state.approval.message = error.message;
        renderApprovals();
      } else handle(error);
    }
  }
  if (++beats % 15 === 0 && shown("approvals")) {
    await loadWaiting();
    renderApprovals();
  }
}

let ticker = null;

registerView({
  id: "approvals",
  label: "Approvals",
  roles: APPROVER_ROLES,
  regions: () => [h("section", { "aria-label": "Approvals", id: "approvals" })],
  render: renderApprovals,
  start() {
    ticker ??= setInterval(heartbeat, 1000);
    loaded = loadApprovals();
    return loaded;
  },
  reset() {
    state.approval = fresh();
  },
});
