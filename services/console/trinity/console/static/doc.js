// The config being edited as a plain object (what the YAML says): read and write a value at a path.
// Unset keys are removed rather than written as defaults, so the YAML holds only what the user chose.

export function getAt(doc, path) {
  return path.reduce((node, key) => (node === undefined || node === null ? undefined : node[key]), doc);
}

/** Set `value` at `path` (creating parents); `undefined` removes the key and any parent it leaves empty. */
export function setAt(doc, path, value) {
  const parents = [doc];
  let node = doc;
  for (const key of path.slice(0, -1)) {
    if (node[key] === undefined || node[key] === null || typeof node[key] !== "object") {
      if (value === undefined) return;
      node[key] = typeof key === "number" ? [] : {};
    }
    node = node[key];
    parents.push(node);
  }
  const last = path[path.length - 1];
  if (value !== undefined) {
    node[last] = value;
    return;
  }
  delete node[last];
  for (let i = path.length - 2; i >= 0; i -= 1) {
    const child = parents[i + 1];
    if (Array.isArray(child) || Object.keys(child).length) break;
    delete parents[i][path[i]];
  }
}

/** The dotted form the validator names fields in: `buffer.eval_tasksets.0.path`. */
export function dotted(path) {
  return path.join(".");
}
