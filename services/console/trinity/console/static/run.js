// Run view: live curves and the event log from the run's event stream (SSE, no reload), the services serving it
// with their health, its explorers and their scale, pause and resume, experience accounting, steering, and
// evaluations compared.
import { api } from "./api.js";
import { ChartGrid } from "./charts.js";
import { ExplorersPanel, PauseControls } from "./control.js";
import { debounce, fill, h, stateBadge } from "./dom.js";
import { EvalCompare } from "./evals.js";
import { AccountingPanel, EventLog, pairs, ServicesPanel } from "./panels.js";
import { SteerPanel } from "./steer.js";
import { Timeline } from "./timeline.js";
import { chartUpdated, viewReady } from "./timings.js";

const REFRESH_MS = 2000;
const EVALS_DELAY_MS = 500;
const TIMELINE_DELAY_MS = 1000;
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const STEPS = { train: "train_step", explore: "explore_step" };
const SPAN_CARRIERS = new Set(["train", "explore", "span", "weights", "finished"]);

export async function mountRun(main, runId) {
  const path = `api/runs/${encodeURIComponent(runId)}`;
  const run = await api(path);
  const title = h("h1", {}, run.name || runId);
  const summary = h("dl", { class: "summary", id: "run-summary" });
  const charts = new ChartGrid(chartUpdated);
  const steer = new SteerPanel(runId);
  // After a pause, resume or scale: the state it answered at once, the rest (services) by polling now.
  const changed = ({ state, pausing }) => {
    Object.assign(current, { state, pausing });
    showSummary();
    refresh().catch(() => {});
  };
  const pause = new PauseControls(runId, changed);
  const explorers = new ExplorersPanel(runId, changed);
  const services = new ServicesPanel();
  const accounting = new AccountingPanel();
  const log = new EventLog();
  const evals = new EvalCompare(runId);
  const refreshEvals = debounce(() => evals.refresh().catch(() => {}), EVALS_DELAY_MS); // once per burst
  const timeline = new Timeline(runId);
  const newestStep = () => Math.max(current.train_step, current.explore_step);
  const refreshTimeline = debounce(() => timeline.refresh(newestStep()).catch(() => {}), TIMELINE_DELAY_MS);

  fill(
    main,
    title,
    summary,
    pause.element,
    h("p", {}, h("a", { href: `#/runs/${encodeURIComponent(runId)}/experiences` }, "Inspect experiences")),
    h(
      "section",
      { "aria-labelledby": "curves-title", class: "panel" },
      h("h2", { id: "curves-title" }, "Curves"),
      charts.element,
    ),
    timeline.element,
    h("div", { class: "two-up" }, steer.element, h("div", {}, explorers.element, services.element, accounting.element)),
    log.element,
    evals.element,
  );
  charts.attach();

  // The newer of what the poll says and what events said since (events come first; steps only grow).
  const current = { ...run };
  const showSummary = () => {
    title.textContent = current.name || runId;
    fill(
      summary,
      pairs({
        Run: current.id,
        Mode: current.mode,
        State: stateBadge(current, { id: "run-state" }),
        "Train step": current.train_step,
        "Explore step": current.explore_step,
        "Weight version": current.model_version,
        ...(current.error ? { Error: h("span", { class: "error" }, current.error) } : {}),
      }),
    );
    pause.show(current);
  };
  const summaryLater = debounce(showSummary, 0); // once per burst of events
  const show = (detail) => {
    for (const key of Object.values(STEPS).concat("model_version")) detail[key] = Math.max(detail[key], current[key]);
    Object.assign(current, detail);
    showSummary();
    services.show(detail.services || []);
    explorers.show(detail);
    accounting.show(detail.accounting || {});
    steer.setLive(!TERMINAL.has(detail.state));
  };
  show(run);

  const onEvent = (message) => {
    const receivedAt = performance.now();
    const event = JSON.parse(message.data);
    log.add(event);
    steer.noteEvent(event);
    if (STEPS[event.kind]) current[STEPS[event.kind]] = Math.max(current[STEPS[event.kind]], event.step);
    current.model_version = Math.max(current.model_version, event.model_version);
    if (event.kind === "state") {
      current.state = event.state;
      // A pause stops the services the run has; the next poll says when the last one has gone.
      current.pausing = event.state === "PAUSED" && (current.services || []).some((s) => s.role !== "buffer");
    }
    summaryLater();
    if (event.kind === "eval") refreshEvals();
    if (SPAN_CARRIERS.has(event.kind)) refreshTimeline(); // a step's spans (or a phase's), once a burst is over
    charts.add(event, receivedAt);
    if (event.kind === "state" && TERMINAL.has(event.state)) stream.close(); // the stream ends with the run
  };
  const stream = new EventSource(`${path}/events`);
  stream.addEventListener("message", onEvent);

  let timer = null;
  const refresh = async () => {
    const detail = await api(path);
    show(detail);
    timeline.refresh(newestStep()).catch(() => {}); // the steps since, and a phase still running grows
    if (TERMINAL.has(detail.state)) {
      clearInterval(timer);
      stream.close();
    }
  };
  await evals.refresh();
  await timeline.refresh(newestStep()).catch(() => {});
  timer = setInterval(() => refresh().catch(() => {}), REFRESH_MS);
  viewReady("run");
  return () => {
    clearInterval(timer);
    stream.close();
    charts.close();
  };
}
