// Reading the run-config JSON schema (pydantic's model_json_schema): references, optional values, unions.

/** Follow `$ref` into `$defs`; keep the outer description and default, which pydantic puts beside a `$ref`. */
export function deref(root, node) {
  if (!node?.$ref) return node;
  const target = root.$defs[node.$ref.split("/").pop()];
  const { $ref, ...outer } = node;
  return { ...target, ...outer, title: outer.title || target.title, refTitle: target.title };
}

/** Drop the `null` alternative of an optional value: `anyOf: [X, {type: null}]` reads as X. */
export function unwrapOptional(root, node) {
  const alternatives = node.anyOf || node.oneOf;
  if (!alternatives) return deref(root, node);
  const present = alternatives.filter((a) => a.type !== "null");
  if (present.length !== 1) return node;
  const { anyOf, oneOf, ...outer } = node;
  const inner = deref(root, present[0]);
  return { ...inner, ...outer, title: outer.title || inner.title, nullable: present.length < alternatives.length };
}

/** The shapes a union value may take, structured ones first (a free-form dict matches anything, so it comes last). */
export function variants(root, node) {
  const alternatives = (node.anyOf || node.oneOf || []).filter((a) => a.type !== "null").map((a) => deref(root, a));
  if (alternatives.length < 2 || !alternatives.every((a) => a.type === "object" || a.properties)) return null;
  return [...alternatives.filter((a) => a.properties), ...alternatives.filter((a) => !a.properties)];
}

/** The property whose `const` tells the variants apart (`backend: torch | megatron`), if there is one. */
export function discriminator(options) {
  const first = options[0]?.properties || {};
  return Object.keys(first).find((key) => options.every((o) => o.properties?.[key]?.const !== undefined)) || null;
}

/** The variant a value is written in: by its discriminator, else the first whose fields hold all its keys. */
export function chooseVariant(options, key, value) {
  if (key) {
    const match = options.find((o) => o.properties[key].const === value?.[key]);
    return match || options.find((o) => o.properties[key].default !== undefined) || options[0];
  }
  const keys = Object.keys(value || {});
  return options.find((o) => (o.properties ? keys.every((k) => k in o.properties) : true)) || options[0];
}

/** The kind of control a (dereferenced) schema node gets. */
export function controlKind(node) {
  if (node.enum || node.const !== undefined) return "enum";
  if (node.type === "boolean") return "boolean";
  if (node.type === "integer" || node.type === "number") return "number";
  if (node.type === "string") return "string";
  if (node.properties) return "object";
  if (node.type === "array" && node.items?.properties) return "objects";
  return "yaml"; // dicts, lists of scalars, pairs, mixed unions: edited as a YAML flow value
}

/** "integer ≥ 1 · default 8": what a reader needs to fill the field. */
export function typeHint(node) {
  const parts = [node.enum ? "one of the options" : node.type || "value"];
  if (node.minimum !== undefined) parts[0] += ` ≥ ${node.minimum}`;
  if (node.exclusiveMinimum !== undefined) parts[0] += ` > ${node.exclusiveMinimum}`;
  if (node.maximum !== undefined) parts[0] += ` ≤ ${node.maximum}`;
  if (node.exclusiveMaximum !== undefined) parts[0] += ` < ${node.exclusiveMaximum}`;
  const shown = node.default === null || node.default === undefined ? "" : JSON.stringify(node.default);
  if (shown && shown.length <= 40) parts.push(`default ${shown}`);
  else if (node.nullable) parts.push("default unset");
  return parts.join(" · ");
}
