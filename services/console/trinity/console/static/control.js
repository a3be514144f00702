// Run control (docs/console.md, "Pause and resume", "Explorers"): pausing a run to free its services and queueing
// it again, and the explorers a run has against those it wants, with the control that scales them.
import { api, ApiError } from "./api.js";
import { h } from "./dom.js";

const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const PAUSABLE = new Set(["PENDING", "RUNNING"]);

/** Pause run / Resume run, whichever the run's state allows; `changed(run)` hands the page the run as it is now. */
export class PauseControls {
  constructor(runId, changed) {
    this.runId = runId;
    this.changed = changed;
    this.pauseButton = h("button", { type: "button", onclick: () => this.act("pause") }, "Pause run");
    this.resumeButton = h(
      "button",
      { type: "button", onclick: () => this.act("resume"), "aria-describedby": "resume-why" },
      "Resume run",
    );
    // A disabled button takes no focus and gives no tooltip: the reason is text beside it, which it names.
    this.why = h("small", { id: "resume-why", class: "help", hidden: true });
    this.status = h("p", { role: "status", id: "pause-status" });
    this.element = h(
      "div",
      { class: "run-control" },
      h(
        "div",
        { class: "toolbar", role: "group", "aria-label": "Pause or resume the run" },
        this.pauseButton,
        this.resumeButton,
        this.why,
      ),
      this.status,
    );
  }

  show(run) {
    this.pauseButton.hidden = !PAUSABLE.has(run.state);
    this.resumeButton.hidden = run.state !== "PAUSED";
    this.resumeButton.disabled = run.pausing;
    this.why.hidden = !run.pausing;
    this.why.textContent = run.pausing
      ? "Pausing: its services are still stopping (the trainer checkpoints first). It resumes once they have."
      : "";
    if (this.stopping && run.state === "PAUSED" && !run.pausing) {
      this.stopping = false;
      this.status.textContent = `Paused at train step ${run.train_step}: its services are free for other runs.`;
    }
    if (TERMINAL.has(run.state)) this.status.textContent = "";
  }

  async act(action) {
    this.status.textContent = action === "pause" ? "Pausing…" : "Resuming…";
    try {
      const run = await api(`api/runs/${encodeURIComponent(this.runId)}/${action}`, { method: "POST" });
      this.status.textContent =
        action === "pause"
          ? run.pausing
            ? "Pausing: the trainer checkpoints after the step in progress, explorers put their batch."
            : "Paused: no service was working on it."
          : "Resumed: queued again; it continues from its checkpoint once services are free.";
      this.stopping = run.pausing; // the poll that finds every service stopped says so
      this.changed(run);
    } catch (err) {
      this.status.textContent = err.message;
    }
  }
}

/** The run's explorers (each instance, marked when leaving), "n of wanted", and the scale control. */
export class ExplorersPanel {
  constructor(runId, changed) {
    this.runId = runId;
    this.changed = changed;
    this.count = h("p", { id: "explorers-count" });
    this.list = h("ul", { id: "explorers-list", class: "instances" });
    this.input = h("input", {
      id: "scale-explorers",
      name: "explorers",
      type: "number",
      min: 1,
      step: 1,
      inputmode: "numeric",
      autocomplete: "off",
      "aria-describedby": "scale-explorers-help scale-explorers-error",
    });
    this.help = h("small", { id: "scale-explorers-help", class: "help" });
    this.error = h("p", { id: "scale-explorers-error", class: "error", hidden: true });
    this.status = h("p", { role: "status", id: "scale-status" });
    this.form = h(
      "form",
      { class: "knob", novalidate: true },
      h("label", { for: "scale-explorers" }, "Explorers wanted"),
      this.input,
      h("button", { type: "submit" }, "Scale explorers"),
      this.help,
      this.error,
    );
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      const text = this.input.value.trim();
      // Sent as typed when it is not a whole number, so the gateway's message (or the API's) names the field.
      this.scale(text !== "" && Number.isInteger(Number(text)) ? Number(text) : text);
    });
    this.element = h(
      "section",
      { "aria-labelledby": "explorers-title", class: "panel" },
      h("h2", { id: "explorers-title" }, "Explorers"),
      this.count,
      this.list,
      this.form,
      this.status,
    );
  }

  show(run) {
    const { wanted, active, leaving } = run.explorers;
    const running = run.state === "RUNNING";
    this.form.hidden = !wanted; // this stage has no explorers (train mode)
    this.count.textContent = wanted
      ? `${active.length} of ${wanted} explorer(s)${leaving.length ? `, ${leaving.length} leaving` : ""}`
      : "This stage has no explorers.";
    this.list.replaceChildren(
      ...active.map((id) => h("li", { class: "mono", dataset: { instanceId: id } }, id)),
      ...leaving.map((id) =>
        h(
          "li",
          { class: "mono", dataset: { instanceId: id, leaving: "" } },
          id,
          " ",
          h("span", { class: "tag" }, "leaving"),
        ),
      ),
    );
    if (!this.filled) this.input.value = wanted; // once: later polls leave what the user typed alone
    this.filled = true;
    for (const control of this.form.querySelectorAll("input, button")) control.disabled = !running;
    this.help.textContent = running
      ? "Free explorers join and start from the current weights; the surplus finishes its batch, then leaves."
      : "Only a running run scales.";
  }

  async scale(explorers) {
    this.showError([]);
    this.status.textContent = "Scaling…";
    try {
      const run = await api(`api/runs/${encodeURIComponent(this.runId)}/scale`, {
        method: "POST",
        body: { explorers },
      });
      this.status.textContent = `Scaling to ${run.explorers.wanted} explorer(s).`;
      this.show(run);
      this.changed(run);
    } catch (err) {
      this.status.textContent = err.message;
      if (err instanceof ApiError) this.showError(err.errors);
    }
  }

  showError(errors) {
    const mine = errors.filter((e) => e.field === "explorers");
    this.error.textContent = mine.map((e) => e.message).join("\n");
    this.error.hidden = !mine.length;
    this.input.setAttribute("aria-invalid", mine.length ? "true" : "false");
  }
}
