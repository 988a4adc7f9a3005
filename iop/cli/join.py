# -*- test-case-name: iop.test.cli.test_join_cli -*-
"""
What a join line needs from the Edge's side, for ``iop node add`` and ``iop token new --edge``:
the address nodes dial, the pin of the Edge's CA and the Edge's workload name
(:mod:`iop.config.join` encodes them with the token).

Each comes from a flag, else from the Edge's edge.yaml (``--edge-config``, default
``etc/iop/edge.yaml`` when it exists), read as YAML only — not validated as the Edge does, so an
edge.yaml whose ``${VAR}`` secrets are not set here still serves:

- the address: ``--edge HOST:PORT`` (repeatable), else ``listen.nodes``' interface and port when
  it binds one address. A wildcard interface (``0.0.0.0``, ``::`` or none) is no address a node
  can dial, and this command does not guess one from the host's name (a container's or a NATed
  host's name is rarely what nodes reach): it asks for ``--edge``;
- the CA pin: ``--ca-pin sha256:<hex>``, else ``--ca-file`` (a CA certificate, or a chain file
  ending with its CA), else the CA certificate at the end of edge.yaml's
  ``node_transport.tls.cert_file`` — the chain the Edge presents, where a joining node finds the
  CA (``iop pki issue-edge`` writes it there). A cert_file without its CA is refused with the
  fix: a node could not check the pin against it;
- the server name: ``--server-name``, else the first DNS name of that certificate, else
  :data:`~iop.config.join.DEFAULT_SERVER_NAME`.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass

from cryptography import x509

from iop.cli.command import CommandError
from iop.config.checks import split_endpoint
from iop.config.errors import ConfigError, read_yaml_file
from iop.config.join import DEFAULT_SERVER_NAME, check_pin, edge_addresses
from iop.config.node import split_host_port
from iop.security.tls import TLSConfigError, ca_file_pin, certificate_dns_names

DEFAULT_EDGE_CONFIG = "etc/iop/edge.yaml"
_WILDCARDS = ("", "0.0.0.0", "::", "\\:\\:", "[::]")


@dataclass(frozen=True)
class EdgeSide:
    """The Edge's part of a join string."""

    edges: tuple[str, ...]
    ca_pin: str
    server_name: str


def add_arguments(parser: argparse.ArgumentParser, *, required: bool) -> None:
    """The flags that say where the Edge is and which CA it presents."""
    when = "" if required else " (with it, a join line is printed too)"
    parser.add_argument(
        "--edge",
        action="append",
        metavar="HOST:PORT",
        help="the Edge's listen.nodes address as nodes dial it (repeat for several Edges); "
        f"default: edge.yaml listen.nodes when it binds one address{when}",
    )
    parser.add_argument(
        "--edge-config",
        metavar="EDGE_YAML",
        help=f"the Edge's edge.yaml, read for listen.nodes and node_transport.tls.cert_file "
        f"(default: {DEFAULT_EDGE_CONFIG} when it exists)",
    )
    parser.add_argument(
        "--ca-file",
        metavar="FILE",
        help="the Edge's CA certificate (or a chain file ending with it), whose pin the join "
        "line carries; default: the CA at the end of edge.yaml node_transport.tls.cert_file",
    )
    parser.add_argument(
        "--ca-pin", metavar="sha256:HEX", help="the Edge CA's pin itself, instead of --ca-file"
    )
    parser.add_argument(
        "--server-name",
        metavar="NAME",
        help="the Edge's workload name its certificate carries; default: the certificate's, "
        f"else {DEFAULT_SERVER_NAME}",
    )


def wanted(args: argparse.Namespace) -> bool:
    """Whether ``iop token new`` was asked for a join line (an Edge flag was given)."""
    return any(
        getattr(args, name) is not None
        for name in ("edge", "edge_config", "ca_file", "ca_pin", "server_name")
    )


def edge_side(args: argparse.Namespace) -> EdgeSide:
    """
    The Edge's address(es), CA pin and name from the flags and edge.yaml (module docstring).

    @raise CommandError: one of them cannot be found, saying which flag gives it.
    """
    document, config_path = _edge_yaml(args.edge_config)
    base = os.path.dirname(os.path.abspath(config_path)) if config_path else os.getcwd()
    edges = _addresses(args.edge, document, config_path)
    cert_file = _cert_file(document, base)
    if args.ca_pin is not None:
        if args.ca_file is not None:
            raise CommandError("give either --ca-file or --ca-pin, not both")
        try:
            pin = check_pin(args.ca_pin)
        except ValueError as e:
            raise CommandError(f"--ca-pin: {e}") from None
    else:
        source = args.ca_file or cert_file
        if source is None:
            where = (
                f"{config_path} has no node_transport.tls.cert_file"
                if config_path
                else (f"no edge.yaml here ({DEFAULT_EDGE_CONFIG}; --edge-config names one)")
            )
            raise CommandError(
                f"which CA does the Edge present? {where}: give --ca-file (the Edge's CA "
                "certificate, e.g. pki/ca.crt) or --ca-pin"
            )
        try:
            pin = ca_file_pin(source)
        except TLSConfigError as e:
            if args.ca_file is None:
                raise CommandError(
                    f"{e}: node_transport.tls.cert_file must hold the Edge's certificate then "
                    "its CA, which the Edge presents and joining nodes check by its pin (`iop "
                    "pki issue-edge` writes both; or append ca.crt to it), or give --ca-file"
                ) from None
            raise CommandError(f"--ca-file: {e}") from None
    name = args.server_name or _certificate_name(cert_file) or DEFAULT_SERVER_NAME
    return EdgeSide(edges, pin, name)


def _edge_yaml(given: str | None) -> tuple[dict[str, object], str | None]:
    path = given if given is not None else DEFAULT_EDGE_CONFIG
    if given is None and not os.path.exists(path):
        return {}, None
    try:
        data = read_yaml_file(path)
    except ConfigError as e:
        raise CommandError(f"--edge-config: {e}") from None
    if not isinstance(data, dict):
        raise CommandError(f"{path}: not an edge.yaml (not a mapping)")
    return data, path


def _section(document: dict[str, object], *keys: str) -> object:
    value: object = document
    for key in keys:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def _addresses(
    given: list[str] | None, document: dict[str, object], config_path: str | None
) -> tuple[str, ...]:
    if given:
        edges = edge_addresses(given)
        for edge in edges:
            try:
                split_host_port(edge)
            except ValueError:
                raise CommandError(
                    f"--edge {edge!r}: must be HOST:PORT, the Edge's listen.nodes address as "
                    "nodes dial it, e.g. edge.example.net:7443"
                ) from None
        return edges
    listen = _section(document, "listen", "nodes")
    if not isinstance(listen, str) or config_path is None:
        raise CommandError(
            "where do nodes dial the Edge? give --edge HOST:PORT (its listen.nodes address as "
            "nodes reach it)"
        )
    args, kwargs = split_endpoint(listen)
    port = kwargs.get("port") or (args[1] if len(args) > 1 else "")
    interface = kwargs.get("interface") or (args[2] if len(args) > 2 else "")
    if interface in _WILDCARDS or not port:
        raise CommandError(
            f"{config_path} listen.nodes ({listen}) binds every interface: give --edge "
            f"HOST:{port or 'PORT'}, the address nodes dial"
        )
    host = interface.replace("\\:", ":")
    return (f"[{host}]:{port}" if ":" in host else f"{host}:{port}",)


def _cert_file(document: dict[str, object], base: str) -> str | None:
    value = _section(document, "node_transport", "tls", "cert_file")
    if not isinstance(value, str) or not value.strip() or "${" in value:
        return None
    return value if os.path.isabs(value) else os.path.join(base, value)


def _certificate_name(cert_file: str | None) -> str | None:
    if cert_file is None:
        return None
    try:
        with open(cert_file, "rb") as f:
            leaf = x509.load_pem_x509_certificates(f.read())[0]
    except (OSError, ValueError, IndexError):
        return None
    names = certificate_dns_names(leaf)
    return names[0] if names else None
