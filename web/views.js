// The views table. A view is one module that registers itself here with
//   { id, roles, regions(), render(), start(), reset() }
// regions() makes its <section aria-label> elements once (controls made once keep what is typed);
// render() draws them from the state; start() loads what it needs after sign-in; reset() forgets
// it at sign-out. app.js shows the views a role may use, in the order they registered (the order of
// its imports). A new view (e.g. reports) is one more module and one more import in app.js.

const VIEWS = [];

export function registerView(view) {
  VIEWS.push({ start() {}, reset() {}, ...view });
}

export function viewsFor(role) {
  return VIEWS.filter((view) => view.roles.includes(role));
}

export function allViews() {
  return [...VIEWS];
}
