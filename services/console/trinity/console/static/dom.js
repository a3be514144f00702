// Small DOM helpers shared by the views: element building without a framework.

/** h("td", {class: "num"}, "3") builds an element; attributes starting with "on" become listeners. */
export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (value === undefined || value === null || value === false) continue;
    if (key.startsWith("on")) el.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
}

/** Replace everything inside `el`. */
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

/** A value as a short readable string: numbers to 4 significant digits. */
export function fmt(value) {
  if (value === null || value === undefined || value === "") return "";
  if (typeof value === "number") {
    if (Number.isInteger(value)) return String(value);
    return Math.abs(value) >= 1e4 || Math.abs(value) < 1e-3 ? value.toExponential(2) : String(+value.toPrecision(4));
  }
  return String(value);
}

/** A run's state as a badge. A paused run whose services are still stopping reads PAUSING: it cannot resume yet. */
export function stateBadge(run, attrs = {}) {
  const label = run.pausing ? "PAUSING" : run.state;
  return h("span", { ...attrs, class: `state state-${label}` }, label);
}

/** Milliseconds since `unixMs` as "12 s", "3 min", "2 h". */
export function age(unixMs) {
  const seconds = Math.max(0, (Date.now() - unixMs) / 1000);
  if (seconds < 90) return `${Math.round(seconds)} s`;
  if (seconds < 5400) return `${Math.round(seconds / 60)} min`;
  return `${Math.round(seconds / 3600)} h`;
}

/** Call `fn` once `ms` after the last call. */
export function debounce(fn, ms) {
  let timer;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

/** A unique id for label/control pairs. */
let counter = 0;
export function uid(prefix) {
  counter += 1;
  return `${prefix}-${counter}`;
}
