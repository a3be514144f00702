// Runs view: every run with its state, steps, weight version and age, refreshed while it is on screen.
import { api } from "./api.js";
import { age, fill, h } from "./dom.js";
import { viewReady } from "./timings.js";

const REFRESH_MS = 2000;

export async function mountRuns(main) {
  const body = h("tbody");
  const status = h("p", { role: "status", class: "muted" });
  fill(
    main,
    h("h1", {}, "Runs"),
    h("p", {}, h("a", { href: "#/configure" }, "Configure a new run")),
    status,
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { id: "runs-table" },
        h("caption", { class: "visually-hidden" }, "Runs, newest first"),
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            ["Run", "Mode", "State", "Train step", "Explore step", "Version", "Age"].map((t) =>
              h("th", { scope: "col" }, t),
            ),
          ),
        ),
        body,
      ),
    ),
  );
  const refresh = async () => {
    const { runs } = await api("api/runs");
    status.textContent = runs.length ? "" : "No runs yet.";
    fill(
      body,
      runs.map((run) =>
        h(
          "tr",
          { dataset: { runId: run.id } },
          h(
            "td",
            {},
            h("a", { href: `#/runs/${encodeURIComponent(run.id)}` }, run.name || run.id),
            h("div", { class: "muted mono" }, run.id),
          ),
          h("td", {}, run.mode),
          h(
            "td",
            {},
            h("span", { class: `state state-${run.state}` }, run.state),
            run.error && h("div", { class: "error" }, run.error),
          ),
          h("td", { class: "num" }, run.train_step),
          h("td", { class: "num" }, run.explore_step),
          h("td", { class: "num" }, run.model_version),
          h("td", { class: "num" }, age(run.created_unix_ms)),
        ),
      ),
    );
  };
  await refresh();
  viewReady("runs");
  const timer = setInterval(() => refresh().catch((err) => (status.textContent = err.message)), REFRESH_MS);
  return () => clearInterval(timer);
}
