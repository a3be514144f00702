"""The configure view in a real browser: the form generated from the schema, validation with the CLI's messages,
the YAML editor kept in sync with the form, labels, keyboard use and the narrow-screen layout."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml
from playwright.sync_api import Page, expect

from tests.browser.conftest import run_yaml
from tests.e2e.conftest import tiny_config, write_config

pytestmark = pytest.mark.browser

NARROW = {"width": 390, "height": 844}


def open_configure(page: Page, console, yaml_text: str | None = None) -> None:
    page.goto(console.url + "#/configure")
    expect(page.locator("#validation-status")).not_to_be_empty()
    if yaml_text is not None:
        page.locator("#yaml-editor").fill(yaml_text)
        # The form shows the YAML's values once it has read them, and the status its validation's answer.
        name = page.get_by_label("name", exact=True)
        expect(name).to_have_value(yaml.safe_load(yaml_text)["name"])
        expect(page.locator("#validation-status")).to_have_text(re.compile("The configuration is valid.|problem"))


def cli_errors(config: dict, tmp_path) -> list[str]:
    """What `trinity run` prints for a bad config: exit 2, one `field: message` line per problem."""
    path = write_config(tmp_path / "bad.yaml", config)
    done = subprocess.run(
        [sys.executable, "-m", "trinity.cli", "run", "--config", str(path), "--output", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    return done.stderr.splitlines()


def test_a_bad_value_shows_the_clis_message_next_to_its_field(page, console, tiny_model, tmp_path, artifacts):
    open_configure(page, console, run_yaml(tiny_model))
    page.get_by_label("buffer.batch_size", exact=True).fill("0")
    error = page.locator('[data-field="buffer.batch_size"] .error')
    expect(error).to_be_visible()
    expect(page.locator("#validation-status")).to_have_text("1 problem(s) to fix.")
    error.evaluate("el => el.scrollIntoView({block: 'center'})")
    artifacts.screenshot(page, "configure-error", publish=True)
    expected = cli_errors(tiny_config(tiny_model, **{"buffer.batch_size": 0}), tmp_path)
    assert f"buffer.batch_size: {error.text_content()}" in expected


def test_an_unknown_registry_name_is_refused_with_the_known_names(page, console, tiny_model):
    open_configure(page, console, run_yaml(tiny_model))
    field = page.get_by_label("algorithm.algorithm_type", exact=True)
    # The registry's names are offered beside the field.
    assert "grpo" in field.evaluate("el => [...el.list.options].map(o => o.value)")
    field.fill("grpoo")
    expect(page.locator('[data-field="algorithm.algorithm_type"] .error')).to_contain_text("unknown 'grpoo'; known: ")


def test_fixing_the_value_clears_its_error(page, console, tiny_model):
    open_configure(page, console, run_yaml(tiny_model))
    field = page.get_by_label("buffer.batch_size", exact=True)
    field.fill("0")
    error = page.locator('[data-field="buffer.batch_size"] .error')
    expect(error).to_be_visible()
    field.fill("3")
    expect(error).to_be_hidden()
    expect(field).to_have_attribute("aria-invalid", "false")
    expect(page.locator("#validation-status")).to_have_text("The configuration is valid.")


def test_a_form_edit_is_written_to_the_yaml(page, console, tiny_model):
    open_configure(page, console, run_yaml(tiny_model))
    page.get_by_label("buffer.total_steps", exact=True).fill("7")
    page.get_by_label("model.dtype", exact=True).select_option(label="bfloat16")
    expect(page.locator("#yaml-editor")).to_have_value(re.compile("total_steps: 7"))
    config = yaml.safe_load(page.locator("#yaml-editor").input_value())
    assert config["buffer"]["total_steps"] == 7
    assert config["model"]["dtype"] == "bfloat16"


def test_a_yaml_edit_is_shown_in_the_form(page, console, tiny_model):
    open_configure(page, console, run_yaml(tiny_model))
    config = tiny_config(tiny_model, **{"buffer.total_steps": 11, "explorer.temperature": 0.7})
    page.locator("#yaml-editor").fill(yaml.safe_dump(config))
    expect(page.get_by_label("buffer.total_steps", exact=True)).to_have_value("11")
    expect(page.get_by_label("explorer.temperature", exact=True)).to_have_value("0.7")


def test_an_unknown_key_in_the_yaml_is_reported(page, console, tiny_model):
    open_configure(page, console)
    page.locator("#yaml-editor").fill(run_yaml(tiny_model) + "bogus: 1\n")
    expect(page.locator("#general-errors")).to_contain_text("bogus: unknown field")


def test_an_example_loads_into_the_form_and_the_yaml(page, console):
    open_configure(page, console)
    page.get_by_label("Example").select_option(label="quickstart")
    page.get_by_role("button", name="Load example").click()
    expect(page.get_by_label("name", exact=True)).to_have_value("quickstart")
    expect(page.locator("#yaml-editor")).to_have_value(re.compile("^# GRPO on SmolLM2"))  # its comments kept


def test_the_yaml_downloads_as_a_file(page, console, tiny_model):
    open_configure(page, console, run_yaml(tiny_model))
    with page.expect_download() as download:
        page.get_by_role("button", name="Download YAML").click()
    assert download.value.suggested_filename == "tiny.yaml"
    with open(download.value.path()) as f:
        assert yaml.safe_load(f) == tiny_config(tiny_model)


def test_every_form_control_has_a_label(page, console):
    open_configure(page, console)
    page.locator("details.section").evaluate_all("sections => sections.forEach(s => (s.open = true))")
    controls = page.locator("main input, main select, main textarea")
    count = controls.count()
    assert count > 100  # every key of the schema
    for i in range(count):
        expect(controls.nth(i)).to_have_accessible_name(re.compile(r"\S"))
    # the accessible name is the dotted path the validator names a field by: one control each
    names = [controls.nth(i).evaluate("el => el.labels[0]?.textContent") for i in range(count)]
    assert len(set(names)) == count, [n for n in names if names.count(n) > 1]
    expect(page.get_by_label("model.max_response_tokens", exact=True)).to_have_count(1)


def test_tab_reaches_a_field_and_enter_submits_the_form(page, console, tiny_model):
    open_configure(page, console, run_yaml(tiny_model, **{"buffer.batch_size": 0}))
    page.get_by_label("name", exact=True).focus()
    page.keyboard.press("Tab")  # name -> mode
    expect(page.get_by_label("mode", exact=True)).to_be_focused()
    page.keyboard.press("Tab")  # mode -> seed, a text field: Enter in it submits the form
    expect(page.get_by_label("seed", exact=True)).to_be_focused()
    page.keyboard.press("Enter")
    # The launch was refused (batch_size 0): the server's answer is shown, no run was made.
    expect(page.locator("#validation-status")).to_have_text("Not launched: 1 problem(s) to fix.")
    expect(page.locator('[data-field="buffer.batch_size"] .error')).to_be_visible()


def test_the_narrow_layout_has_no_horizontal_scroll_and_a_collapsed_nav(page, console, tiny_model, artifacts):
    page.set_viewport_size(NARROW)
    open_configure(page, console, run_yaml(tiny_model))
    assert page.evaluate("document.documentElement.scrollWidth") <= NARROW["width"]
    runs_link = page.get_by_role("link", name="Runs", exact=True)
    expect(runs_link).to_be_hidden()
    menu = page.get_by_role("button", name="Menu")
    expect(menu).to_have_attribute("aria-expanded", "false")
    menu.click()
    expect(menu).to_have_attribute("aria-expanded", "true")
    expect(runs_link).to_be_visible()
    artifacts.screenshot(page, "configure-narrow")
    runs_link.click()
    expect(page.locator("#runs-table")).to_be_visible()
    expect(runs_link).to_be_hidden()  # the nav folds again after a choice
    assert page.evaluate("document.documentElement.scrollWidth") <= NARROW["width"]
