// A comment on the item in view (issue 42): a COMMENTED event on its trail, shown in its history.
// For the preparer (the review view) and the approver (the approvals view); the item never changes.

import { api } from "./api.js";
import { h, kept } from "./dom.js";
import { handle, say } from "./feedback.js";

/** The item's trail as read, with the events the view added after the read began (a comment sent
 *  while the history was loading): a read that lands late must not drop them. */
export function mergeTrail(read, shown, itemId) {
  const last = read.length ? read[read.length - 1].id : 0;
  return [...read, ...shown.filter((e) => e.item_id === itemId && e.id > last)];
}

// `id` names the view's own box (its text survives the view's re-renders); `added(event)` puts the
// new event into the view's history and renders it.
export function commentBox(id, item, added) {
  const text = kept(id, { maxlength: 2000, rows: 2, placeholder: "e.g. the credit note is on its way" }, "textarea");
  const send = async () => {
    if (!text.value.trim()) {
      say("Write the comment first.", true);
      text.focus();
      return;
    }
    try {
      const event = await api.comment(item.id, text.value);
      text.value = "";
      say("Comment added.");
      added(event);
    } catch (error) {
      handle(error);
    }
  };
  return h(
    "div",
    { class: "comment" },
    h("label", { for: id }, "Comment"),
    text,
    h("button", { type: "button", on: { click: send } }, "Add comment"),
  );
}
