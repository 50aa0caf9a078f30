// Reviewing: the current item (lease, resolve, release, renew, idle release) and the queue around it.

import { api, ApiError } from "./api.js";
import { $, fill, h } from "./dom.js";
import { handle, say, withRetry } from "./feedback.js";
import { duration, money } from "./format.js";
import { commentBox, mergeTrail } from "./comments.js";
import { changedFigures, contextFields, history, itemFields, rejection } from "./item.js";
import { renderQueue } from "./queue.js";
import { idleFor, render, REVIEWER_ROLES, state, touch } from "./state.js";
import { registerView } from "./views.js";

let waitAbort = null;
let ticker = null;

function regions() {
  // Controls are made once, so a note being typed survives every later render of the item.
  const resolution = h("select", { id: "resolution" }, codeOptions());
  const note = h("textarea", { id: "note", maxlength: 4000 });
  const reason = h("input", { id: "release-reason", maxlength: 500, placeholder: "e.g. needs the FX desk" });
  // A reviewer who handles one ledger entity leases only its items (POST /leases {ledger_entity}),
  // from the next lease call on (a wait for work in flight ends within max_wait_s).
  const entity = h("input", { id: "entity", maxlength: 200, placeholder: "any" });
  for (const input of [resolution, note]) input.addEventListener("input", () => markInvalid(input, null));
  const current = h(
    "section",
    { "aria-label": "Current item", id: "current" },
    // Focus goes here after each lease: not into a field, so single-key shortcuts work at once.
    h("h2", { id: "current-heading", tabindex: -1 }, "Current item"),
    h("div", { id: "item" }),
    h(
      "div",
      { class: "row", id: "actions" },
      // Not wrapped in its label: the options' text ("note required") would become part of it.
      h(
        "div",
        { class: "field" },
        h("label", { for: "resolution" }, "Resolution"),
        resolution,
        h("p", { id: "resolution-error", class: "field-error", hidden: true }),
      ),
      h(
        "div",
        { class: "field" },
        h("label", { for: "note" }, "Note"),
        note,
        h("p", { id: "note-error", class: "field-error", hidden: true }),
      ),
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
  return [current, queue];
}

// One option per active code, in the catalogue's order, saying what the code asks for. None is
// chosen for you: a decision is an explicit choice, never a default left in place.
function codeOptions() {
  const none = h("option", { value: "" }, state.codes.length ? "Choose a resolution (1 … 9)" : "Loading the resolution codes…");
  return [none, ...state.codes.map((c, i) => {
    const needs = [];
    if (c.requires_note) needs.push("note required");
    // The threshold that applies: the code's own or the catalogue's materiality, whichever is lower.
    if (c.effective_approval_threshold !== null) needs.push(`approver from ${c.effective_approval_threshold}`);
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
    rejection(state.events),
    itemFields(item),
    contextFields(item.context),
    h("p", {}, "Lease: ", h("span", { id: "countdown", class: "countdown", role: "timer" }, "")),
    state.held.length > 1 ? h("p", { class: "muted" }, `You hold ${state.held.length} items; this is the first of them.`) : null,
    history(state.events),
    commentBox("comment", item, (event) => {
      state.events = [...state.events, event];
      renderCurrent();
    }),
  );
  renderCountdown();
}

function renderCountdown() {
  const el = $("countdown");
  if (!el) return;
  const left = (state.leaseEndsAt - performance.now()) / 1000;
  el.textContent = left > 0 ? `${duration(left)} left` : "expired";
  el.classList.toggle("low", left < 10);
}

function renderReview() {
  renderCurrent();
  renderQueue();
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
    const read = (await withRetry(() => api.events(item.id))).events;
    state.events = mergeTrail(read, state.events, item.id);
  } catch (error) {
    state.events = [];
    handle(error);
  }
  render();
}

export async function nextItem() {
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
  clearDecision();
  $("release-reason").value = "";
  await showCurrent(false);
  // Not the Resolution list: there `e`, digits and typing would go to the list, and a note typed
  // after `e` would be lost. From the heading, `1`-`9`, `e` and Ctrl+Enter do what they say.
  $("current-heading").focus();
}

function clearDecision() {
  $("note").value = "";
  $("resolution").value = "";
  markInvalid($("note"), null);
  markInvalid($("resolution"), null);
}

// A field the service refused: aria-invalid, and the reason right under it. What was typed stays.
function markInvalid(input, message) {
  const error = $(`${input.id}-error`);
  if (message) {
    input.setAttribute("aria-invalid", "true");
    input.setAttribute("aria-describedby", error.id);
  } else {
    input.removeAttribute("aria-invalid");
    input.removeAttribute("aria-describedby");
  }
  error.hidden = !message;
  error.textContent = message || "";
}

// A decision the catalogue refused (a note it requires, a code no longer active): say so at the
// field. The codes are read again, so an inactive one is no longer offered; the note is kept.
async function refusedDecision(error, resolution) {
  if (!(error instanceof ApiError && error.code === "VALIDATION_ERROR")) return false;
  const refused = (error.problem?.errors || []).find((e) => Array.isArray(e.loc) && ["note", "resolution"].includes(e.loc[1]));
  if (!refused) return false;
  const code = state.codes.find((c) => c.code === resolution);
  const name = code ? `${code.label} (${code.code})` : resolution;
  if (refused.loc[1] === "note") {
    markInvalid($("note"), `${name} needs a note. Write it here, then resolve again.`);
    $("note").focus();
  } else {
    await loadCodes();
    markInvalid($("resolution"), `${name} is no longer an active resolution code. Choose another.`);
    $("resolution").focus();
  }
  say("The service did not accept this decision; nothing was resolved. What you typed is kept.", true);
  return true;
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

// An item leased elsewhere on the page (the list's "Lease this item"): it joins what this reviewer
// holds, and is the current item if nothing else is.
export async function takeLeased(item) {
  if (state.waiting) stopWaiting();
  if (state.held.length) {
    // "Lease this item" asked for this one: it is shown, the items already held wait behind it.
    state.held = [item, ...state.held.filter((i) => i.id !== item.id)];
    state.changed = null;
    clearDecision();
    $("release-reason").value = "";
    await showCurrent(false);
    $("current-heading").focus();
    return;
  }
  await takeItem(item);
}

// After decisions made elsewhere on the page (the list's bulk resolve): hold what the service says.
export async function syncHeld() {
  try {
    const page = await withRetry(() => api.mine());
    const current = state.held[0]?.id;
    state.held = page.items;
    if (state.held[0]?.id !== current) {
      clearDecision();
      await showCurrent(false);
    } else render();
  } catch (error) {
    handle(error);
  }
}

export function stopWaiting() {
  state.waiting = false;
  if (waitAbort) waitAbort.abort();
  waitAbort = null;
}

export function chooseResolution(index) {
  if (!state.held.length || index >= state.codes.length) return;
  $("resolution").value = state.codes[index].code;
  touch();
}

export function focusNote() {
  $("note")?.focus();
}

export async function resolveAndNext() {
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
      say(`Submitted ${done.item.ledger_entity} ${money(done.item.variance_amount, done.item.currency)} as ${resolution} for approval (at or above its threshold).`);
    } else {
      say(`Resolved ${done.item.ledger_entity} ${money(done.item.variance_amount, done.item.currency)} as ${resolution}.`);
    }
    clearDecision();
    state.changed = null;
    state.held.shift();
    state.events = [];
    if (state.held.length) await showCurrent(false);
    else await nextItem();
  } catch (error) {
    if (await figuresChanged(error) || (await lostLease(error)) || (await refusedDecision(error, resolution))) return;
    handle(error);
  }
}

export async function releaseCurrent(reason) {
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
    const away = state.me.release_cooldown_s ? ` It goes to other reviewers for the next ${duration(state.me.release_cooldown_s)}.` : "";
    say(`Released ${item.ledger_entity} back to the queue (${why}).${away} Press Next item (n) to go on.`);
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

registerView({
  id: "review",
  label: "Review",
  roles: REVIEWER_ROLES,
  regions,
  render: renderReview,
  start() {
    ticker ??= setInterval(tick, 1000);
    if (REVIEWER_ROLES.includes(state.me.role)) loadCodes().then(renderCurrent);
    state.resumed = resume();
  },
  reset() {
    stopWaiting();
    Object.assign(state, { held: [], events: [], queue: null, paused: null, changed: null });
  },
});
