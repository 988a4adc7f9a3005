"""
The web console in a real browser says why: a model's and a provider's last error (a request
the upstream failed, one the key's scope refused) and, once the node is stopped, since when it
is down. Skipped, saying why, when Chromium is not installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tests.browser import Browser, chromium
from tests.harness import LIMITED_CLIENT_KEY, Cluster, wait_until
from tests.test_console import cell
from tests.test_operator_view import chat


def test_console_shows_last_errors_and_down_since(cluster: Cluster, tmp_path: Path) -> None:
    chromium()
    upstream = cluster.start_fake("fake_openai", "--tokens", "4")
    path = cluster.write_chat_edge_config(
        upstream, openai=cluster.client_api(limited_models=["broken"])
    )
    config: dict[str, Any] = yaml.safe_load(path.read_text())
    # A model whose upstream answers 500 (the fake's fail-500), on the same provider.
    config["nodes"][0]["providers"][0]["models"].append("fail-500")
    config["models"][0]["providers"] = [{"id": "p-chat", "target": "demo-model"}]
    config["models"].append({"id": "broken", "providers": [{"id": "p-chat", "target": "fail-500"}]})
    path.write_text(yaml.safe_dump(config))
    cluster.start_edge()
    node = cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a connected")

    assert chat(cluster, "broken") == 500
    assert chat(cluster, "chat", key=LIMITED_CLIENT_KEY) == 403
    with Browser(tmp_path / "profile") as browser:
        browser.open(cluster.admin + "/")
        browser.wait_for("document.body.dataset.stream === 'live'", 20, "the event stream")
        broken = cell('tr[data-model="broken"]', "last_error")
        # The provider's own 500, relayed: no IOP error code, so "upstream".
        browser.wait_for(f"{broken}.startsWith('500 upstream, ')", 10, "broken's last error")
        chat_error = browser.evaluate(cell('tr[data-model="chat"]', "last_error"))
        assert chat_error.startswith("403 model_not_allowed, "), chat_error
        provider = browser.evaluate(cell('tr[data-provider-id="p-chat"]', "last_error"))
        assert provider == browser.evaluate(broken), provider
        assert browser.evaluate(cell('tr[data-model="chat"]', "available")).startswith("yes")

        node.stop()
        since = cell('tr[data-node-id="node-a"]', "connected_since")
        browser.wait_for(f"{since}.startsWith('down since ')", 20, "node-a down since")
        available = cell('tr[data-model="chat"]', "available")
        browser.wait_for(f"{available} === 'no'", 10, "chat unavailable")
        shot = browser.screenshot(tmp_path / "console-reasons.png")
    print(f"console screenshot: {shot}")
