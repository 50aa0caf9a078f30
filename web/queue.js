// The queue around the current item: what is pending and with whom, and whether the desk is waiting
// for work (GET /stats, read when nothing is pending).

import { $, fill, h } from "./dom.js";
import { duration } from "./format.js";
import { state } from "./state.js";

export function renderQueue() {
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
