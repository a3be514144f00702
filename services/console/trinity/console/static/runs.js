// Runs view: the queue (pending runs in the order they start), then every run with its state, steps, weight version
// and age, refreshed while it is on screen.
import { api } from "./api.js";
import { age, fill, h, stateBadge } from "./dom.js";
import { viewReady } from "./timings.js";

const REFRESH_MS = 2000;

export async function mountRuns(main) {
  const body = h("tbody");
  const status = h("p", { role: "status", class: "muted" });
  const queue = new QueuePanel();
  fill(
    main,
    h("h1", {}, "Runs"),
    h("p", {}, h("a", { href: "#/configure" }, "Configure a new run")),
    status,
    queue.element,
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
    queue.show(runs);
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
            stateBadge(run),
            run.queue_position && h("div", { class: "muted" }, `#${run.queue_position} in the queue`),
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

/** The pending runs in the order the gateway starts them (higher priority first, then first queued). */
class QueuePanel {
  constructor() {
    this.head = h("thead");
    this.body = h("tbody");
    this.status = h("p", { class: "muted", id: "queue-status" });
    this.table = h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { id: "queue-table" },
        h("caption", { class: "visually-hidden" }, "Pending runs, in the order they start"),
        this.head,
        this.body,
      ),
    );
    this.element = h(
      "section",
      { "aria-labelledby": "queue-title", class: "panel" },
      h("h2", { id: "queue-title" }, "Queue"),
      this.status,
      this.table,
    );
  }

  show(runs) {
    const queued = runs.filter((run) => run.queue_position).sort((a, b) => a.queue_position - b.queue_position);
    const tenants = queued.some((run) => run.tenant); // a column only where tenants share the stack
    this.status.textContent = queued.length
      ? `${queued.length} run(s) wait for free services.`
      : "No run is waiting for services.";
    const headings = ["Position", "Run", "Priority", ...(tenants ? ["Tenant"] : []), "Waiting"];
    fill(this.head, h("tr", {}, headings.map((t) => h("th", { scope: "col" }, t))));
    fill(
      this.body,
      queued.map((run) =>
        h(
          "tr",
          { dataset: { runId: run.id } },
          h("td", { class: "num" }, run.queue_position),
          h("td", {}, h("a", { href: `#/runs/${encodeURIComponent(run.id)}` }, run.name || run.id)),
          h("td", { class: "num" }, run.priority),
          tenants && h("td", {}, run.tenant),
          h("td", { class: "num" }, age(run.queued_unix_ms)),
        ),
      ),
    );
    this.table.hidden = !queued.length;
  }
}
