"""The Dagster UI itself, in headless Chromium: lineage, a materialization, a check.

Drives Debian's ``chromium`` (``/usr/bin/chromium``, installed by ``.ci/chromium.sh``)
through Playwright's Python package; no browser is downloaded. The webserver and its
story are the GraphQL test's (tests/dagster_layer/conftest.py). Screenshots go to a
temporary folder, or to ``docs/`` with ``DSI_UPDATE_SCREENSHOTS=1`` (the README and
docs/getting-started.md show those).

Without Chromium the tests fail under CI (``CI`` set, as ``.ci/run`` does) and are
skipped elsewhere, naming the install command.
"""

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.dagster_layer.conftest import MAIN_OUTPUT, Story
from tests.dagster_layer.webserver import POLL_S, REPO, Webserver

pytestmark = [pytest.mark.browser, pytest.mark.webserver, pytest.mark.slow]

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1600, "height": 1000}
UI_TIMEOUT_MS = 60_000
GROUP = "/locations/__repository__@payments/asset-groups/payments/lineage"


@pytest.fixture(scope="module")
def shots(tmp_path_factory) -> Path:
    if os.environ.get("DSI_UPDATE_SCREENSHOTS"):
        return REPO / "docs"
    return tmp_path_factory.mktemp("screenshots")


@pytest.fixture(scope="module")
def page() -> Iterator:
    if not CHROMIUM.exists():
        message = f"{CHROMIUM} is missing: run `bash .ci/chromium.sh` (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from playwright.sync_api import sync_playwright

    profile = tempfile.mkdtemp(prefix="dsi-chromium-")  # a fresh --user-data-dir
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                profile,
                executable_path=str(CHROMIUM),
                headless=True,
                args=FLAGS,
                viewport=VIEWPORT,
            )
            context.set_default_timeout(UI_TIMEOUT_MS)
            yield context.new_page()
            context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def visit(page, server: Webserver, path: str) -> None:
    """Open a UI page (the instance has seen the welcome dialog: webserver.py)."""
    page.goto(server.url + path)
    page.wait_for_load_state("networkidle")


def shoot(page, path: Path) -> None:
    page.screenshot(path=path)
    assert path.stat().st_size > 20_000, f"{path} looks empty"


def metadata_value(page, label: str) -> str:
    """The value cell next to a label in the metadata table on screen."""
    label_cell = page.locator("td", has=page.get_by_text(label, exact=True))
    row = page.locator("tr", has=label_cell).first
    return row.locator("td").nth(1).inner_text().strip()


def test_lineage_shows_main_and_side_inputs_apart(story: Story, page, shots):
    visit(page, story.server, f"/assets/{MAIN_OUTPUT}?view=lineage")
    for asset in ("transactions", "customer_profiles", "fx_rates", "fraud_rules", MAIN_OUTPUT):
        page.get_by_text(asset, exact=True).first.wait_for()
    page.get_by_text("Loading...").first.wait_for(state="detached")
    # The roles are kinds, shown under every input node of the graph.
    assert page.get_by_text("main_input", exact=True).count() == 1
    assert page.get_by_text("side_input", exact=True).count() == 3
    # The FX partitions start yesterday: a few dozen, not tens of thousands.
    partitions = page.get_by_text(re.compile(r"^\d+ partitions$")).first
    assert 24 <= int(partitions.inner_text().split()[0]) <= 49
    shoot(page, shots / "asset-graph.png")


def test_materialization_metadata_shows_the_glossarys_figures(story: Story, page, shots):
    server = story.server
    # The run that released the buffered records (new_records 0, from_buffer > 0).
    [materialization] = server.materializations(MAIN_OUTPUT, story.runs["release"])
    values = materialization["values"]
    visit(page, server, f"/assets/{MAIN_OUTPUT}?view=events&time={materialization['timestamp']}")
    page.get_by_text("Materialized in run").first.wait_for()
    page.locator(f"a[href^='/runs/{story.runs['release']}']").first.wait_for()
    for label in (
        "new_records",
        "from_buffer",
        "records_processed",
        "released",
        "buffered",
        "rows_written",
        "dagster/row_count",
        "buffered_rows",
    ):
        assert metadata_value(page, label) == str(values[label]), label
    shoot(page, shots / "materialization.png")


def test_side_input_descriptions_are_on_the_output_asset(story: Story, page, shots):
    visit(page, story.server, f"/assets/{MAIN_OUTPUT}")
    page.get_by_text("dsi/role: main_output").first.wait_for()
    profile = page.get_by_text("waits up to 30 minutes, then is sent to unmatched_transactions")
    profile.first.wait_for()
    page.get_by_text("dsi/main_input", exact=True).first.scroll_into_view_if_needed()
    assert page.get_by_text("datetime.timedelta").count() == 0
    shoot(page, shots / "asset-definition.png")


def test_a_check_is_executed_from_its_page(story: Story, page, shots):
    server = story.server
    before = {e["runId"] for e in server.check_executions(MAIN_OUTPUT, "side_inputs_ready")}
    # No welcome dialog opens over the buttons this test clicks.
    assert server.query("{ shouldShowNux }") == {"shouldShowNux": False}
    visit(page, server, f"/assets/{MAIN_OUTPUT}?view=checks")
    page.get_by_text("side_inputs_ready", exact=True).first.click()
    page.locator("button", has_text=re.compile(r"^Execute$")).first.click()
    deadline = time.monotonic() + 300
    while True:
        new = [
            e
            for e in server.check_executions(MAIN_OUTPUT, "side_inputs_ready")
            if e["runId"] not in before
        ]
        if new and new[0]["status"] != "IN_PROGRESS":
            break
        assert time.monotonic() < deadline, "the check run launched from the UI did not finish"
        time.sleep(POLL_S)
    assert new[0]["status"] == "SUCCEEDED", new[0]
    # The operator did not run: the check read its state.
    assert server.materializations(MAIN_OUTPUT, new[0]["runId"]) == []
    visit(page, server, f"/assets/{MAIN_OUTPUT}?view=checks")
    page.get_by_text("side_inputs_ready", exact=True).first.click()
    page.get_by_text("Execution history", exact=True).click()
    page.get_by_text("every side input is ready").first.wait_for()
    shoot(page, shots / "check.png")
