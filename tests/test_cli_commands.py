"""
The ``iop`` command against a real Edge and node: ``iop token new`` / ``iop key new`` make the
secrets the Edge is configured with (the node registers with the token, a client is served
with the key), ``iop config check`` passes the files the daemons run with, ``iop status``
lists the node, ``iop runs`` lists nothing, ``iop node command`` reaches the node.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import urllib.request
from typing import Any

import yaml

from iop.version import version_line
from tests.harness import TWISTD, Cluster, wait_until


def iop(cluster: Cluster, *argv: str, admin: bool = False) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "iop.cli", *argv]
    if admin:
        command += ["--admin", cluster.admin]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, env=cluster.env)


def secret_and_digest(output: str, key: str) -> tuple[str, str]:
    secret = re.search(r"^  (\S+)$", output, re.MULTILINE)
    digest = re.search(rf"^ +{key}: ([0-9a-f]{{64}})$", output, re.MULTILINE)
    assert secret is not None and digest is not None, output
    return secret.group(1), digest.group(1)


def test_iop_commands_against_a_real_edge(cluster: Cluster) -> None:
    made = iop(cluster, "token", "new", "node-a")
    assert made.returncode == 0, made.stderr
    token, token_digest = secret_and_digest(made.stdout, "token_sha256")
    made = iop(cluster, "key", "new", "ops")
    assert made.returncode == 0, made.stderr
    key, key_digest = secret_and_digest(made.stdout, "key_sha256")
    assert key.startswith("sk-iop-")

    edge_yaml = cluster.write_edge_config(
        openai={
            "listen": f"tcp:{cluster.client_port}:interface=127.0.0.1",
            "auth": {"enabled": True, "keys": [{"name": "ops", "key_sha256": key_digest}]},
        }
    )
    config: dict[str, Any] = yaml.safe_load(edge_yaml.read_text())
    node = config["nodes"][0]
    del node["token"]
    node["token_sha256"] = token_digest
    edge_yaml.write_text(yaml.safe_dump(config))
    cluster.env["IOP_TEST_NODE_TOKEN"] = token
    node_yaml = cluster.write_node_config()

    for path, kind in ((edge_yaml, "edge"), (node_yaml, "node")):
        checked = iop(cluster, "config", "check", str(path))
        assert checked.returncode == 0, checked.stdout + checked.stderr
        assert checked.stdout.startswith(f"{path}: ok ({kind} config"), checked.stdout
    broken = cluster.root / "broken.yaml"
    broken.write_text(edge_yaml.read_text().replace("capacity: 2", "capacity: 0"))
    checked = iop(cluster, "config", "check", str(broken))
    assert checked.returncode == 1
    assert checked.stdout.splitlines()[0].startswith("nodes[0].providers[0].capacity: ")

    cluster.start_edge()
    cluster.start_node()
    wait_until(cluster.node_connected, 20, "node-a ready with the token iop made")

    request = urllib.request.Request(
        cluster.client_url + "/v1/models", headers={"Authorization": f"Bearer {key}"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status == 200

    status = iop(cluster, "status", admin=True)
    assert status.returncode == 0, status.stderr
    # Headed tables, a blank line apart: the Edge, nodes, providers (and a legend), models.
    _, nodes, providers, models = status.stdout.split("\n\n")
    node_rows = {line.split()[0]: line.split() for line in nodes.splitlines()[1:]}
    assert node_rows["node-a"][1:3] == ["ready", "-"], status.stdout
    provider_rows = {line.split()[1]: line.split() for line in providers.splitlines()[1:-1]}
    assert provider_rows["a-chat"][4] == "available", status.stdout
    assert provider_rows["a-off"][4] == "disabled", status.stdout
    assert models.splitlines()[1].split()[:2] == ["pool", "yes"], status.stdout
    as_json = iop(cluster, "status", "--json", admin=True)
    assert json.loads(as_json.stdout)["nodes"][0]["id"] == "node-a"

    runs = iop(cluster, "runs", admin=True)
    assert (runs.returncode, runs.stdout) == (0, "no active runs\n"), runs.stderr

    answer = iop(cluster, "node", "command", "node-a", "capabilities", admin=True)
    assert answer.returncode == 0, answer.stderr
    assert isinstance(json.loads(answer.stdout), dict)

    refused = iop(cluster, "node", "command", "node-x", "capabilities", admin=True)
    assert refused.returncode == 1
    assert "answered HTTP" in refused.stderr

    env_admin = dict(cluster.env, IOP_ADMIN=cluster.admin)
    by_env = subprocess.run(
        [sys.executable, "-m", "iop.cli", "runs"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env_admin,
    )
    assert by_env.stdout == "no active runs\n", by_env.stderr
    assert token not in "".join(d.output() for d in cluster.daemons)


def test_every_program_says_its_version() -> None:
    """``iop --version`` and both plugins' ``--version`` as real processes: IOP's own version
    (not Twisted's), without a config, exit 0."""
    for argv, program in (
        ([sys.executable, "-m", "iop.cli", "--version"], "iop"),
        ([TWISTD, "iop-edge", "--version"], "iop-edge"),
        ([TWISTD, "iop-node", "--version"], "iop-node"),
    ):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == version_line(program), done.stdout
