"""The dashboard page in a real headless Chromium: it loads with the printed URL, its numbers
change as tasks run, the task stream draws the runs and the memory panel a series, a failure
shows its traceback, the object store follows a put, a worker manager has its row, and
without the token it is refused."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser import COMMANDS, chromium
from dashboard_cluster import WAIT, DashboardCluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.requires_system(commands=COMMANDS)]


def square(x: int) -> int:
    return x * x


def fails_loudly(x: int) -> int:
    raise KeyError(f"dashboard-visible {x}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[DashboardCluster]:
    c = DashboardCluster(tmp_path)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture
def browser() -> Iterator[Any]:
    driver = chromium()
    try:
        yield driver
    finally:
        driver.quit()


def text_of(driver: Any, element_id: str) -> str:
    from selenium.common.exceptions import NoSuchElementException
    from selenium.webdriver.common.by import By

    try:
        return str(driver.find_element(By.ID, element_id).text)
    except NoSuchElementException:
        return ""


def test_the_page_shows_tasks_workers_and_failures_as_they_happen(cluster: DashboardCluster, browser: Any) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    # The page redraws each second: an element found may be replaced before it is read; try again.
    wait = WebDriverWait(browser, WAIT, ignored_exceptions=(StaleElementReferenceException,))
    browser.get(cluster.url)
    assert "token=" not in browser.current_url  # kept as a cookie, dropped from the address bar
    wait.until(lambda d: text_of(d, "count-finished") == "0" and text_of(d, "state-pending") == "0")
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "#workers tbody tr")) == 1)

    def worker_cells(d: Any) -> list[str]:
        return [td.text for td in d.find_elements(By.CSS_SELECTOR, "#workers tbody tr td")]

    # Its heartbeats' figures: the cores its processors kept busy, their memory (of a limit).
    wait.until(lambda d: re.fullmatch(r"\d+\.\d\d", worker_cells(d)[8]) and "iB" in worker_cells(d)[9])
    with cluster.client() as ex:
        assert list(ex.map(square, range(25))) == [x * x for x in range(25)]
        wait.until(lambda d: text_of(d, "count-finished") == "25")
        assert text_of(browser, "count-submitted") == "25"
        with pytest.raises(KeyError):
            ex.submit(fails_loudly, 7).result(timeout=WAIT)
        wait.until(lambda d: text_of(d, "count-failed") == "1")
        wait.until(lambda d: "dashboard-visible 7" in text_of(d, "failures"))
        traceback = browser.find_element(By.CSS_SELECTOR, "#failures pre").text
        assert "fails_loudly" in traceback and "KeyError" in traceback

        # The history panels (polled every 5 s): the runs as bars in the worker's row, the
        # failure's in its colour; the workers' memory as a series of buckets.
        def runs(d: Any, status: str) -> int:  # a bar is a run, or runs merged (data-runs says how many)
            return int(d.execute_script(
                "return [...document.querySelectorAll(`#stream rect[data-status='${arguments[0]}']`)]"
                ".reduce((n, r) => n + Number(r.dataset.runs), 0)", status
            ))  # fmt: skip

        wait.until(lambda d: runs(d, "ok") == 25 and runs(d, "error") == 1)
        # In one script: the page redraws both (each second, every 5 s), so elements go stale.
        name, label = browser.execute_script(
            'return [document.querySelector("#workers tbody td").textContent, document.querySelector("#stream text").textContent]'
        )  # the row's label, set as textContent
        assert label == name or (label.endswith("…") and name.startswith(label[:-1])), (label, name)
        failed_bar = "return document.querySelector('#stream rect[data-status=\"error\"]').getAttribute('class')"
        assert browser.execute_script(failed_bar) == "error"

        def memory_points(d: Any) -> list[str]:
            points = d.execute_script('const p = document.querySelector("#memory polyline"); return p && p.getAttribute("points")')
            return str(points or "").split()

        wait.until(lambda d: len(memory_points(d)) >= 2 and "iB" in text_of(d, "memory-now"))

        # The host store: the worker's column and the store's row follow a put of a known size.
        ref = ex.put(b"\x07" * (4 << 20))
        wait.until(lambda d: worker_cells(d)[10].startswith("4.0 MiB / "))

        def store_rows(d: Any) -> list[list[str]]:
            return d.execute_script(  # type: ignore[no-any-return]
                'return [...document.querySelectorAll("#stores tbody tr")].map((r) => [...r.cells].map((c) => c.textContent))'
            )

        wait.until(lambda d: len(store_rows(d)) == 1 and store_rows(d)[0][1].startswith("4.0 MiB / "))
        name, _, objects, workers, _ = store_rows(browser)[0]
        assert name.endswith("(daemon)") and objects == "1" and workers == "1", store_rows(browser)
        assert not browser.find_element(By.ID, "managers-section").is_displayed()  # no manager here
        del ref
    assert "no data" not in text_of(browser, "status")


def test_the_page_is_refused_without_the_token(cluster: DashboardCluster, browser: Any) -> None:
    browser.get(cluster.base + "/")
    assert "401" in browser.find_element("tag name", "body").text
    browser.get(cluster.base + "/?token=not-the-token-at-all")
    assert "403" in browser.find_element("tag name", "body").text
    browser.get(cluster.base + "/api/snapshot")
    assert "401" in browser.find_element("tag name", "body").text
    browser.get(cluster.base + "/api/history")
    assert "401" in browser.find_element("tag name", "body").text


def test_the_page_shows_a_worker_manager(cluster: DashboardCluster, browser: Any) -> None:
    """A real local manager keeping one worker: its row in the managers panel, typed as the
    snapshot has it (kind, connected, workers running)."""
    import os
    import signal
    import subprocess
    import sys

    from scaler_testing import child_env
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    name = f"dm{os.getpid()}"
    with open(cluster.log_path.parent / "manager.log", "wb") as out:
        manager = subprocess.Popen(
            [sys.executable, "-m", "scaler_executor.cli.manager", cluster.address, "--adapter", "local",
             "--max-workers", "1", "--min-workers", "1", "--name", name, "--heartbeat-interval", "0.1"],
            env=child_env(), stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    try:
        wait = WebDriverWait(browser, WAIT, ignored_exceptions=(StaleElementReferenceException,))
        browser.get(cluster.url)

        def row(d: Any) -> list[str]:
            return d.execute_script(  # type: ignore[no-any-return]
                'const r = document.querySelector("#managers tbody tr"); return r ? [...r.cells].map((c) => c.textContent) : []'
            )

        wait.until(lambda d: d.find_element(By.ID, "managers-section").is_displayed() and len(row(d)) == 13)
        wait.until(lambda d: row(d)[5] == "1")  # its minimum: one worker running
        cells = row(browser)
        assert cells[:3] == [name, "local", "yes"] and cells[7] == "0" and cells[8] == "1", cells
        assert text_of(browser, "manager-count") == "(1)"
    finally:
        manager.send_signal(signal.SIGTERM)  # it stops its worker, then itself
        try:
            manager.wait(30)
        except subprocess.TimeoutExpired:
            manager.kill()
            manager.wait()
