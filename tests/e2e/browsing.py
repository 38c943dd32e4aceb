"""The dashboard's browser tests' common parts: headless Chromium's flags, the admin's
password, and `Watch`, which fails a test on what a page said that it should not have."""

from __future__ import annotations

from pathlib import Path

CHROMIUM = "/usr/bin/chromium"
# Without the background-networking flags Chromium keeps dialling out, and a closed network
# (the test machines have one) refuses it.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--disable-dev-shm-usage",
]  # fmt: skip
PASSWORD = "correct horse battery staple 42"
# Each linked stylesheet, and whether the browser holds rules from it: a 404 answered as
# HTML leaves none. Read in the page, so a stylesheet served from the cache counts too.
STYLESHEETS = """Array.from(document.querySelectorAll('link[rel=stylesheet]')).map(
  (l) => [l.href, !!l.sheet && l.sheet.cssRules.length > 0])"""


class Watch:
    """What the page said that it should not have: console errors, page errors, stylesheets
    that did not answer 200."""

    def __init__(self, page):
        self.page = page
        self.problems: list[str] = []
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.problems.append(f"page error: {exc}"))
        page.on("response", self._response)
        page.on("requestfailed", self._failed)

    def _console(self, message):
        if message.type == "error":
            self.problems.append(f"console error: {message.text} at {message.location}")

    def _response(self, response):
        if response.request.resource_type == "stylesheet" and response.status != 200:
            self.problems.append(f"stylesheet {response.url} answered {response.status}")

    def _failed(self, request):
        # The event stream is cut when the page navigates away: that is not a failure.
        if request.resource_type == "stylesheet":
            self.problems.append(f"stylesheet {request.url} failed: {request.failure}")

    def check(self, name: str) -> None:
        """Fail, naming the page, on anything said since the last check, or on a linked
        stylesheet that holds no rules (or a page that links none)."""
        sheets = self.page.evaluate(STYLESHEETS)
        empty = [href for href, loaded in sheets if not loaded]
        said, self.problems = self.problems, []
        assert sheets and not empty and not said, (name, self.page.url, said, empty or sheets)

    def shoot(self, folder: Path, name: str, *, full_page: bool = True) -> None:
        self.page.screenshot(path=str(folder / f"{name}.png"), full_page=full_page)
        self.check(name)
