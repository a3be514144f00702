// The run view's read-only panels: the services serving the run, its experience accounting, and its event log.
import { fill, fmt, h } from "./dom.js";

const LOG_ROWS = 300; // newest first; older rows drop off (the stream replays a run's whole history on open)

function panel(id, title, ...children) {
  return h(
    "section",
    { "aria-labelledby": `${id}-title`, class: "panel" },
    h("h2", { id: `${id}-title` }, title),
    ...children,
  );
}

export function table(id, headings, body) {
  const head = h(
    "thead",
    {},
    h(
      "tr",
      {},
      headings.map((t) => h("th", { scope: "col" }, t)),
    ),
  );
  return h("table", { id }, head, body);
}

/** `{term: value}` as the children of a <dl>. */
export function pairs(entries) {
  return Object.entries(entries).flatMap(([k, v]) => [
    h("dt", {}, k),
    h("dd", {}, v instanceof Node ? v : fmt(v ?? 0)),
  ]);
}

export class ServicesPanel {
  constructor() {
    this.body = h("tbody");
    const headings = ["Service", "Role", "Instance", "Address", "Health"];
    this.element = panel(
      "services",
      "Services",
      h("div", { class: "table-wrap" }, table("services", headings, this.body)),
    );
  }

  show(services) {
    fill(
      this.body,
      services.map((s) =>
        h(
          "tr",
          {},
          h("td", {}, s.service),
          h("td", {}, s.role),
          h("td", { class: "mono" }, s.instance_id),
          h("td", { class: "mono" }, s.address),
          h("td", {}, h("span", { class: s.alive ? "ok" : "bad" }, s.alive ? "serving" : "not answering")),
        ),
      ),
    );
  }
}

export class AccountingPanel {
  constructor() {
    this.list = h("dl", { class: "summary", id: "accounting" });
    this.element = panel("accounting", "Experience accounting", this.list);
  }

  show(counts) {
    const dropped = Object.entries(counts.dropped || {});
    fill(
      this.list,
      pairs({
        Put: counts.put,
        Delivered: counts.delivered,
        "Trained (acked)": counts.acked,
        Pending: counts.pending,
        ...Object.fromEntries(dropped.map(([reason, n]) => [`Dropped: ${reason}`, n])),
        ...(dropped.length ? {} : { Dropped: 0 }),
      }),
    );
  }
}

export class EventLog {
  constructor() {
    this.body = h("tbody");
    const headings = ["Seq", "Time", "Kind", "Source", "Step", "Version", "Message"];
    this.element = panel(
      "log",
      "Event log",
      h(
        "div",
        { class: "table-wrap log", role: "log", "aria-labelledby": "log-title" },
        table("event-log", headings, this.body),
      ),
    );
  }

  add(event) {
    this.body.prepend(row(event));
    while (this.body.rows.length > LOG_ROWS) this.body.deleteRow(-1);
  }
}

function row(event) {
  const metrics = Object.entries(event.metrics || {}).slice(0, 4);
  const text = event.message || metrics.map(([k, v]) => `${k}=${fmt(v)}`).join(" ");
  return h(
    "tr",
    { dataset: { kind: event.kind, seq: event.seq } },
    h("td", { class: "num" }, event.seq),
    h("td", {}, new Date(event.unix_ms).toLocaleTimeString()),
    h("td", {}, event.kind),
    h("td", {}, event.source),
    h("td", { class: "num" }, event.step),
    h("td", { class: "num" }, event.model_version),
    h("td", {}, event.state || text),
  );
}
