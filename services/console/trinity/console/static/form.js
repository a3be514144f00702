// The configure form, generated from the run-config schema: one labelled control per key, with its help text,
// type and default. It edits a plain config object (see doc.js) and reports each edit; errors from the validator
// are shown next to the field they name (or the nearest section that holds it).
import { dump, load } from "./vendor/js-yaml.js";
import { dotted, getAt, setAt } from "./doc.js";
import { fill, h, uid } from "./dom.js";
import { chooseVariant, controlKind, deref, discriminator, typeHint, unwrapOptional, variants } from "./schema.js";

// Keys whose values are registry names: offered from `registries` (schema title of the section, then key).
const REGISTRY_OF = {
  algorithm_type: "algorithm",
  workflow: "workflow",
  reward_fn: "reward",
  selector: "selector",
  kl_penalty: "kl_estimator",
  "OperatorConfig.name": "operator",
  "MultiTurnWorkflowOptions.environment": "chat_environment",
  "MultiStepWorkflowOptions.environment": "step_environment",
};
const OPEN_SECTIONS = new Set(["run", "model", "algorithm", "buffer"]);

export class ConfigForm {
  constructor(element, schema, registries, onEdit) {
    this.element = element;
    this.root = schema;
    this.registries = registries;
    this.onEdit = onEdit; // (doc) after every change made in the form
    this.doc = {};
    this.fields = new Map(); // dotted path -> {error, control, sections}
    this.shapes = new Map(); // dotted path of an undiscriminated union -> the shape picked for it
  }

  render(doc) {
    this.doc = doc;
    this.fields = new Map();
    const props = this.root.properties;
    const scalars = Object.keys(props).filter((k) => !this.structured(props[k]));
    const run = this.section("run", this.root.description);
    run.append(...scalars.map((k) => this.node(props[k], [k], k, [run])));
    const objects = Object.keys(props).filter((k) => !scalars.includes(k));
    fill(this.element, run, ...objects.map((k) => this.topSection(k, props[k])));
  }

  /** An object or a union of objects: a section or group of its own rather than one control. */
  structured(schema) {
    const node = unwrapOptional(this.root, schema);
    return Boolean(variants(this.root, node)) || controlKind(node) === "object";
  }

  topSection(key, schema) {
    const node = unwrapOptional(this.root, schema);
    const section = this.section(key, node.description);
    this.fields.set(key, { error: section.querySelector(".section-error"), sections: [section] });
    section.append(...this.body(node, [key], [section]));
    return section;
  }

  section(key, description) {
    return h(
      "details",
      { class: "section", id: `section-${key}`, open: OPEN_SECTIONS.has(key) },
      h(
        "summary",
        {},
        h("span", { class: "section-title" }, key),
        description && h("span", { class: "help" }, ` ${description}`),
      ),
      h("p", { class: "section-error error", hidden: true }),
    );
  }

  /** The controls of an object's properties, or of the variant of a union its value is written in. */
  body(node, path, sections) {
    const options = variants(this.root, node);
    if (options) return this.union(node, options, path, sections);
    const required = new Set(node.required || []);
    return Object.entries(node.properties || {}).map(([key, child]) =>
      this.node(child, [...path, key], key, sections, required.has(key), node.refTitle || node.title),
    );
  }

  node(schema, path, key, sections, required = false, parentTitle = "") {
    const node = unwrapOptional(this.root, schema);
    if (variants(this.root, node)) return this.group(node, path, key, sections);
    const kind = controlKind(node);
    if (kind === "object") return this.group(node, path, key, sections);
    if (kind === "objects") return this.list(node, path, key, sections);
    const registry = this.registries[REGISTRY_OF[`${parentTitle}.${key}`] || REGISTRY_OF[key]];
    return this.control(node, kind, path, key, sections, required, registry);
  }

  group(node, path, key, sections) {
    const fieldset = h(
      "fieldset",
      { class: "group" },
      h("legend", {}, key),
      node.description && h("p", { class: "help" }, node.description),
    );
    const error = h("p", { class: "error", hidden: true });
    fieldset.append(error);
    this.fields.set(dotted(path), { error, sections });
    fieldset.append(...this.body(node, path, sections));
    return fieldset;
  }

  /** A list of objects (task sets, operators): one fieldset per item, with add and remove buttons. */
  list(node, path, key, sections) {
    const items = getAt(this.doc, path) || [];
    const itemSchema = deref(this.root, node.items);
    const wrapper = h(
      "fieldset",
      { class: "group" },
      h("legend", {}, key),
      h("p", { class: "help" }, node.description),
    );
    const error = h("p", { class: "error", hidden: true });
    wrapper.append(error);
    this.fields.set(dotted(path), { error, sections });
    items.forEach((_, i) => {
      const others = items.filter((__, j) => j !== i);
      const remove = () => this.edit(path, others, true);
      const item = h(
        "fieldset",
        { class: "group item" },
        h("legend", {}, `${key}[${i}]`),
        h("button", { type: "button", class: "small", onclick: remove }, `Remove ${key}[${i}]`),
      );
      item.append(...this.body(itemSchema, [...path, i], sections));
      wrapper.append(item);
    });
    const add = () => this.edit(path, [...items, {}], true);
    wrapper.append(h("button", { type: "button", class: "small", onclick: add }, `Add to ${key}`));
    return wrapper;
  }

  /** A union of object shapes: a select of the shape (its discriminator when it has one), then its fields. */
  union(node, options, path, sections) {
    const value = getAt(this.doc, path);
    const key = discriminator(options);
    const shown = (!key && this.shapes.get(dotted(path))) || chooseVariant(options, key, value);
    const id = uid("variant");
    const names = options.map((o) => (key ? o.properties[key].const : o.title || "other (YAML)"));
    const select = h(
      "select",
      { id, name: `${dotted(path)}.${key || "(shape)"}` },
      names.map((name, i) => h("option", { value: i, selected: options[i] === shown }, name)),
    );
    select.addEventListener("change", () => {
      const next = options[Number(select.value)];
      // A discriminated shape is written down; an undiscriminated one only changes which fields are offered.
      if (key) this.edit([...path, key], next.properties[key].const, true);
      else {
        this.shapes.set(dotted(path), next);
        this.rerender();
      }
    });
    const label = key ? `${dotted(path)}.${key}` : `${dotted(path)} shape`;
    const header = h("div", { class: "field" }, fieldLabel(id, label, key || "shape"), select);
    if (!shown.properties)
      return [header, this.control(shown, "yaml", path, path[path.length - 1], sections, false, null)];
    const required = new Set(shown.required || []);
    const fields = Object.entries(shown.properties)
      .filter(([k]) => k !== key)
      .map(([k, child]) => this.node(child, [...path, k], k, sections, required.has(k), shown.title));
    return [header, ...fields];
  }

  control(node, kind, path, key, sections, required, registry) {
    const id = uid("field");
    const name = dotted(path);
    const value = getAt(this.doc, path);
    const help = h(
      "small",
      { id: `${id}-help`, class: "help" },
      [node.description, typeHint(node)].filter(Boolean).join(" — "),
    );
    const error = h("p", { id: `${id}-error`, class: "error", hidden: true });
    const attrs = { id, name, "aria-describedby": `${id}-help ${id}-error`, required: required || undefined };
    let control;
    if (kind === "enum" || kind === "boolean") {
      const choices = kind === "boolean" ? [true, false] : node.enum || [node.const];
      const unset = h(
        "option",
        { value: "" },
        node.default !== undefined ? `default (${optionLabel(node.default)})` : "unset",
      );
      control = h(
        "select",
        attrs,
        unset,
        choices.map((c) =>
          h("option", { value: JSON.stringify(c), selected: value !== undefined && c === value }, optionLabel(c)),
        ),
      );
      control.addEventListener("change", () =>
        this.edit(path, control.value === "" ? undefined : JSON.parse(control.value)),
      );
    } else {
      const listId = registry && `${id}-names`;
      const shown = kind === "yaml" ? (value === undefined ? "" : dump(value, { flowLevel: 0 }).trim()) : (value ?? "");
      const placeholder = node.default !== undefined && typeof node.default !== "object" ? String(node.default) : "";
      control = h("input", {
        ...attrs,
        type: "text",
        value: shown,
        placeholder,
        list: listId,
        inputmode: kind === "number" ? "decimal" : undefined,
        autocomplete: "off",
      });
      control.addEventListener("input", () => this.typed(control, kind, path, error));
      if (registry) {
        const names = h(
          "datalist",
          { id: listId },
          registry.map((n) => h("option", { value: n })),
        );
        return this.wrap(key, id, control, help, error, name, sections, names);
      }
    }
    return this.wrap(key, id, control, help, error, name, sections);
  }

  wrap(key, id, control, help, error, name, sections, ...extra) {
    this.fields.set(name, { error, control, sections });
    return h(
      "div",
      { class: "field", dataset: { field: name } },
      fieldLabel(id, name, key),
      control,
      ...extra,
      help,
      error,
    );
  }

  typed(control, kind, path, error) {
    const text = control.value;
    if (text.trim() === "") return this.edit(path, undefined);
    if (kind === "number") {
      const number = Number(text);
      // Not a number: sent as typed, so the validator answers with the CLI's message for it.
      return this.edit(path, Number.isFinite(number) ? number : text);
    }
    if (kind !== "yaml") return this.edit(path, text);
    try {
      this.edit(path, load(text));
    } catch (err) {
      this.mark(error, control, `not valid YAML: ${err.reason || err.message}`);
    }
  }

  edit(path, value, structural = false) {
    setAt(this.doc, path, value);
    if (structural) this.rerender();
    this.onEdit(this.doc);
  }

  /** Rebuild the controls (a list or a shape changed) with the same sections open. */
  rerender() {
    const open = [...this.element.querySelectorAll("details[open]")].map((d) => d.id);
    this.render(this.doc);
    for (const d of this.element.querySelectorAll("details")) d.open = open.includes(d.id);
  }

  /** Show each `{field, message}` at its field, else at the nearest enclosing one; return those with no place. */
  showErrors(errors) {
    for (const { error, control } of this.fields.values()) this.mark(error, control, "");
    const unplaced = [];
    const messages = new Map();
    for (const e of errors) {
      let path = e.field;
      while (path && !this.fields.has(path)) path = path.includes(".") ? path.slice(0, path.lastIndexOf(".")) : "";
      if (!path) {
        unplaced.push(e);
        continue;
      }
      const text = path === e.field ? e.message : `${e.field}: ${e.message}`;
      messages.set(path, [...(messages.get(path) || []), text]);
    }
    for (const [path, texts] of messages) {
      const { error, control, sections } = this.fields.get(path);
      this.mark(error, control, texts.join("\n"));
      for (const s of sections) s.open = true;
    }
    return unplaced;
  }

  mark(error, control, message) {
    error.textContent = message;
    error.hidden = !message;
    if (control) control.setAttribute("aria-invalid", message ? "true" : "false");
  }
}

/** The key on screen; the whole dotted path as its accessible name (keys repeat: `explorer.judge.temperature`). */
function fieldLabel(id, name, key) {
  const prefix = name.slice(0, name.length - key.length);
  return h("label", { for: id }, prefix && h("span", { class: "visually-hidden" }, prefix), key);
}

function optionLabel(value) {
  if (value === "") return '"" (empty)';
  return typeof value === "string" ? value : JSON.stringify(value);
}
