"""Headless Chromium driven by selenium for the dashboard's tests and its screenshot script.

The system's Chromium and chromedriver (Debian ``chromium``, ``chromium-driver``; .ci/system-deps
installs them), given by path so that selenium never looks for or downloads a driver of its own.
``--no-sandbox``: Chromium's sandbox refuses to run as root, which CI containers are.
"""

from __future__ import annotations

import shutil
from typing import Any

COMMANDS = ("chromium", "chromedriver")


def chromium(width: int = 1280, height: int = 1000) -> Any:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for argument in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                     f"--window-size={width},{height}", "--no-first-run", "--disable-extensions"):  # fmt: skip
        options.add_argument(argument)
    service = Service(executable_path=shutil.which("chromedriver") or "/usr/bin/chromedriver")
    return webdriver.Chrome(service=service, options=options)
