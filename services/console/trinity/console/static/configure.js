// Configure view: the schema form and a YAML editor side by side, kept in sync both ways; validated as you type
// with the CLI's messages; load an example, download the YAML, launch the run.
import { api, ApiError } from "./api.js";
import { dump, load } from "./vendor/js-yaml.js";
import { debounce, fill, h } from "./dom.js";
import { ConfigForm } from "./form.js";
import { viewReady } from "./timings.js";

const VALIDATE_DELAY_MS = 300;
const FIRST_EXAMPLE = "quickstart";

export async function mountConfigure(main) {
  const { schema, registries, examples } = await api("api/schema");
  const status = h("p", { id: "validation-status", role: "status" });
  const general = h("ul", { id: "general-errors", class: "error", "aria-label": "Problems not tied to a form field" });
  const yamlError = h("p", { id: "yaml-error", class: "error", hidden: true });
  const editor = h("textarea", {
    id: "yaml-editor",
    spellcheck: "false",
    wrap: "off",
    rows: 30,
    "aria-describedby": "yaml-error",
  });
  const formEl = h("div", { id: "config-fields" });
  const exampleSelect = h(
    "select",
    { id: "example" },
    examples.map((e, i) => h("option", { value: i, selected: e.name === FIRST_EXAMPLE }, e.name)),
  );
  // In the toolbar above the form, yet the form's submit button (form=), so Enter in a field launches too.
  const launchButton = h("button", { type: "submit", form: "config-form", class: "primary" }, "Launch run");
  const form = h("form", { id: "config-form", novalidate: true, "aria-label": "Run configuration" }, formEl);

  let checks = 0; // only the newest validation's answer is shown
  const validate = async () => {
    const mine = ++checks;
    const answer = await api("api/validate", { method: "POST", body: { yaml: editor.value } });
    if (mine !== checks) return;
    showErrors(answer.errors);
    status.textContent = answer.ok ? "The configuration is valid." : `${answer.errors.length} problem(s) to fix.`;
  };
  const validateLater = debounce(() => validate().catch(report), VALIDATE_DELAY_MS);
  const validateSoon = () => {
    status.textContent = "Checking…"; // at once: an answer on screen is never one for an older text
    validateLater();
  };
  const report = (err) => (status.textContent = err.message);
  const showErrors = (errors) => {
    const unplaced = configForm.showErrors(errors);
    fill(
      general,
      unplaced.map((e) => h("li", {}, e.field ? `${e.field}: ${e.message}` : e.message)),
    );
  };

  const configForm = new ConfigForm(formEl, schema, registries, (doc) => {
    editor.value = dump(doc, { lineWidth: 120 });
    yamlError.hidden = true;
    validateSoon();
  });
  const fromYaml = () => {
    let doc;
    try {
      doc = load(editor.value) ?? {};
      if (typeof doc !== "object" || Array.isArray(doc)) throw new Error("the config must be a mapping of keys");
    } catch (err) {
      yamlError.textContent = `YAML: ${err.reason || err.message}`;
      yamlError.hidden = false;
      status.textContent = "The YAML does not parse.";
      return;
    }
    yamlError.hidden = true;
    configForm.render(doc);
    validateSoon();
  };
  const fromYamlLater = debounce(fromYaml, VALIDATE_DELAY_MS);
  editor.addEventListener("input", () => {
    status.textContent = "Checking…";
    fromYamlLater();
  });

  const loadExample = () => {
    const example = examples[Number(exampleSelect.value)];
    editor.value = example ? example.yaml : "";
    fromYaml();
  };
  const download = () => {
    const link = h("a", { href: URL.createObjectURL(new Blob([editor.value], { type: "application/yaml" })) });
    link.download = `${configForm.doc.name || "run"}.yaml`;
    link.click();
    URL.revokeObjectURL(link.href);
  };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    checks += 1; // a launch answers for the config as it stands
    status.textContent = "Launching…";
    try {
      const { run_id } = await api("api/runs", { method: "POST", body: { yaml: editor.value } });
      location.hash = `#/runs/${encodeURIComponent(run_id)}`;
    } catch (err) {
      if (!(err instanceof ApiError) || !err.errors.length) return report(err);
      showErrors(err.errors);
      status.textContent = `Not launched: ${err.errors.length} problem(s) to fix.`;
    }
  });

  fill(
    main,
    h("h1", {}, "Configure a run"),
    h(
      "div",
      { class: "toolbar" },
      h("label", { for: "example" }, "Example"),
      exampleSelect,
      h("button", { type: "button", onclick: loadExample }, "Load example"),
      h("button", { type: "button", onclick: download }, "Download YAML"),
      launchButton,
    ),
    status,
    general,
    h(
      "div",
      { class: "split" },
      form,
      h("div", { class: "yaml-pane" }, h("label", { for: "yaml-editor" }, "YAML"), editor, yamlError),
    ),
  );
  loadExample();
  viewReady("configure");
}
