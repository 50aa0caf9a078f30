// The desk's one state object. Each view keeps its part under its own key; render functions read
// it, actions change it and then render their region.

export const REVIEWER_ROLES = ["reviewer", "approver", "admin"];
export const APPROVER_ROLES = ["approver", "admin"];

export const state = {
  me: null, // {subject, role, csrf_token, lease_s, idle_release_s, max_wait_s}
  signInError: null,
  held: [], // items I hold, queue order; held[0] is the current item
  changed: null, // {before, after}: the current item's figures changed under the lease
  events: [], // audit trail of the current item
  leaseEndsAt: 0, // performance.now() when the current lease ends
  lastRenewAt: 0,
  queue: null, // GET /stats, shown when nothing is pending
  waiting: false, // a long poll is in flight
  paused: null, // why the desk stopped on its own (idle)
  banner: null, // database unavailable, retrying
  notice: null, // {text, error}
  admin: { stats: null, message: null, found: null, foundEvents: [] },
  approval: { item: null, message: null }, // the proposal whose approval lease I hold
  codes: [], // the active resolution codes, as GET /resolutions lists them (the catalogue decides)
  lastActivity: performance.now(),
  helpOpen: false,
  resumed: Promise.resolve(), // sign-in's look at what this reviewer already holds
};

export function touch() {
  state.lastActivity = performance.now();
}

export const idleFor = () => performance.now() - state.lastActivity;

// The page's two hooks, set once by app.js: render every region, and end the session (a 401).
// Views call these instead of importing app.js, so that imports point one way only.
const hooks = { render: () => {}, endSession: () => {} };

export function setHooks(given) {
  Object.assign(hooks, given);
}

export const render = () => hooks.render();
export const endSession = (message) => hooks.endSession(message);
