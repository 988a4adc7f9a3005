"""
Headless Chromium driven over the DevTools protocol on a pipe (``--remote-debugging-pipe``:
JSON messages separated by NUL on file descriptors 3 and 4), with the standard library only.

A page that keeps a stream open never goes idle, so ``--dump-dom`` (which dumps at load) and
``--virtual-time-budget`` (which waits for the network to settle) cannot observe it; evaluating
in the page can: :meth:`Browser.wait_for` polls an expression until it holds, and
:meth:`Browser.screenshot` captures the page as it is.

Skipped, saying why, when Chromium is not installed (``.ci/run`` installs Debian's).
"""

from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest


def chromium() -> str:
    for name in ("chromium", "chromium-browser", "chromium-headless-shell"):
        found = shutil.which(name)
        if found:
            return found
    pytest.skip("no Chromium on this machine (Debian package 'chromium'): browser test skipped")


def _above(fd: int, lowest: int = 10) -> int:
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD, lowest)
    os.close(fd)
    return moved


class BrowserError(Exception):
    pass


class Browser:
    """One headless Chromium with one page (``width`` x ``height``)."""

    def __init__(self, profile: Path, width: int = 1280, height: int = 900) -> None:
        commands_read, self._commands = os.pipe()  # we write, Chromium reads fd 3
        self._answers, answers_write = os.pipe()  # Chromium writes fd 4, we read
        # Chromium's ends above 4, so that moving them onto 3 and 4 in the child clobbers neither.
        commands_read, answers_write = (_above(commands_read), _above(answers_write))
        self._process = subprocess.Popen(
            [
                chromium(),
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=lambda: (os.dup2(commands_read, 3), os.dup2(answers_write, 4)),
        )
        os.close(commands_read)
        os.close(answers_write)
        self._buffer = b""
        self._next_id = 0
        self._session = ""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self.call(
            "Target.attachToTarget", {"targetId": target, "flatten": True}, browser=True
        )["sessionId"]
        self.call(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
        )

    def call(
        self, method: str, params: dict[str, Any] | None = None, browser: bool = False
    ) -> dict[str, Any]:
        """One protocol command (to the page's session unless ``browser``); its result."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if self._session and not browser:
            message["sessionId"] = self._session
        os.write(self._commands, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + 30
        while True:
            for answer in self._read(deadline):
                if answer.get("id") == self._next_id:
                    if "error" in answer:
                        raise BrowserError(f"{method}: {answer['error']}")
                    result: dict[str, Any] = answer.get("result", {})
                    return result

    def _read(self, deadline: float) -> list[dict[str, Any]]:
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not select.select([self._answers], [], [], remaining)[0]:
            raise BrowserError("Chromium did not answer in time")
        chunk = os.read(self._answers, 1 << 20)
        if not chunk:
            raise BrowserError("Chromium closed its debugging pipe")
        self._buffer += chunk
        *messages, self._buffer = self._buffer.split(b"\0")
        return [json.loads(m) for m in messages if m]

    def open(self, url: str, timeout: float = 30) -> None:
        """Navigate to ``url`` and wait until that document has loaded."""
        self.call("Page.navigate", {"url": url})
        self.wait_for(
            f"location.href === {json.dumps(url)} && document.readyState === 'complete'",
            timeout,
            f"{url} to load",
        )

    def evaluate(self, expression: str) -> Any:
        """The JSON value of ``expression`` in the page (awaited if it is a promise)."""
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
        )
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float, what: str) -> Any:
        """
        Poll ``expression`` until truthy; its value. Fails the test on timeout, with the
        page's text.
        """
        deadline = time.monotonic() + timeout
        problem = ""
        while time.monotonic() < deadline:
            # Until the page has what the expression reads, it may throw: not yet, not a failure.
            try:
                value = self.evaluate(expression)
            except BrowserError as e:
                problem, value = f" (last: {e})", None
            if value:
                return value
            time.sleep(0.1)
        text = self.evaluate("document.body ? document.body.innerText : ''")
        pytest.fail(
            f"timed out after {timeout}s waiting for {what}{problem}; the page shows:\n{text}"
        )

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", {"format": "png"})["data"]
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        try:
            self.call("Browser.close", browser=True)
        except (BrowserError, OSError):
            pass
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        os.close(self._commands)
        os.close(self._answers)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
