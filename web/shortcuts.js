// The keyboard shortcuts: one table, which both handles the keys and renders the `?` help.

import { loadAdmin } from "./admin.js";
import { $, fill, h } from "./dom.js";
import { chooseResolution, focusNote, nextItem, releaseCurrent, resolveAndNext } from "./review.js";
import { state } from "./state.js";
import { go, viewsFor } from "./views.js";

const typing = (ev) => ev.target instanceof HTMLElement && ev.target.matches("input, textarea, select");

export const SHORTCUTS = [
  {
    keys: "n",
    label: "Next item (from any view)",
    view: "review",
    match: (ev) => ev.key === "n",
    run: () => (go("review"), nextItem()),
  },
  {
    keys: "Ctrl+Enter",
    label: "Resolve with the chosen resolution and note, then go to the next item",
    inFields: true,
    view: "review",
    match: (ev) => ev.key === "Enter" && (ev.ctrlKey || ev.metaKey),
    run: () => resolveAndNext(),
  },
  {
    keys: "1 … 9",
    label: "Choose the resolution: the first to the ninth in the Resolution list",
    view: "review",
    match: (ev) => /^[1-9]$/.test(ev.key),
    run: (ev) => chooseResolution(Number(ev.key) - 1),
  },
  { keys: "e", label: "Write the note", view: "review", match: (ev) => ev.key === "e", run: () => focusNote() },
  {
    keys: "x",
    label: "Release the item back to the queue (with the reason typed under Release reason)",
    view: "review",
    match: (ev) => ev.key === "x",
    run: () => releaseCurrent(),
  },
  {
    keys: "/",
    label: "Search the items",
    view: "items",
    match: (ev) => ev.key === "/",
    run: () => (go("items"), document.getElementById("filter-search")?.focus()),
  },
  { keys: "a", label: "Admin: refresh the statistics", view: "admin", match: (ev) => ev.key === "a", run: () => loadAdmin() },
  { keys: "?", label: "Show or hide these shortcuts", match: (ev) => ev.key === "?", run: () => toggleHelp() },
  {
    keys: "Escape",
    label: "Close this list, or leave the field you are typing in",
    inFields: true,
    match: (ev) => ev.key === "Escape",
    run: () => {
      if (state.helpOpen) toggleHelp(false);
      else if (document.activeElement instanceof HTMLElement) document.activeElement.blur();
    },
  },
];

export function onKey(ev) {
  if (!state.me) return;
  const views = viewsFor(state.me.role).map((view) => view.id);
  for (const shortcut of SHORTCUTS) {
    if (typing(ev) && !shortcut.inFields) continue;
    if (shortcut.view && !views.includes(shortcut.view)) continue; // not this role's
    if (ev.altKey || ((ev.ctrlKey || ev.metaKey) && !shortcut.keys.startsWith("Ctrl"))) continue;
    if (shortcut.match(ev)) {
      ev.preventDefault();
      shortcut.run(ev);
      return;
    }
  }
}

export function toggleHelp(open = !state.helpOpen) {
  state.helpOpen = open;
  renderHelp();
}

export function renderHelp() {
  const dialog = $("help");
  fill(
    dialog,
    h("h2", {}, "Keyboard shortcuts"),
    h(
      "table",
      {},
      SHORTCUTS.map((s) => h("tr", {}, h("td", {}, h("kbd", {}, s.keys)), h("td", {}, s.label))),
    ),
    h("p", { class: "muted" }, "Single keys work when you are not typing in a field."),
    h("button", { type: "button", on: { click: () => toggleHelp(false) } }, "Close"),
  );
  if (state.helpOpen && !dialog.open) dialog.showModal();
  if (!state.helpOpen && dialog.open) dialog.close();
}
