// Comparing two weight versions' held-out evaluations of a run, metric by metric.
import { api } from "./api.js";
import { fill, fmt, h } from "./dom.js";

export class EvalCompare {
  constructor(runId) {
    this.runId = runId;
    this.evals = [];
    this.a = h("select", { id: "eval-a" });
    this.b = h("select", { id: "eval-b" });
    this.body = h("tbody");
    this.empty = h("p", { class: "muted" }, "No evaluations yet.");
    for (const select of [this.a, this.b]) {
      select.addEventListener("change", () => {
        select.dataset.chosen = "yes";
        this.draw();
      });
    }
    this.element = h(
      "section",
      { "aria-labelledby": "evals-title", class: "panel" },
      h("h2", { id: "evals-title" }, "Compare evaluations"),
      h(
        "div",
        { class: "toolbar" },
        h("label", { for: "eval-a" }, "Version A"),
        this.a,
        h("label", { for: "eval-b" }, "Version B"),
        this.b,
      ),
      this.empty,
      h(
        "div",
        { class: "table-wrap" },
        h(
          "table",
          { id: "evals-table" },
          h(
            "thead",
            {},
            h(
              "tr",
              {},
              ["Metric", "A", "B", "B − A"].map((t) => h("th", { scope: "col" }, t)),
            ),
          ),
          this.body,
        ),
      ),
    );
  }

  async refresh() {
    const { evals } = await api(`api/runs/${encodeURIComponent(this.runId)}/evals`);
    const keep = [this.a.value, this.b.value];
    this.evals = evals;
    const options = () => evals.map((e, i) => h("option", { value: i }, `version ${e.model_version}`));
    fill(this.a, options());
    fill(this.b, options());
    // The first and the latest by default (B follows new evaluations); a choice the user made stays.
    this.a.value = this.a.dataset.chosen ? keep[0] : "0";
    this.b.value = this.b.dataset.chosen ? keep[1] : String(evals.length - 1);
    this.draw();
  }

  draw() {
    this.empty.hidden = this.evals.length > 0;
    const a = this.evals[Number(this.a.value)]?.metrics || {};
    const b = this.evals[Number(this.b.value)]?.metrics || {};
    const keys = [...new Set([...Object.keys(a), ...Object.keys(b)])].sort();
    fill(
      this.body,
      keys.map((k) =>
        h(
          "tr",
          {},
          h("th", { scope: "row" }, k),
          h("td", { class: "num" }, fmt(a[k])),
          h("td", { class: "num" }, fmt(b[k])),
          h("td", { class: "num" }, k in a && k in b ? fmt(b[k] - a[k]) : ""),
        ),
      ),
    );
  }
}
