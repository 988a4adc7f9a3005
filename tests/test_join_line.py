"""
The one-line join with a join string: an Edge whose certificates come from ``iop pki``, the
output of ``iop node add`` / ``iop token new`` used verbatim by ``twistd -n iop-node --join``
(no CA file, no node.yaml), and the refusals that end a node at once with one plain line: a wrong
CA pin, a wrong server name, an unknown token, the Edge's admin port.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import stat
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from iop.config.join import JoinString, decode, encode
from tests.harness import CLIENT_KEY, TWISTD, Cluster, Daemon, wait_until

IOP = str(Path(sys.executable).with_name("iop"))
# A refusal must end the node within this many seconds (the heartbeat timeout is 5 s).
AT_ONCE_SEC = 12.0


def iop(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [IOP, *args], cwd=cluster.root, env=cluster.env, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def edge_yaml(cluster: Cluster) -> Path:
    """
    An Edge whose node listener presents a certificate from ``iop pki`` (``iop pki init`` then
    ``iop pki issue-edge edge.iop.internal``, which writes the certificate then the CA), serving
    one chat model through the fake OpenAI upstream.
    """
    for command in (
        ("pki", "init", "--dir", "ipki"),
        ("pki", "issue-edge", "edge.iop.internal", "--dir", "ipki"),
    ):
        done = iop(cluster, *command)
        assert done.returncode == 0, done.stderr
    upstream = cluster.start_fake("fake_openai")
    path = cluster.write_chat_edge_config(upstream)
    config = yaml.safe_load(path.read_text())
    config["node_transport"]["tls"] = {
        "cert_file": "ipki/edge.iop.internal.crt",
        "key_file": "ipki/edge.iop.internal.key",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def let_in(edge_yaml: Path, token_sha256: str) -> None:
    """node-a's edge.yaml entry takes the digest `iop node add` printed instead of its token."""
    config = yaml.safe_load(edge_yaml.read_text())
    node = config["nodes"][0]
    node.pop("token", None)
    node["token_sha256"] = token_sha256
    edge_yaml.write_text(yaml.safe_dump(config))


def run_line(cluster: Cluster, line: str, name: str = "joined", *extra: str) -> Daemon:
    """Run a printed ``twistd -n iop-node ...`` line as written (twistd's own log flags added)."""
    words = shlex.split(line)
    assert words[:3] == ["twistd", "-n", "iop-node"], line
    argv = [
        TWISTD,
        "--pidfile=",
        "--logfile=-",
        *words[1:],
        "--store",
        f"file:{cluster.root}/{name}.db?cache=shared&mode=rwc",
        *extra,
    ]
    node = Daemon(name, argv, cluster.env, cluster.root / f"{name}.log")
    cluster.daemons.append(node)
    return node.start()


def exits_at_once(node: Daemon) -> tuple[int, float]:
    started = time.monotonic()
    try:
        code = node.wait(AT_ONCE_SEC + 20)
    except subprocess.TimeoutExpired:
        node.stop()
        raise AssertionError(f"the node kept running:\n{node.output()}") from None
    return code, time.monotonic() - started


def giving_up_line(node: Daemon) -> str:
    lines = [line for line in node.output().splitlines() if "giving up: " in line]
    assert len(lines) == 1, node.output()
    return lines[0].split("giving up: ", 1)[1]


def chat(cluster: Cluster) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{cluster.client_url}/v1/chat/completions",
        data=json.dumps(
            {"model": "chat", "messages": [{"role": "user", "content": "hello"}]}
        ).encode(),
        headers={"content-type": "application/json", "authorization": f"Bearer {CLIENT_KEY}"},
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def test_node_add_line_joins_and_serves(cluster: Cluster, edge_yaml: Path) -> None:
    added = iop(cluster, "node", "add", "node-a", "--edge-config", str(edge_yaml))
    assert added.returncode == 0, added.stderr
    lines = added.stdout.splitlines()
    digest = next(line.split(": ", 1)[1] for line in lines if "token_sha256:" in line)
    join_line = next(line.strip() for line in lines if line.strip().startswith("twistd "))
    token = decode(shlex.split(join_line)[-1]).token
    assert hashlib.sha256(token.encode()).hexdigest() == digest
    let_in(edge_yaml, digest)
    cluster.start_edge()
    node = run_line(cluster, join_line)
    wait_until(cluster.node_connected, 20, "node-a connected with its join line")
    answer = chat(cluster)
    assert answer["choices"][0]["message"]["content"]
    node.stop()
    assert token not in node.output(), "the node logged its token"
    assert "joining 127.0.0.1:" in node.output()


def test_token_new_json_and_out(cluster: Cluster, edge_yaml: Path) -> None:
    """`iop token new --json` parses; `--out` writes the join string to a new 0600 file."""
    shown = iop(cluster, "token", "new", "node-a", "--edge-config", str(edge_yaml), "--json")
    assert shown.returncode == 0, shown.stderr
    document = json.loads(shown.stdout)
    assert set(document) >= {"node_id", "token", "token_sha256", "join", "edges", "ca_pin"}
    assert decode(document["join"]).token == document["token"]
    assert document["edges"] == [f"127.0.0.1:{cluster.node_port}"]

    written = iop(
        cluster,
        "token",
        "new",
        "node-a",
        "--edge-config",
        str(edge_yaml),
        "--out",
        "a.join",
        "--json",
    )
    assert written.returncode == 0, written.stderr
    document = json.loads(written.stdout)
    assert "token" not in document and "join" not in document
    path = cluster.root / "a.join"
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    joined = decode(path.read_text())
    assert joined.token not in written.stdout
    assert hashlib.sha256(joined.token.encode()).hexdigest() == document["token_sha256"]
    again = iop(
        cluster, "token", "new", "node-a", "--edge-config", str(edge_yaml), "--out", "a.join"
    )
    assert again.returncode == 1
    assert "exists; refusing to overwrite it" in again.stderr

    key = iop(cluster, "key", "new", "team", "--json")
    assert key.returncode == 0, key.stderr
    assert json.loads(key.stdout)["key"].startswith("sk-iop-")

    # The join file serves as --join-file, verbatim from the printed line.
    let_in(edge_yaml, document["token_sha256"])
    cluster.start_edge()
    line = next(
        line.strip() for line in iop_lines(cluster, edge_yaml) if line.strip().startswith("twistd ")
    )
    assert "--join-file" in line
    node = run_line(cluster, f"twistd -n iop-node --join-file {path}")
    wait_until(cluster.node_connected, 20, "node-a connected with --join-file")
    node.stop()


def iop_lines(cluster: Cluster, edge_yaml: Path) -> list[str]:
    done = iop(
        cluster, "token", "new", "node-b", "--edge-config", str(edge_yaml), "--out", "b.join"
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def added(cluster: Cluster, edge_yaml: Path) -> JoinString:
    done = iop(cluster, "node", "add", "node-a", "--edge-config", str(edge_yaml), "--json")
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    let_in(edge_yaml, document["token_sha256"])
    return decode(document["join"])


def test_wrong_pin_refused_at_once(cluster: Cluster, edge_yaml: Path) -> None:
    join = added(cluster, edge_yaml)
    cluster.start_edge()
    wrong = encode(JoinString(join.edges, join.token, "sha256:" + "ab" * 32))
    node = run_line(cluster, f"twistd -n iop-node --join {wrong}")
    code, took = exits_at_once(node)
    assert (code, took < AT_ONCE_SEC) == (1, True), node.output()
    assert giving_up_line(node) == (
        f"CA pin mismatch: no certificate 127.0.0.1:{cluster.node_port} presented has the CA "
        "key the join string pins (sha256:abababab…abab); it presented CN=IOP CA "
        f"({short_pin(cluster)}). It is another Edge, or its CA changed: print a new join "
        "line (iop node add)"
    )
    assert "Traceback" not in node.output()


def short_pin(cluster: Cluster) -> str:
    from iop.security.tls import ca_file_pin

    pin = ca_file_pin(str(cluster.root / "ipki" / "ca.crt"))
    return f"{pin[:15]}…{pin[-4:]}"


def test_wrong_server_name_refused_at_once(cluster: Cluster, edge_yaml: Path) -> None:
    join = added(cluster, edge_yaml)
    cluster.start_edge()
    node = run_line(
        cluster,
        f"twistd -n iop-node --join {encode(join)}",
        "joined",
        "--server-name",
        "gw.iop.internal",
    )
    code, took = exits_at_once(node)
    assert (code, took < AT_ONCE_SEC) == (1, True), node.output()
    assert giving_up_line(node) == (
        f"the certificate of 127.0.0.1:{cluster.node_port} names edge.iop.internal, not "
        "gw.iop.internal, the Edge name this node requires: pass --server-name "
        "edge.iop.internal (node.yaml edge.server_name) if that is the Edge's workload name"
    )


def test_unknown_token_refused_at_once(cluster: Cluster, edge_yaml: Path) -> None:
    join = added(cluster, edge_yaml)
    cluster.start_edge()
    stranger = encode(JoinString(join.edges, "not-a-token-the-edge-knows", join.ca_pin))
    node = run_line(cluster, f"twistd -n iop-node --join {stranger}")
    code, took = exits_at_once(node)
    assert (code, took < AT_ONCE_SEC) == (1, True), node.output()
    assert giving_up_line(node) == (
        "the Edge does not know this node's token (REGISTER_REJECT_UNKNOWN_TOKEN: unknown "
        "token): no edge.yaml nodes[] entry has it; check its token_sha256, or print a new "
        "join line (iop node add)"
    )


def test_admin_port_is_not_a_node_listener(cluster: Cluster, edge_yaml: Path) -> None:
    join = added(cluster, edge_yaml)
    cluster.start_edge()
    admin = encode(JoinString((f"127.0.0.1:{cluster.admin_port}",), join.token, join.ca_pin))
    node = run_line(cluster, f"twistd -n iop-node --join {admin}")
    code, took = exits_at_once(node)
    assert (code, took < AT_ONCE_SEC) == (1, True), node.output()
    assert giving_up_line(node) == (
        f"127.0.0.1:{cluster.admin_port} is not an IOP Edge node listener (it accepted the "
        "connection but sent no TLS answer in 5 s): is it listen.admin or the client port? "
        "Dial the Edge's listen.nodes address"
    )


def test_connection_refused_retries_per_reconnect(cluster: Cluster, edge_yaml: Path) -> None:
    """Nothing listening is transient: --reconnect 2 gives up after two attempts, one line each."""
    join = added(cluster, edge_yaml)
    node = run_line(
        cluster,
        f"twistd -n iop-node --join {encode(join)}",
        "joined",
        "--reconnect",
        "2",
        "--reconnect-interval",
        "0.5",
    )
    code, _ = exits_at_once(node)
    output = node.output()
    assert code == 1, output
    assert output.count("attempt 1 failed: ") == 1, output
    assert "giving up after 2 consecutive failed attempts" in output
    assert "Scheduling retry" not in output


def test_client_port_is_not_a_node_listener(cluster: Cluster, edge_yaml: Path) -> None:
    join = added(cluster, edge_yaml)
    cluster.start_edge()
    client = encode(JoinString((f"127.0.0.1:{cluster.client_port}",), join.token, join.ca_pin))
    node = run_line(cluster, f"twistd -n iop-node --join {client}")
    code, took = exits_at_once(node)
    assert (code, took < AT_ONCE_SEC) == (1, True), node.output()
    assert giving_up_line(node).startswith(
        f"127.0.0.1:{cluster.client_port} is not an IOP Edge node listener ("
    )
