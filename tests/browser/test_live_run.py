"""A run launched from the page and watched live: curves that grow as events arrive (no reload), the services and
the accounting, experiences, evaluations compared, steering, scaling its explorers, pausing and resuming it, and
cancelling. Page load and event-to-chart times measured on the live run are printed and written to
console_timings.json among the artifacts.

The tests share one run (launching one costs the stack a model load); the last one cancels it."""

from __future__ import annotations

import json
import re
import statistics
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Browser, Page, expect

from tests.browser.conftest import run_yaml

pytestmark = pytest.mark.browser

LIVE_TIMEOUT_MS = 120_000  # a step of the tiny model takes seconds; the first waits for the engine to load
NARROW = {"width": 390, "height": 844}
MEASURED_EVENTS = 30


@dataclass
class LiveRun:
    id: str
    url: str


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> dict[str, str]:
    """Tasks a random tiny model passes about half the time, so rewards vary and GRPO has a signal: the `format`
    reward with a per-task pattern, "the response holds a lowercase letter" (8 random byte tokens: p ~ 0.57)."""
    folder = tmp_path_factory.mktemp("console-tasks")
    paths = {}
    for name, n in (("train", 40), ("eval", 4)):
        rows = [{"question": f"Write a word ({i})", "answer": "", "format_pattern": "(?s).*[a-z].*"} for i in range(n)]
        paths[name] = str(folder / f"{name}.jsonl")
        Path(paths[name]).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


@pytest.fixture(scope="module")
def live_run(browser: Browser, console, tiny_model, tasks) -> Iterator[LiveRun]:
    """Configure and launch a long run from the page; it is cancelled by the last test (or here, at the end)."""
    config = {
        "name": "console-live",
        "buffer.total_steps": 2000,  # far more than the tests take: the last one cancels it
        "buffer.taskset.path": tasks["train"],
        "buffer.taskset.reward_fn": "format",
        "buffer.taskset.epochs": 1000,
        "buffer.eval_tasksets": [
            {"name": "heldout", "path": tasks["eval"], "prompt_key": "question", "reward_fn": "format"},
        ],
    }
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(console.url + "#/configure")
    page.locator("#yaml-editor").fill(run_yaml(tiny_model, **config))
    expect(page.get_by_label("name", exact=True)).to_have_value("console-live")
    expect(page.locator("#validation-status")).to_have_text("The configuration is valid.")
    page.get_by_role("button", name="Launch run").click()
    page.wait_for_url(re.compile(r"#/runs/[^/]+$"))
    run = LiveRun(id=page.url.rsplit("/", 1)[1], url=page.url)
    context.close()
    yield run
    if console.api(f"api/runs/{run.id}")["state"] in ("PENDING", "RUNNING", "PAUSED"):  # a test before failed
        console.post(f"api/runs/{run.id}/cancel")


def open_run(page: Page, run: LiveRun) -> None:
    page.goto(run.url)
    expect(page.locator("#run-state")).to_be_visible()


def points(page: Page, chart: str) -> int:
    return int(page.locator(f'[data-chart="{chart}"]').get_attribute("data-points"))


def wait_for_points(page: Page, chart: str, more_than: int) -> int:
    page.wait_for_function(
        '([chart, n]) => Number(document.querySelector(`[data-chart="${chart}"]`).dataset.points) > n',
        arg=[chart, more_than],
        timeout=LIVE_TIMEOUT_MS,
    )
    return points(page, chart)


def test_the_launched_run_is_running_and_listed(page, console, live_run):
    open_run(page, live_run)
    expect(page.locator("#run-state")).to_have_text("RUNNING", timeout=LIVE_TIMEOUT_MS)
    page.get_by_role("link", name="Runs", exact=True).click()
    row = page.locator(f'#runs-table tr[data-run-id="{live_run.id}"]')
    expect(row).to_contain_text("console-live")
    expect(row).to_contain_text("RUNNING")


def test_the_reward_curve_grows_as_events_arrive(page, live_run, artifacts):
    page.goto(live_run.url)
    page.wait_for_function("window.trinityConsole.timings.firstViewMs !== null")
    first = wait_for_points(page, "reward", 0)
    later = wait_for_points(page, "reward", first)  # pushed by the event stream: the page is not reloaded
    assert later > first
    assert page.evaluate("performance.getEntriesByType('navigation').length") == 1  # still the first load
    # enough live events for the timings to mean something (and points enough for the docs' screenshot)
    page.wait_for_function(
        f"window.trinityConsole.timings.updates.length >= {MEASURED_EVENTS}", timeout=LIVE_TIMEOUT_MS
    )
    timings = page.evaluate("window.trinityConsole.timings")
    navigation = page.evaluate("performance.getEntriesByType('navigation')[0].toJSON()")
    updates = timings["updates"]
    assert updates, "no live event was drawn"
    report = {
        "page_load_ms": {
            "dom_content_loaded": navigation["domContentLoadedEventEnd"],
            "load": navigation["loadEventEnd"],
        },
        "run_view_ready_ms": timings["firstViewMs"],
        "event_to_chart_ms": summary([u["renderMs"] for u in updates]),
        "event_end_to_end_ms": summary([u["endToEndMs"] for u in updates]),
        "live_events_drawn": len(updates),
    }
    artifacts.write_json("console_timings.json", report)
    print("console timings:", json.dumps(report))
    artifacts.screenshot(page, "run", publish=True)


def test_the_timeline_draws_a_lane_per_service_and_one_for_weight_sync(page, live_run, artifacts):
    open_run(page, live_run)
    # the newest 4 steps once the run is past its start-up: steps 2..5 at least
    page.wait_for_function(
        "() => Math.max(0, ...[...document.querySelectorAll('#timeline g[data-step]')].map(g => +g.dataset.step)) >= 5",
        timeout=LIVE_TIMEOUT_MS,
    )
    bars = page.locator("#timeline g[data-phase]")
    lanes = set(bars.evaluate_all("bars => bars.map(b => b.dataset.lane)"))
    phases = set(bars.evaluate_all("bars => bars.map(b => b.dataset.phase)"))
    assert "sync" in lanes and any(lane.startswith("trainer/") for lane in lanes), lanes
    assert any(lane.startswith("explorer/") for lane in lanes), lanes
    assert {"rollout", "put", "forward_backward", "optimizer", "publish_weights", "weight_load"} <= phases, phases
    expect(page.locator("#timeline-caption")).to_contain_text("busy")
    panel = page.locator("section", has=page.locator("#timeline"))
    artifacts.screenshot(page, "timeline", publish=True, element=panel)


def summary(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "max": max(values), "n": len(values)}


def test_every_curve_of_a_training_run_gets_points(page, live_run):
    open_run(page, live_run)
    for chart in ("reward", "accuracy", "loss", "entropy", "step-time", "throughput", "staleness"):
        wait_for_points(page, chart, 0)


def test_the_event_log_shows_the_runs_events(page, live_run):
    open_run(page, live_run)
    log = page.locator("#event-log tbody")
    expect(log.locator('tr[data-kind="train"]').first).to_be_visible(timeout=LIVE_TIMEOUT_MS)
    expect(log.locator('tr[data-kind="explore"]').first).to_be_visible()
    expect(log.locator('tr[data-kind="state"]').first).to_contain_text("RUNNING")


def test_the_services_of_the_run_are_shown_with_their_health(page, live_run):
    open_run(page, live_run)
    services = page.locator("#services tbody")
    for service in ("explorer", "trainer", "buffer"):
        row = services.locator("tr", has=page.get_by_role("cell", name=service, exact=True)).first
        expect(row).to_contain_text("serving")


def test_experience_accounting_counts_what_was_put_and_trained(page, console, live_run):
    open_run(page, live_run)
    accounting = page.locator("#accounting")
    page.wait_for_function(
        "() => Number(document.querySelector('#accounting dt:nth-of-type(3) + dd').textContent) > 0",
        timeout=LIVE_TIMEOUT_MS,
    )
    expect(accounting).to_contain_text("Trained (acked)")
    terms, values = accounting.locator("dt").all_text_contents(), accounting.locator("dd").all_text_contents()
    numbers = dict(zip(terms, values, strict=True))
    assert int(numbers["Put"]) >= int(numbers["Trained (acked)"]) > 0


def test_opening_an_experience_shows_its_prompt_response_and_reward(page, console, live_run, artifacts):
    page.goto(f"{live_run.url}/experiences")
    row = page.locator("#experiences-table tbody tr").first
    expect(row).to_be_visible(timeout=LIVE_TIMEOUT_MS)
    shown = row.get_attribute("data-experience-id")
    stored = console.api(f"api/runs/{live_run.id}/experiences?limit=500")["experiences"]
    first = next(e for e in stored if e["id"] == shown)
    row.get_by_role("button", name=f"Open experience {shown}").click()
    detail = page.locator("#experience-detail")
    expect(detail).to_be_visible()
    expect(page.locator("#detail-prompt")).to_have_text(first["prompt"])
    expect(page.locator("#detail-response")).to_have_text(first["response"])
    expect(detail).to_contain_text(f"Weight version{first['model_version']}")
    expect(page.get_by_role("heading", name=f"Experience {first['id']}")).to_be_focused()
    artifacts.screenshot(page, "experience", publish=True)  # the detail, scrolled to by its focused heading


def test_experiences_filter_by_version_and_reward(page, console, live_run):
    page.goto(f"{live_run.url}/experiences")
    expect(page.locator("#experiences-table tbody tr").first).to_be_visible(timeout=LIVE_TIMEOUT_MS)
    page.get_by_label("Weight version").fill("1")
    page.get_by_role("button", name="Apply filters").click()
    expect(page.get_by_role("status")).to_have_text(re.compile(r"\d+ experience"))
    versions = page.locator("#experiences-table tbody tr td:nth-child(1)").all_text_contents()
    assert versions and set(versions) == {"1"}
    top = max(e["reward"] for e in console.api(f"api/runs/{live_run.id}/experiences?limit=500")["experiences"])
    page.get_by_label("Weight version").fill("")
    page.get_by_label("Minimum reward").fill(str(top + 1))
    page.get_by_role("button", name="Apply filters").click()
    expect(page.get_by_role("status")).to_have_text("0 experience(s).")


def test_two_evaluations_are_compared_metric_by_metric(page, console, live_run):
    open_run(page, live_run)
    page.wait_for_function("() => document.querySelectorAll('#eval-a option').length >= 2", timeout=LIVE_TIMEOUT_MS)
    evals = console.api(f"api/runs/{live_run.id}/evals")["evals"]
    page.get_by_label("Version A").select_option(label=f"version {evals[0]['model_version']}")
    page.get_by_label("Version B").select_option(label=f"version {evals[1]['model_version']}")
    row = page.locator("#evals-table tr", has=page.get_by_role("rowheader", name="accuracy", exact=True))
    expect(row).to_be_visible()
    a, b = evals[0]["metrics"]["accuracy"], evals[1]["metrics"]["accuracy"]
    shown = [float(text) for text in row.locator("td").all_text_contents()]
    assert shown == pytest.approx([a, b, b - a], rel=1e-3, abs=1e-9)


def test_a_new_learning_rate_is_applied_and_logged(page, live_run):
    open_run(page, live_run)
    page.get_by_label("Learning rate").fill("0.0005")
    page.get_by_role("button", name="Apply learning rate").click()
    expect(page.locator("#steer-status")).to_have_text("Applied: learning_rate.")
    steer = page.locator('#event-log tr[data-kind="steer"]', has_text="learning_rate")
    expect(steer.first).to_contain_text("0.0005", timeout=LIVE_TIMEOUT_MS)


def test_a_bad_temperature_is_refused_naming_the_field(page, live_run):
    open_run(page, live_run)
    page.get_by_label("Sampling temperature").fill("-1")
    page.get_by_role("button", name="Apply sampling temperature").click()
    error = page.locator("#steer-temperature-error")
    expect(error).to_be_visible()
    expect(page.get_by_label("Sampling temperature")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#steer-status")).to_contain_text("temperature")


def test_pausing_and_resuming_exploration_is_logged(page, live_run):
    open_run(page, live_run)
    log = page.locator("#event-log")
    page.get_by_role("button", name="Pause exploration").click()
    expect(log.locator('tr[data-kind="steer"]', has_text="exploration paused").first).to_be_visible()
    page.get_by_role("button", name="Resume exploration").click()
    expect(log.locator('tr[data-kind="steer"]', has_text="exploration resumed").first).to_be_visible()
    expect(page.get_by_role("button", name="Pause exploration")).to_be_visible()


def test_scaling_the_explorers_from_the_page(page, live_run):
    open_run(page, live_run)
    expect(page.locator("#run-state")).to_have_text("RUNNING", timeout=LIVE_TIMEOUT_MS)  # only a running run scales
    count, wanted = page.locator("#explorers-count"), page.get_by_label("Explorers wanted")
    expect(count).to_have_text("1 of 1 explorer(s)")
    expect(page.locator("#explorers-list li")).to_have_count(1)
    wanted.fill("0")
    page.get_by_role("button", name="Scale explorers").click()
    expect(page.locator("#scale-explorers-error")).to_contain_text("between 1 and")
    expect(wanted).to_have_attribute("aria-invalid", "true")
    # The stack has one explorer: a second is wanted, but none is free to join.
    wanted.fill("2")
    page.get_by_role("button", name="Scale explorers").click()
    expect(count).to_have_text("1 of 2 explorer(s)")
    expect(wanted).to_have_attribute("aria-invalid", "false")
    log = page.locator('#event-log tr[data-kind="log"]', has_text="explorers scaled from 1 to 2")
    expect(log.first).to_be_visible()
    wanted.fill("1")
    page.get_by_role("button", name="Scale explorers").click()
    expect(count).to_have_text("1 of 1 explorer(s)")


def test_pausing_frees_the_services_and_resuming_queues_the_run(page, console, live_run, artifacts):
    open_run(page, live_run)
    state, resume = page.locator("#run-state"), page.get_by_role("button", name="Resume run")
    expect(resume).to_be_hidden()
    # The services stop after a checkpoint, perhaps within a poll: note what the page shows meanwhile.
    page.evaluate(
        """() => {
          window.sawPausing = false;
          new MutationObserver(() => {
            const resume = [...document.querySelectorAll("button")].find((b) => b.textContent === "Resume run");
            const why = document.getElementById("resume-why");
            if (document.getElementById("run-state")?.textContent === "PAUSING" && resume.disabled && !why.hidden)
              window.sawPausing = true;
          }).observe(document.getElementById("main"), { subtree: true, childList: true, attributes: true });
        }"""
    )
    page.get_by_role("button", name="Pause run").click()
    expect(state).to_have_text("PAUSED", timeout=LIVE_TIMEOUT_MS)  # every service stopped
    assert page.evaluate("window.sawPausing")
    expect(page.locator("#pause-status")).to_contain_text("Paused at train step")
    expect(resume).to_be_enabled()
    expect(page.get_by_role("button", name="Pause run")).to_be_hidden()
    expect(page.locator("#explorers-count")).to_have_text("0 of 1 explorer(s)")
    expect(page.locator('#event-log tr[data-kind="log"]', has_text="stopped for the pause").first).to_be_visible()
    assert [s["role"] for s in console.api(f"api/runs/{live_run.id}")["services"]] == ["buffer"]
    artifacts.screenshot(page, "run-paused")

    page.get_by_role("link", name="Runs", exact=True).click()
    row = page.locator(f'#runs-table tr[data-run-id="{live_run.id}"]')
    expect(row.locator(".state")).to_have_text("PAUSED")
    expect(page.locator(f'#queue-table tr[data-run-id="{live_run.id}"]')).to_have_count(0)  # out of the queue
    artifacts.screenshot(page, "runs-paused")

    page.go_back()
    resume.click()
    expect(page.locator("#pause-status")).to_contain_text("Resumed")
    expect(state).to_have_text("RUNNING", timeout=LIVE_TIMEOUT_MS)  # started again on the services it freed
    expect(page.get_by_role("button", name="Pause run")).to_be_visible()


def test_the_run_view_fits_a_narrow_screen(page, live_run, artifacts):
    page.set_viewport_size(NARROW)
    open_run(page, live_run)
    wait_for_points(page, "reward", 0)
    assert page.evaluate("document.documentElement.scrollWidth") <= NARROW["width"]
    expect(page.get_by_role("button", name="Menu")).to_be_visible()
    artifacts.screenshot(page, "run-narrow", publish=True)


def test_cancelling_the_run_ends_it_and_disables_steering(page, console, live_run, artifacts):
    open_run(page, live_run)
    page.get_by_role("button", name="Cancel run").click()
    expect(page.locator("#run-state")).to_have_text("CANCELLED", timeout=LIVE_TIMEOUT_MS)
    expect(page.get_by_role("button", name="Cancel run")).to_be_disabled()
    expect(page.get_by_label("Learning rate")).to_be_disabled()
    assert console.api(f"api/runs/{live_run.id}")["state"] == "CANCELLED"
    artifacts.screenshot(page, "run-cancelled", full_page=True)
