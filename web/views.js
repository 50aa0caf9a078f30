// The views table. A view is one module that registers itself here with
//   { id, label, roles, regions(), render(), start(), show(), reset() }
// regions() makes its <section aria-label> elements once (controls made once keep what is typed);
// render() draws them from the state; start() loads what it needs after sign-in; show() runs each
// time the view is brought up (so what it lists is read again then, not at the next tick of a
// refresh timer); reset() forgets it at sign-out. The page shows one view at a time (the header's
// nav, `#id` in the address); the views a role may use appear in the order they registered (the
// order of app.js's imports).
//
// A new view (e.g. reports) is one more module that calls registerView, and one more import in
// app.js: nothing else changes.

const VIEWS = [];
const mounted = new Map(); // view id -> its container, for the signed-in role
let active = null;

export function registerView(view) {
  VIEWS.push({ render() {}, start() {}, show() {}, reset() {}, ...view });
}

export function viewsFor(role) {
  return VIEWS.filter((view) => view.roles.includes(role));
}

export function allViews() {
  return [...VIEWS];
}

// The role's views, each in a container of its own; none shown until activate().
export function mount(role, main, h) {
  mounted.clear();
  active = null;
  const containers = viewsFor(role).map((view) => {
    const box = h("div", { id: `view-${view.id}`, class: "view", hidden: true }, view.regions());
    mounted.set(view.id, box);
    return box;
  });
  main.replaceChildren(...containers);
}

export function unmount() {
  mounted.clear();
  active = null;
}

// Show one view (the first of the role's, when `id` is not one of them); answers its id.
export function activate(id) {
  const target = mounted.has(id) ? id : mounted.keys().next().value ?? null;
  active = target;
  for (const [viewId, box] of mounted) box.hidden = viewId !== target;
  VIEWS.find((view) => view.id === target)?.show();
  return target;
}

export const shown = (id) => active === id;
export const activeView = () => active;

// Go to a view: through the address, so Back returns and a reload stays.
export function go(id) {
  if (location.hash === `#${id}`) activate(id);
  else location.hash = id;
}
