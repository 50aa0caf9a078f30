// Small DOM helpers. Everything shown comes from outside (ingest, other reviewers) and is rendered
// as text only: elements are made with createElement and filled with textContent, never innerHTML.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "on") for (const [event, fn] of Object.entries(value)) el.addEventListener(event, fn);
    else if (name === "class") el.className = value;
    else el.setAttribute(name, value === true ? "" : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

export const $ = (id) => document.getElementById(id);

// replaceChildren would turn a null into the text "null": leave the gaps out.
export function fill(el, ...children) {
  el.replaceChildren(...children.flat(Infinity).filter((c) => c !== null && c !== undefined && c !== false));
}

// One term and its description, for a <dl>.
export function field(label, value, attrs = {}) {
  return [h("dt", {}, label), h("dd", attrs, value)];
}

// Inputs made once and reused by every render of their region, so that what is being typed survives
// a refresh of the numbers around it.
const keptInputs = {};
export function kept(id, attrs, tag = "input") {
  keptInputs[id] ??= h(tag, { id, ...attrs });
  return keptInputs[id];
}
