// Experiences view: a run's sampled experiences (read without consuming them), filtered by reward range and weight
// version; one opens to show its whole prompt, response and reward components.
import { api } from "./api.js";
import { fill, fmt, h } from "./dom.js";
import { viewReady } from "./timings.js";

const FILTERS = [
  { name: "min_reward", label: "Minimum reward" },
  { name: "max_reward", label: "Maximum reward" },
  { name: "version", label: "Weight version" },
  { name: "limit", label: "At most", value: "50" },
];
const PREVIEW_CHARS = 80;

export async function mountExperiences(main, runId) {
  const base = `api/runs/${encodeURIComponent(runId)}/experiences`;
  const status = h("p", { role: "status" });
  const body = h("tbody");
  const detail = h("section", {
    id: "experience-detail",
    class: "panel",
    "aria-labelledby": "detail-title",
    hidden: true,
  });
  const inputs = FILTERS.map((f) =>
    h("input", {
      id: `filter-${f.name}`,
      name: f.name,
      type: "text",
      inputmode: "decimal",
      value: f.value,
      autocomplete: "off",
    }),
  );
  const filters = h(
    "form",
    { class: "toolbar filters", "aria-label": "Filter experiences" },
    FILTERS.map((f, i) => h("span", { class: "filter" }, h("label", { for: inputs[i].id }, f.label), inputs[i])),
    h("button", { type: "submit" }, "Apply filters"),
  );

  const open = (e) => {
    fill(
      detail,
      h("h2", { id: "detail-title", tabindex: "-1" }, `Experience ${e.id}`),
      h(
        "dl",
        { class: "summary" },
        [
          ["Reward", fmt(e.reward)],
          ["Weight version", e.model_version],
          ["Advantage", e.advantage === null ? "not recorded" : fmt(e.advantage)],
          ["Group", e.group_id],
          ["Finish reason", e.finish_reason],
          ...Object.entries(e.components || {}).map(([k, v]) => [`Reward component: ${k}`, fmt(v)]),
        ].flatMap(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]),
      ),
      h("h3", {}, "Prompt"),
      h("pre", { class: "text", id: "detail-prompt" }, e.prompt),
      h("h3", {}, "Response"),
      h("pre", { class: "text", id: "detail-response" }, e.response),
    );
    detail.hidden = false;
    detail.querySelector("h2").focus();
  };

  const load = async () => {
    const query = new URLSearchParams(
      FILTERS.map((f, i) => [f.name, inputs[i].value.trim()]).filter(([, v]) => v !== ""),
    );
    status.textContent = "Loading…";
    const { experiences } = await api(`${base}?${query}`);
    status.textContent = `${experiences.length} experience(s).`;
    fill(
      body,
      experiences.map((e) =>
        h(
          "tr",
          { dataset: { experienceId: e.id } },
          h("td", { class: "num" }, e.model_version),
          h("td", { class: "num" }, fmt(e.reward)),
          h(
            "td",
            {},
            Object.entries(e.components || {})
              .map(([k, v]) => `${k} ${fmt(v)}`)
              .join(", "),
          ),
          h("td", { class: "num" }, e.advantage === null ? "" : fmt(e.advantage)),
          h("td", {}, preview(e.prompt)),
          h("td", {}, preview(e.response)),
          h(
            "td",
            {},
            h(
              "button",
              { type: "button", class: "small", onclick: () => open(e), "aria-label": `Open experience ${e.id}` },
              "Open",
            ),
          ),
        ),
      ),
    );
  };
  filters.addEventListener("submit", (event) => {
    event.preventDefault();
    load().catch((err) => (status.textContent = err.message));
  });

  fill(
    main,
    h("h1", {}, "Experiences"),
    h("p", {}, h("a", { href: `#/runs/${encodeURIComponent(runId)}` }, `Back to run ${runId}`)),
    filters,
    status,
    h(
      "div",
      { class: "table-wrap" },
      h(
        "table",
        { id: "experiences-table" },
        h(
          "thead",
          {},
          h(
            "tr",
            {},
            ["Version", "Reward", "Components", "Advantage", "Prompt", "Response", "Details"].map((t) =>
              h("th", { scope: "col" }, t),
            ),
          ),
        ),
        body,
      ),
    ),
    detail,
  );
  await load().catch((err) => (status.textContent = err.message));
  viewReady("experiences");
}

function preview(text) {
  const flat = (text || "").replace(/\s+/g, " ");
  return flat.length > PREVIEW_CHARS ? `${flat.slice(0, PREVIEW_CHARS)}…` : flat;
}
