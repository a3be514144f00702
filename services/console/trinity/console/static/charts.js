// The run view's live curves (uPlot): each chart plots metrics of one or two event kinds against the step
// (held-out accuracy against the weight version). Metric names are what the trainer and explorer report
// (`ctx.report("explore", ...)`, `self._report("train", ...)`); the first name present is used. A chart with
// `each` also draws one series per task set, from the metrics named `<prefix><task set>`, once two sets report.
import uPlot from "./vendor/uplot.js";
import { fmt, h } from "./dom.js";

export const CHARTS = [
  {
    id: "reward",
    title: "Rollout reward",
    series: [{ kind: "explore", keys: ["reward_mean"], label: "reward mean" }],
    each: { kind: "explore", prefix: "reward_mean/" },
  },
  {
    id: "accuracy",
    title: "Held-out accuracy",
    x: "model_version",
    series: [{ kind: "eval", keys: ["accuracy"], label: "accuracy" }],
    each: { kind: "eval", prefix: "accuracy/" },
  },
  { id: "loss", title: "Loss", series: [{ kind: "train", keys: ["loss/total", "loss"], label: "loss" }] },
  { id: "kl", title: "KL", series: [{ kind: "train", keys: ["kl"], label: "KL" }] },
  { id: "entropy", title: "Entropy", series: [{ kind: "train", keys: ["entropy"], label: "entropy" }] },
  {
    id: "step-time",
    title: "Step time (s)",
    series: [
      { kind: "train", keys: ["seconds"], label: "train" },
      { kind: "explore", keys: ["seconds"], label: "explore" },
    ],
  },
  {
    id: "throughput",
    title: "Tokens/s",
    series: [
      { kind: "train", keys: ["tokens_per_s"], label: "train" },
      { kind: "explore", keys: ["tokens_per_second"], label: "explore" },
    ],
  },
  {
    id: "staleness",
    title: "Staleness (versions)",
    series: [
      { kind: "train", keys: ["staleness/mean"], label: "mean" },
      { kind: "train", keys: ["staleness/max"], label: "max" },
    ],
  },
  {
    id: "consistency",
    title: "Train vs rollout log-probs",
    series: [
      { kind: "train", keys: ["consistency/logprob_diff_mean"], label: "mean |Δ|" },
      { kind: "train", keys: ["consistency/k3_kl"], label: "k3 KL" },
      { kind: "train", keys: ["consistency/ratio_outside_share"], label: "ratio outside" },
    ],
  },
];

// A flat series (all rewards 0 at first) or a single point gets a unit band around it, not uPlot's 0..100.
const spread = (u, min, max) => (min === max ? [min - 1, max + 1] : uPlot.rangeNum(min, max, 0.1, true));

/** Axis ticks short enough for the axis: 27k, 0.05, 3e-9. */
function tick(value) {
  const size = Math.abs(value);
  if (size >= 1e4) return `${+(value / 1e3).toPrecision(3)}k`;
  if (size !== 0 && size < 1e-3) return value.toExponential(0);
  return String(+value.toPrecision(3));
}

const COLORS = ["#2563eb", "#db2777", "#059669", "#d97706", "#7c3aed", "#0891b2", "#65a30d", "#dc2626"];
const HEIGHT = 180;

/** One chart: its points by series, drawn by uPlot; `data-points` on the figure says how many it holds. */
class Chart {
  constructor(spec) {
    this.spec = spec;
    this.points = spec.series.map(() => new Map()); // x -> y, per series
    this.sets = new Map(); // task set -> (x -> y), the `each` series
    this.shown = 0; // series in the plot as built
    this.latest = h("span", { class: "latest" }, "no points yet");
    this.canvas = h("div", { class: "plot" });
    this.figure = h(
      "figure",
      { class: "chart", dataset: { chart: spec.id, points: 0 }, "aria-label": spec.title },
      h("figcaption", {}, spec.title, " ", this.latest),
      this.canvas,
    );
    this.plot = null;
  }

  /** The series to draw: the spec's, then one per task set once there are two (one would repeat the overall). */
  drawn() {
    const fixed = this.spec.series.map((s, i) => ({ label: s.label, points: this.points[i] }));
    const sets = this.sets.size > 1 ? [...this.sets.keys()].sort() : [];
    return [...fixed, ...sets.map((name) => ({ label: name, points: this.sets.get(name) }))];
  }

  attach() {
    const width = Math.max(200, this.canvas.clientWidth || 300);
    const drawn = this.drawn();
    this.shown = drawn.length;
    this.plot = new uPlot(
      {
        width,
        height: HEIGHT,
        legend: { show: drawn.length > 1, live: false },
        scales: { x: { time: false, range: spread }, y: { range: spread } },
        axes: [
          { label: this.spec.x === "model_version" ? "version" : "step" },
          { size: 56, values: (u, ticks) => ticks.map(tick) },
        ],
        series: [
          { label: this.spec.x === "model_version" ? "version" : "step" },
          ...drawn.map((s, i) => ({ label: s.label, stroke: COLORS[i % COLORS.length], width: 2, spanGaps: true })),
        ],
      },
      this.data(),
      this.canvas,
    );
  }

  resize() {
    if (this.plot && this.canvas.clientWidth) this.plot.setSize({ width: this.canvas.clientWidth, height: HEIGHT });
  }

  /** Take the event's values for this chart; true when something changed. */
  add(event) {
    let changed = false;
    this.spec.series.forEach((series, i) => {
      if (series.kind !== event.kind) return;
      const key = series.keys.find((k) => typeof event.metrics?.[k] === "number");
      if (!key) return;
      this.points[i].set(event[this.spec.x || "step"], event.metrics[key]);
      this.latest.textContent = `${series.label} ${fmt(event.metrics[key])}`;
      changed = true;
    });
    const each = this.spec.each;
    if (each?.kind === event.kind) {
      for (const [key, value] of Object.entries(event.metrics || {})) {
        if (!key.startsWith(each.prefix) || typeof value !== "number") continue;
        const name = key.slice(each.prefix.length);
        if (!this.sets.has(name)) this.sets.set(name, new Map());
        this.sets.get(name).set(event[this.spec.x || "step"], value);
        changed = true;
      }
    }
    return changed;
  }

  /** uPlot's aligned columns: the sorted xs, then each series' y at every x (null where it has none). */
  data() {
    const drawn = this.drawn().map((s) => s.points);
    const xs = [...new Set(drawn.flatMap((p) => [...p.keys()]))].sort((a, b) => a - b);
    return [xs, ...drawn.map((p) => xs.map((x) => (p.has(x) ? p.get(x) : null)))];
  }

  redraw() {
    const drawn = this.drawn();
    this.figure.dataset.points = String(drawn.reduce((n, s) => n + s.points.size, 0));
    if (this.plot && drawn.length !== this.shown) {
      this.plot.destroy(); // a new task set's series: uPlot's series are fixed when it is built
      this.attach();
    } else {
      this.plot?.setData(this.data());
    }
  }
}

/** The grid of every chart. Events are drawn once per animation frame, however many arrive in it (a stream
 * replaying a long run's history sends thousands at once); `onDrawn(event, receivedAt)` follows each one drawn. */
export class ChartGrid {
  constructor(onDrawn = () => {}) {
    this.charts = CHARTS.map((spec) => new Chart(spec));
    this.element = h(
      "div",
      { class: "charts" },
      this.charts.map((c) => c.figure),
    );
    this.observer = new ResizeObserver(() => this.charts.forEach((c) => c.resize()));
    this.onDrawn = onDrawn;
    this.dirty = new Set();
    this.waiting = []; // [event, receivedAt] taken since the last frame
    this.frame = null;
  }

  /** Draw once the grid is in the document (uPlot measures its container). */
  attach() {
    this.charts.forEach((c) => c.attach());
    this.observer.observe(this.element);
  }

  add(event, receivedAt) {
    const changed = this.charts.filter((c) => c.add(event));
    if (!changed.length) return;
    changed.forEach((c) => this.dirty.add(c));
    this.waiting.push([event, receivedAt]);
    this.frame ??= requestAnimationFrame(() => this.draw());
  }

  draw() {
    this.frame = null;
    this.dirty.forEach((c) => c.redraw());
    this.dirty.clear();
    this.waiting.forEach(([event, receivedAt]) => this.onDrawn(event, receivedAt));
    this.waiting = [];
  }

  close() {
    if (this.frame !== null) cancelAnimationFrame(this.frame);
    this.observer.disconnect();
    this.charts.forEach((c) => c.plot?.destroy());
  }
}
