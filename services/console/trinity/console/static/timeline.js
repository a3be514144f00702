// The run view's timeline (docs/console.md, "Timeline"): what each service did in the newest steps, from the spans
// the services report (GET api/runs/{id}/spans). One lane per trainer and per explorer, one for weight sync; time
// runs left to right, so overlap between trainer and explorers and the gaps where a lane idles show at a glance.
// Plain SVG, no library.
import { api } from "./api.js";
import { fill, h } from "./dom.js";

const SVG = "http://www.w3.org/2000/svg";
export const STEPS_SHOWN = 4; // the newest steps drawn (with the start-up, step 0, while it is among them)
const WIDTH = 1000; // viewBox units of the time axis; the SVG scales to the panel
const LABEL = 130; // the lane names' column
const LANE = 38; // a row of step marks, then the bars
const STEP_ROW = 11;
const BAR = LANE - STEP_ROW - 3; // a bar's height
const AXIS = 22;
// Sync lane: the weight versions moving from the trainer to the explorers.
const SYNC = new Set(["sync_form", "publish_weights", "weight_receive", "weight_load"]);
// Waiting, not working: drawn hatched and left out of a lane's busy share.
const WAITING = new Set(["weight_wait", "read_batch", "sync_form"]);
// Inside another span of the same lane (rewards are scored during the rollouts): drawn as a thin bar over it.
const INNER = new Set(["reward"]);
export const PHASES = {
  model_convert: ["convert model", "#9ca3af"],
  engine_start: ["engine start", "#6b7280"],
  model_load: ["model load", "#6b7280"],
  sync_form: ["sync group", "#d1d5db"],
  weight_wait: ["wait for weights", "#e5e7eb"],
  weight_receive: ["receive weights", "#e9d5ff"],
  weight_load: ["load weights", "#a855f7"],
  lease: ["lease", "#fcd34d"],
  rollout: ["rollout", "#2563eb"],
  reward: ["reward", "#f59e0b"],
  put: ["put", "#0891b2"],
  evaluate: ["evaluate", "#059669"],
  read_batch: ["read batch", "#e5e7eb"],
  prepare: ["prepare", "#f472b6"],
  forward_backward: ["forward/backward", "#db2777"],
  optimizer: ["optimizer", "#9d174d"],
  checkpoint: ["checkpoint", "#78716c"],
  publish_weights: ["publish weights", "#581c87"],
  export: ["export", "#57534e"],
};

function svg(tag, attrs = {}, ...children) {
  const el = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  el.append(...children);
  return el;
}

/** The lane a span is drawn in: "sync" for weight movement, else its service instance ("explorer/e-0"). */
export function laneOf(span) {
  return SYNC.has(span.phase) ? "sync" : span.source;
}

/** Lanes in reading order: trainers, explorers, then sync. */
function laneOrder(lanes) {
  const rank = (lane) => (lane.startsWith("trainer/") ? 0 : lane === "sync" ? 2 : 1);
  return [...lanes].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
}

/** The milliseconds covered by `intervals` ([start, end] pairs), overlaps counted once. */
export function covered(intervals) {
  let total = 0;
  let reach = -Infinity;
  for (const [start, end] of [...intervals].sort((a, b) => a[0] - b[0])) {
    if (end <= reach) continue;
    total += end - Math.max(start, reach);
    reach = end;
  }
  return total;
}

/** A lane as people read it: the instance id ("explorer-0"), "weight sync". */
export function laneName(lane) {
  return lane === "sync" ? "weight sync" : lane.slice(lane.indexOf("/") + 1);
}

/** The spans of the newest `steps` steps, a running span ending `now`. A receive starts no earlier than the publish
 * of its version, nor than the window (the explorer listens for an announcement up to a second before it comes). */
export function shownSpans(spans, steps = STEPS_SHOWN, now = Date.now()) {
  const newest = Math.max(0, ...spans.map((s) => s.step));
  const first = Math.max(0, newest - steps + 1);
  const published = new Map(
    spans.filter((s) => s.phase === "publish_weights").map((s) => [`${s.stage}/${s.model_version}`, s.start_unix_ms]),
  );
  const kept = spans.filter((s) => s.step >= first);
  const opened = Math.min(...kept.filter((s) => s.phase !== "weight_receive").map((s) => s.start_unix_ms));
  return kept.map((s) => {
    const end = s.end_unix_ms || now;
    if (s.phase !== "weight_receive") return { ...s, start: s.start_unix_ms, end };
    const from = Math.max(published.get(`${s.stage}/${s.model_version}`) ?? -Infinity, opened);
    return { ...s, start: Math.min(end, Math.max(s.start_unix_ms, from)), end };
  });
}

export class Timeline {
  constructor(runId) {
    this.runId = runId;
    this.spans = [];
    this.figure = h("figure", { class: "timeline", id: "timeline" });
    this.caption = h("p", { class: "muted", id: "timeline-caption" }, "No spans yet.");
    this.legend = h("ul", { class: "timeline-legend", "aria-label": "Phases" });
    this.element = h(
      "section",
      { "aria-labelledby": "timeline-title", class: "panel" },
      h("h2", { id: "timeline-title" }, "Timeline"),
      this.caption,
      this.figure,
      this.legend,
    );
  }

  /** Fetch the spans of the newest steps (`latestStep`: the run's newest step, to ask for no more) and draw. */
  async refresh(latestStep = 0) {
    const since = Math.max(0, latestStep - STEPS_SHOWN + 1);
    const { spans } = await api(`api/runs/${encodeURIComponent(this.runId)}/spans?since_step=${since}`);
    this.spans = spans;
    this.draw();
  }

  draw(now = Date.now()) {
    const shown = shownSpans(this.spans, STEPS_SHOWN, now);
    this.figure.dataset.spans = String(shown.length);
    if (!shown.length) {
      this.figure.replaceChildren();
      fill(this.legend);
      return;
    }
    const t0 = Math.min(...shown.map((s) => s.start));
    const t1 = Math.max(...shown.map((s) => s.end), t0 + 1);
    const x = (t) => LABEL + ((t - t0) / (t1 - t0)) * WIDTH;
    const lanes = laneOrder(new Set(shown.map(laneOf)));
    const height = AXIS + lanes.length * LANE + 4;
    const chart = svg("svg", {
      viewBox: `0 0 ${LABEL + WIDTH + 8} ${height}`,
      role: "img",
      "aria-labelledby": "timeline-caption",
    });
    chart.append(
      svg(
        "defs",
        {},
        svg(
          "pattern",
          { id: "waiting", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" },
          svg("rect", { width: 6, height: 6, fill: "#f3f4f6" }),
          svg("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#cbd5e1", "stroke-width": 3 }),
        ),
      ),
    );
    this.axis(chart, t0, t1, x, height);
    const busy = {};
    lanes.forEach((lane, i) => {
      const y = AXIS + i * LANE;
      const mine = shown.filter((s) => laneOf(s) === lane);
      const working = mine.filter((s) => !WAITING.has(s.phase)).map((s) => [s.start, s.end]);
      busy[lane] = covered(working) / (t1 - t0);
      const name = laneName(lane);
      chart.append(
        svg("rect", { x: LABEL, y: y + STEP_ROW, width: WIDTH, height: LANE - STEP_ROW - 2, class: "lane" }),
        svg("text", { x: 4, y: y + LANE / 2 + 1, class: "lane-name" }, name.length > 18 ? `${name.slice(0, 17)}…` : name),
        svg(
          "text",
          { x: 4, y: y + LANE / 2 + 12, class: "lane-busy" },
          `busy ${Math.round(busy[lane] * 100)}%`,
        ),
      );
      for (const span of [...mine].sort((a, b) => INNER.has(a.phase) - INNER.has(b.phase))) {
        chart.append(this.bar(span, x, y + STEP_ROW));
      }
      if (lane !== "sync") this.stepMarks(chart, mine, x, y);
    });
    this.figure.replaceChildren(chart);
    const steps = [...new Set(shown.map((s) => s.step))].sort((a, b) => a - b);
    const seconds = ((t1 - t0) / 1000).toFixed(1);
    const share = lanes.map((lane) => `${laneName(lane)} busy ${Math.round(busy[lane] * 100)}%`).join(", ");
    this.caption.textContent = `Steps ${steps[0]}–${steps.at(-1)} over ${seconds} s: ${share}.`;
    const present = new Set(shown.map((s) => s.phase));
    fill(
      this.legend,
      Object.entries(PHASES)
        .filter(([phase]) => present.has(phase))
        .map(([phase, [label, color]]) =>
          h(
            "li",
            {},
            h("span", { class: "swatch", style: `background:${WAITING.has(phase) ? "#e5e7eb" : color}` }),
            label,
          ),
        ),
    );
  }

  /** "step 7" above where a lane's step 7 begins. */
  stepMarks(chart, spans, x, y) {
    const begins = new Map();
    for (const s of spans) begins.set(s.step, Math.min(begins.get(s.step) ?? Infinity, s.start));
    for (const [step, start] of begins) {
      const at = x(start);
      chart.append(
        svg("line", { x1: at, x2: at, y1: y + 1, y2: y + LANE - 2, class: "step-mark" }),
        svg("text", { x: at + 2, y: y + STEP_ROW - 2, class: "step-label" }, step ? `step ${step}` : "start-up"),
      );
    }
  }

  axis(chart, t0, t1, x, height) {
    const span = t1 - t0;
    const step =
      [0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600].find((s) => span / (s * 1000) <= 10) ||
      1200;
    for (let t = 0; t <= span; t += step * 1000) {
      const at = x(t0 + t);
      chart.append(svg("line", { x1: at, x2: at, y1: AXIS - 4, y2: height, class: "tick" }));
      if (at < LABEL + WIDTH - 30) {
        chart.append(svg("text", { x: at + 2, y: AXIS - 8, class: "tick-label" }, `${+(t / 1000).toFixed(2)} s`));
      }
    }
  }

  /** One span's bar; `y` is the top of its lane's bar row. */
  bar(span, x, y) {
    const [label, color] = PHASES[span.phase] || [span.phase, "#9ca3af"];
    const inner = INNER.has(span.phase);
    const left = x(span.start);
    const width = Math.max(1, x(span.end) - left);
    const seconds = ((span.end - span.start) / 1000).toFixed(2);
    const detail = span.detail ? ` · ${span.detail}` : "";
    const title = `${label} · step ${span.step} · v${span.model_version} · ${seconds} s${detail} (${span.source})`;
    const group = svg(
      "g",
      { "data-phase": span.phase, "data-step": span.step, "data-lane": laneOf(span) },
      svg("title", {}, title),
      svg("rect", {
        x: left,
        y: inner ? y + BAR - 5 : y + 1,
        width,
        height: inner ? 5 : BAR - 1,
        fill: WAITING.has(span.phase) ? "url(#waiting)" : color,
        class: span.end_unix_ms ? "span" : "span running",
      }),
    );
    if (!inner && width > label.length * 6 + 8) {
      const dark = !WAITING.has(span.phase) && !["#fcd34d", "#e9d5ff", "#e5e7eb", "#d1d5db"].includes(color);
      group.append(
        svg("text", { x: left + 4, y: y + BAR / 2 + 4, class: dark ? "span-label light" : "span-label" }, label),
      );
    }
    return group;
  }
}
