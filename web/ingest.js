// The ingest role works through the API, not this page: say so, and where to read how.

import { h } from "./dom.js";
import { registerView } from "./views.js";

registerView({
  id: "ingest",
  label: "Sending work",
  roles: ["ingest"],
  regions: () => [
    h(
      "section",
      { "aria-label": "Sending work", id: "ingest" },
      h("h2", {}, "Sending work"),
      h(
        "p",
        {},
        "Your role, ingest, sends work to the queue through the API (POST /items, or POST /items/batch " +
          "for many) and revises figures (POST /items/{id}/revisions); reviewing happens elsewhere. ",
        h("a", { href: "/docs" }, "Read the API documentation"),
        ".",
      ),
    ),
  ],
  render() {},
});
