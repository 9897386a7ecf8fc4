"""Make docs/_static/dashboard.png: a real daemon with the dashboard, some work, headless Chromium.

    python bench/dashboard_screenshot.py [--output docs/_static/dashboard.png] [--seconds 20]

Needs the system's chromium and chromedriver (.ci/system-deps) and selenium (the test extra).
Starts ``scaler-daemon --workers 2 --dashboard 127.0.0.1:0`` on a private ipc:// socket, runs
tasks at a varying rate with a few failures while the page polls, then saves the screenshot.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from scaler_executor import ScalerExecutor


def nap(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def parse_row(line: str) -> dict[str, str]:
    key, _, value = line.partition("=")
    if not value:
        raise ValueError(f"bad row {line!r}: expected key=value")
    return {key: value}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=str(Path(__file__).resolve().parent.parent / "docs" / "_static" / "dashboard.png"))
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the page watches the work")
    args = parser.parse_args()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    tmp = tempfile.mkdtemp(prefix="dashboard-shot-")
    address = f"ipc://{tmp}/daemon.sock"
    log = open(os.path.join(tmp, "daemon.log"), "w+b")  # noqa: SIM115  (closed in finally)
    daemon = subprocess.Popen(
        [sys.executable, "-m", "scaler_executor.cli.daemon", "--address", address, "--workers", "2",
         "--dashboard", "127.0.0.1:0"], stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    driver = None
    try:
        deadline = time.monotonic() + 60
        url = None
        while url is None and time.monotonic() < deadline and daemon.poll() is None:
            log.seek(0)
            found = re.findall(rb"dashboard at (http://\S+)", log.read())
            url = found[0].decode() if found else None
            time.sleep(0.1)
        if url is None:
            log.seek(0)
            sys.exit(f"the daemon printed no dashboard URL:\n{log.read().decode(errors='replace')}")
        options = webdriver.ChromeOptions()
        options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
        for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1280,1500"):
            options.add_argument(a)
        driver = webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)
        driver.get(url)
        with ScalerExecutor(address=address) as ex:
            start = time.monotonic()
            wave = 0
            while time.monotonic() - start < args.seconds:
                wave += 1
                futures = [ex.submit(nap, 0.002 * (1 + wave % 5)) for _ in range(40 * (1 + wave % 4))]
                if wave % 6 == 0:
                    futures.append(ex.submit(parse_row, f"row {wave} without an equals sign"))
                for f in futures:
                    f.exception()
            running = [ex.submit(nap, 3.0) for _ in range(6)]  # some tasks running and pending in the picture
            time.sleep(2.5)
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            driver.save_screenshot(args.output)
            for f in running:
                f.result()
        print(f"wrote {args.output}")
    finally:
        if driver is not None:
            driver.quit()
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(30)
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
