// The reviewer desk's entry point: sign-in and sign-out, the header and its views, and the views
// a role may use. One state object (state.js), one render function per region (each view's
// module), one table of shortcuts (shortcuts.js); web/api.js is the only module that talks to the
// service.

import { api, ApiError, useCsrfToken } from "./api.js";
import { $, fill, h } from "./dom.js";
import { handle, renderBanner, renderNotice, say, withRetry } from "./feedback.js";
import { REVIEWER_ROLES, setHooks, state, touch } from "./state.js";
import { rejectedCount } from "./decisions.js";
import { activate, activeView, allViews, mount, unmount, viewsFor } from "./views.js";
// The views, in the order the header lists them. Each registers itself (views.js); a new view
// is one more import here.
import { stopWaiting } from "./review.js";
import "./list.js";
import "./approvals.js";
import "./admin.js";
import "./ingest.js";
import "./reports.js";
import { onKey, renderHelp, toggleHelp } from "./shortcuts.js";
import { loadProvider, providerSignIn, takeSignInError } from "./oidc.js";

function renderWho() {
  const who = $("who");
  fill(who);
  if (!state.me) return;
  // fill(), not append(): append() would write the null of a role without the count as "null".
  fill(
    who,
    h("span", { class: "subject" }, `${state.me.subject} (${state.me.role})`),
    REVIEWER_ROLES.includes(state.me.role) ? rejectedCount() : null,
    h("button", { type: "button", class: "wide-only", on: { click: () => toggleHelp() } }, "Shortcuts (?)"),
    h("button", { type: "button", on: { click: () => signOut() } }, "Sign out"),
  );
}

// One link per view of the role, the shown one marked as the current page.
function renderNav() {
  const nav = $("views");
  const views = state.me ? viewsFor(state.me.role) : [];
  nav.hidden = views.length < 2;
  fill(
    nav,
    views.map((view) =>
      h("a", { href: `#${view.id}`, "aria-current": activeView() === view.id ? "page" : null }, view.label),
    ),
  );
}

function renderSignIn() {
  const token = h("input", { id: "token", type: "password", autocomplete: "off", required: true });
  const form = h(
    "form",
    {
      on: {
        submit: (ev) => {
          ev.preventDefault();
          signIn(token.value.trim());
        },
      },
    },
    h("label", { for: "token" }, "Token"),
    h("div", { class: "row" }, token, h("button", { type: "submit", class: "primary" }, "Sign in")),
    state.signInError ? h("p", { class: "error", role: "alert" }, state.signInError) : null,
    h("p", { class: "muted" }, "Paste the token you were given (make run prints one). It is exchanged for a session and not kept by this page."),
  );
  fill($("main"), h("section", { "aria-label": "Sign in" }, h("h2", {}, "Sign in"), providerSignIn(h), form));
  token.focus();
}

let mounted = false; // the signed-in role's views are in the page

function render() {
  renderWho();
  renderBanner();
  renderNotice();
  if (!state.me) {
    mounted = false;
    unmount();
    renderNav();
    return renderSignIn();
  }
  if (!mounted) {
    mount(state.me.role, $("main"), h);
    activate(location.hash.slice(1));
    mounted = true;
  }
  renderNav();
  for (const view of viewsFor(state.me.role)) view.render();
}

function showView() {
  if (!state.me || !mounted) return;
  activate(location.hash.slice(1));
  renderNav();
}

function endSession(message) {
  for (const view of allViews()) view.reset();
  Object.assign(state, { me: null, signInError: message });
  useCsrfToken(null);
  render();
}

async function signIn(token) {
  if (!token) return;
  try {
    const me = await withRetry(() => api.signIn(token));
    startDesk(me);
  } catch (error) {
    state.signInError = error instanceof ApiError && error.status === 401 ? "That token is unknown or revoked." : error.message;
    renderSignIn();
  }
}

async function signOut() {
  stopWaiting(); // the long poll in flight would answer 401 once the session is gone
  let out;
  try {
    out = await withRetry(() => api.signOut());
  } catch (error) {
    handle(error);
    return;
  }
  // Signed in by the identity provider: sign out there too; it sends the browser back here.
  if (out?.end_session_url) {
    window.location.assign(out.end_session_url);
    return;
  }
  endSession(null);
  say("Signed out.");
}

function startDesk(me) {
  state.me = me;
  state.signInError = null;
  state.notice = null; // "Signed out." was about the last session, not this one
  useCsrfToken(me.csrf_token);
  touch();
  render();
  for (const view of viewsFor(me.role)) view.start();
}

async function boot() {
  setHooks({ render, endSession });
  document.addEventListener("keydown", onKey);
  for (const event of ["keydown", "pointerdown", "input", "wheel"]) {
    document.addEventListener(event, touch, { passive: true });
  }
  window.addEventListener("hashchange", showView);
  $("help").addEventListener("close", () => {
    state.helpOpen = false;
  });
  renderHelp();
  state.signInError = takeSignInError();
  const offered = loadProvider(); // alongside the session: the sign-in page needs it, the desk not
  try {
    startDesk(await withRetry(() => api.session()));
  } catch (error) {
    await offered;
    state.me = null;
    render();
    if (!(error instanceof ApiError && error.status === 401)) handle(error);
  }
}

boot();
