// Steering a live run (docs/console.md, Steering): cancel; pause and resume exploration; a new learning rate or
// sampling temperature. The services apply each at a step boundary and the run's log records it as a `steer` event.
import { api, ApiError } from "./api.js";
import { h } from "./dom.js";

const KNOBS = [
  { field: "learning_rate", label: "Learning rate", help: "trainer: from the next optimizer update (> 0)" },
  { field: "temperature", label: "Sampling temperature", help: "explorer: from the next explore step (0 to 2)" },
];

export class SteerPanel {
  constructor(runId) {
    this.runId = runId;
    this.paused = false;
    this.status = h("p", { role: "status", id: "steer-status" });
    this.cancelButton = h("button", { type: "button", class: "danger", onclick: () => this.cancel() }, "Cancel run");
    this.pauseButton = h(
      "button",
      { type: "button", onclick: () => this.steer({ pause_exploration: !this.paused }) },
      "Pause exploration",
    );
    this.knobs = KNOBS.map((knob) => this.knobForm(knob));
    this.element = h(
      "section",
      { "aria-labelledby": "steer-title", class: "panel" },
      h("h2", { id: "steer-title" }, "Steer"),
      h("div", { class: "toolbar" }, this.cancelButton, this.pauseButton),
      this.knobs.map((k) => k.form),
      this.status,
    );
  }

  knobForm({ field, label, help }) {
    const id = `steer-${field}`;
    const input = h("input", {
      id,
      name: field,
      type: "text",
      inputmode: "decimal",
      autocomplete: "off",
      "aria-describedby": `${id}-help ${id}-error`,
    });
    const error = h("p", { id: `${id}-error`, class: "error", hidden: true });
    const form = h(
      "form",
      { class: "knob", novalidate: true },
      h("label", { for: id }, label),
      input,
      h("button", { type: "submit" }, `Apply ${label.toLowerCase()}`),
      h("small", { id: `${id}-help`, class: "help" }, help),
      error,
    );
    form.addEventListener("submit", (event) => {
      event.preventDefault();
      const text = input.value.trim();
      // Sent as typed when it is not a number, so the gateway's message names the field.
      this.steer({ [field]: text !== "" && Number.isFinite(Number(text)) ? Number(text) : text });
    });
    return { field, form, input, error };
  }

  async steer(change) {
    this.showErrors([]);
    this.status.textContent = "Applying…";
    try {
      const { applied } = await api(`api/runs/${encodeURIComponent(this.runId)}/steer`, {
        method: "POST",
        body: change,
      });
      this.status.textContent = `Applied: ${applied.join(", ")}.`;
      if ("pause_exploration" in change) this.setPaused(change.pause_exploration);
    } catch (err) {
      this.status.textContent = err.message;
      if (err instanceof ApiError) this.showErrors(err.errors);
    }
  }

  async cancel() {
    this.status.textContent = "Cancelling…";
    try {
      const run = await api(`api/runs/${encodeURIComponent(this.runId)}/cancel`, { method: "POST" });
      this.status.textContent = `Run ${run.state?.toLowerCase?.() || "cancelled"}.`;
    } catch (err) {
      this.status.textContent = err.message;
    }
  }

  showErrors(errors) {
    for (const knob of this.knobs) {
      const mine = errors.filter((e) => e.field === knob.field || e.field.endsWith(`.${knob.field}`));
      knob.error.textContent = mine.map((e) => e.message).join("\n");
      knob.error.hidden = !mine.length;
      knob.input.setAttribute("aria-invalid", mine.length ? "true" : "false");
    }
  }

  /** A `steer` event (from this page or another) says whether exploration is paused now. */
  noteEvent(event) {
    if (event.kind === "steer" && typeof event.metrics?.pause_exploration === "number")
      this.setPaused(Boolean(event.metrics.pause_exploration));
  }

  setPaused(paused) {
    this.paused = paused;
    // The label names the action it takes (not a pressed state), so a screen reader reads what a press does.
    this.pauseButton.textContent = paused ? "Resume exploration" : "Pause exploration";
  }

  /** A finished run takes no more changes. */
  setLive(live) {
    for (const control of this.element.querySelectorAll("button, input")) control.disabled = !live;
  }
}
