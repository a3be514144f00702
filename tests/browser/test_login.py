"""A stack with a bearer token: the page loads, asks for the token, refuses a wrong one and works with the right one."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from playwright.sync_api import expect

from tests.browser.conftest import Console
from trinity.cli.launcher import LocalStack

pytestmark = pytest.mark.browser

TOKEN = "console-test-token"


@pytest.fixture(scope="module")
def guarded_console(tmp_path_factory) -> Iterator[Console]:
    """Only a gateway behind it: signing in needs no run."""
    logs = tmp_path_factory.mktemp("guarded") / "logs"
    stack = LocalStack.up(logs, roles=("gateway",), extra_env={"TRINITY_AUTH_TOKEN": TOKEN})
    try:
        yield Console(stack.add_console(0))  # it takes the gateway's environment, the token with it
    finally:
        stack.down()


def test_a_wrong_token_is_refused_and_the_right_one_opens_the_page(page, guarded_console):
    page.goto(guarded_console.url + "#/runs")
    dialog = page.get_by_role("dialog", name="Sign in")
    expect(dialog).to_be_visible()
    token = dialog.get_by_label("Token")
    token.fill("not-the-token")
    token.press("Enter")
    expect(dialog.get_by_text("That token was refused.")).to_be_visible()
    token.fill(TOKEN)
    token.press("Enter")
    expect(dialog).to_be_hidden()
    expect(page.get_by_text("No runs yet.")).to_be_visible()  # the list answered: the cookie carries the token
