"""A real headless Chromium for console tests (Debian's ``chromium`` + ``chromium-driver``).

Missing browser = a failed test with the install command, never a silent skip.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
INSTALL = "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver"
ARGUMENTS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--no-proxy-server", "--window-size=1280,900")


def require_chromium() -> None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not os.access(p, os.X_OK)]
    if missing:
        pytest.fail(f"headless browser missing: {', '.join(missing)}; install it with: {INSTALL} "
                    "(.ci/run does this)", pytrace=False)


def chromium(tmp_dir: Path | None = None):
    """A Selenium Chrome driver on a fresh profile under ``tmp_dir``; the caller quits it."""
    require_chromium()
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="chromium-profile-", dir=tmp_dir)
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for argument in ARGUMENTS:
        options.add_argument(argument)
    options.add_argument(f"--user-data-dir={profile}")
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(30)
    return driver


@contextlib.contextmanager
def browsing(deployment, tmp_dir: Path, *processes: str) -> Iterator:
    """Start ``processes`` of ``deployment`` and a browser; on failure keep a screenshot and the logs.

    Everything is stopped on the way out, whatever happened.
    """
    require_chromium()
    driver = None
    try:
        for name in processes:
            deployment.start(name)
        driver = chromium(tmp_dir)
        yield driver
    except Exception:
        if driver is not None:
            driver.save_screenshot(str(tmp_dir / "failure.png"))
        print(deployment.logs())
        raise
    finally:
        if driver is not None:
            driver.quit()
        deployment.stop_all()


def waiting(driver, seconds: float = 20):
    """A WebDriverWait that keeps polling while a click's navigation replaces the page.

    An element found in the old document can vanish before it is read;
    Chromium then says "Node ... does not belong to the document", a plain
    WebDriverException that WebDriverWait does not ignore by itself.
    """
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, seconds, ignored_exceptions=(WebDriverException,))
