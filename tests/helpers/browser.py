"""Headless Chromium (Debian's chromium and chromedriver, `make browser`) through Selenium, for the tests
of pages: open, wait for what must show (never a fixed sleep), read the console's errors, click."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

WAIT = 60  # seconds for a page to show what it must, on a busy 2-core machine
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
         "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1600,1000")


class Browser:
    def __init__(self, folder: Path) -> None:
        binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
        assert binary and driver, "headless Chromium is missing: `make browser` installs chromium and chromium-driver"
        options = webdriver.ChromeOptions()
        for flag in (*FLAGS, f"--user-data-dir={folder}"):
            options.add_argument(flag)
        options.binary_location = binary
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        self.driver = webdriver.Chrome(service=Service(driver), options=options)

    def __enter__(self) -> "Browser":
        return self

    def __exit__(self, *exc) -> None:
        self.driver.quit()

    def open(self, url: str, expect: str) -> None:
        self.driver.get(url)
        self.wait_for(expect)

    def text(self, element_id: str | None = None) -> str:
        """The page's text, or one element's; "" while a live part is being swapped."""
        try:
            return self.driver.find_element(*((By.ID, element_id) if element_id else (By.TAG_NAME, "body"))).text
        except (StaleElementReferenceException, WebDriverException):
            return ""

    def wait_until(self, ready, what: str = "the condition") -> None:
        deadline = time.monotonic() + WAIT
        while not ready():
            assert time.monotonic() < deadline, f"{what} did not happen within {WAIT} s; the page shows:\n" \
                                                f"{self.text()[:2000]}"
            time.sleep(0.1)

    def wait_for(self, text: str) -> None:
        self.wait_until(lambda: text in self.text(), f"{text!r} on the page")

    def errors(self) -> list[str]:
        """The console's errors since the last call (failed requests included)."""
        return [e["message"] for e in self.driver.get_log("browser") if e["level"] == "SEVERE"]

    def rows(self) -> dict[str, list[str]]:
        """Each table row's cells' text, by its first cell; read again when a live part of the page
        (the overview's, every 3 s) was replaced while it was being read."""
        deadline = time.monotonic() + WAIT
        while True:
            try:
                out = {}
                for row in self.driver.find_elements(By.CSS_SELECTOR, "tbody tr"):
                    cells = [c.text.strip() for c in row.find_elements(By.TAG_NAME, "td")]
                    if cells:
                        out[cells[0]] = cells
                return out
            except StaleElementReferenceException:
                assert time.monotonic() < deadline, "the table never held still long enough to be read"
                time.sleep(0.05)

    def _row(self, first: str):
        for row in self.driver.find_elements(By.CSS_SELECTOR, "tbody tr"):
            cells = row.find_elements(By.TAG_NAME, "td")
            if cells and cells[0].text.strip() == first:
                return row
        return None

    def click_in_row(self, first: str, button: str) -> None:
        self.wait_for_row(first, button)
        row = self._row(first)
        next(b for b in row.find_elements(By.TAG_NAME, "button") if b.text.strip() == button).click()

    def wait_for_row(self, first: str, button: str) -> None:
        def ready() -> bool:
            try:
                row = self._row(first)
                return row is not None and any(b.text.strip() == button for b in row.find_elements(By.TAG_NAME, "button"))
            except StaleElementReferenceException:
                return False
        self.wait_until(ready, f"a {button!r} button in the row of {first!r}")

    def click_text(self, text: str) -> None:
        self.wait_for(text)
        WebDriverWait(self.driver, WAIT).until(
            lambda d: d.find_element(By.XPATH, f"//*[normalize-space(text())='{text}']")).click()

    def click_label(self, label: str) -> None:
        WebDriverWait(self.driver, WAIT).until(
            lambda d: d.find_element(By.CSS_SELECTOR, f"[aria-label='{label}']")).click()
