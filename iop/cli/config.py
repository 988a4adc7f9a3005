# -*- test-case-name: iop.test.cli.test_config_cli -*-
"""
``iop config``: the running Edge's configuration, through its admin listener.

- ``iop config refresh [--dry-run] [--admin URL] [--json]``: ask the Edge to read its config
  file again (``POST URL/config/refresh``) and apply it, or with ``--dry-run`` only say what
  would happen. Prints the result, then one line per error, change (``path: old → new
  (class)``) and node push; ``--json`` prints the result document as the Edge sent it.

The admin URL is ``--admin``, else ``$IOP_ADMIN``, else ``http://127.0.0.1:8081`` (the admin
listener of ``etc/iop/edge.yaml``). An Edge with ``admin.auth`` needs its admin token, sent as
``Authorization: Bearer``: read from ``--admin-token-file``, else ``$IOP_ADMIN_TOKEN``.

Exit codes: 0 ``applied`` (with ``--dry-run``: would apply); 1 ``rejected``, or no result (the
Edge cannot be reached or did not answer a result document); 2 a usage error; 3
``restart_required`` (nothing was applied: restart the Edge to take the change).
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from iop.cli import check
from iop.cli.command import CommandError, Report, add_json_argument

DEFAULT_ADMIN = "http://127.0.0.1:8081"
ADMIN_ENV = "IOP_ADMIN"
ADMIN_TOKEN_ENV = "IOP_ADMIN_TOKEN"
#: An admin token is one short line.
MAX_TOKEN_BYTES = 4096
#: The Edge answers once the ready nodes answered its push (10 s each, in parallel).
TIMEOUT_SEC = 60.0

#: What ``iop config refresh --json`` prints (the Edge's result document).
JSON_DOCUMENT = (
    '{"result": "applied"|"restart_required"|"rejected", "mode": "apply"|"dry_run", '
    '"changed_nodes", "changed_providers", "changed_models", "reports": [{"path", "old", "new", '
    '"change_class", "detail"}], "errors": [text], "node_pushes": [{"node_id", "outcome", '
    '"reason"}]}'
)

EXIT_APPLIED = 0
EXIT_REJECTED = 1
EXIT_RESTART_REQUIRED = 3
EXIT_CODES = {
    "applied": EXIT_APPLIED,
    "rejected": EXIT_REJECTED,
    "restart_required": EXIT_RESTART_REQUIRED,
}

#: POST ``body`` (JSON) to ``url`` with extra ``headers``; the HTTP status and the response
#: body. Raises OSError when there is no answer.
Post = Callable[[str, bytes, float, Mapping[str, str]], tuple[int, bytes]]


def http_post(
    url: str, body: bytes, timeout: float, headers: Mapping[str, str] | None = None
) -> tuple[int, bytes]:
    """The default :data:`Post`, with the standard library's HTTP client."""
    request = urllib.request.Request(
        url,
        data=body,
        method="POST",
        headers={"content-type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read()
    except urllib.error.HTTPError as e:
        with e:
            return int(e.code), e.read()


def register(subparsers: Any) -> None:
    """Add C{iop config} and its subcommands."""
    group = subparsers.add_parser(
        "config",
        help="the running Edge's configuration (refresh it live)",
        description="Work with the running Edge's configuration through its admin listener.",
    )
    commands = group.add_subparsers(dest="config_command", metavar="COMMAND", required=True)
    refresh = commands.add_parser(
        "refresh",
        help="read edge.yaml again and apply what can change live",
        description=(
            "Ask the Edge to read its config file again and apply it live (every change at "
            "once, or none). Exit codes: 0 applied, 1 rejected or no answer, 3 restart "
            "required."
        ),
    )
    refresh.add_argument(
        "--dry-run",
        action="store_true",
        help="only classify the changes: nothing is applied",
    )
    refresh.add_argument(
        "--admin",
        metavar="URL",
        default=None,
        help=f"the Edge's admin listener (default: ${ADMIN_ENV}, else {DEFAULT_ADMIN})",
    )
    refresh.add_argument(
        "--admin-token-file",
        metavar="FILE",
        default=None,
        help=f"the Edge's admin token (admin.auth), from this file (default: ${ADMIN_TOKEN_ENV})",
    )
    add_json_argument(refresh, JSON_DOCUMENT)
    refresh.set_defaults(run=run_refresh)
    check.register(commands)


def admin_url(given: str | None) -> str:
    url = given or os.environ.get(ADMIN_ENV) or DEFAULT_ADMIN
    if "://" not in url:
        url = f"http://{url}"
    return url.rstrip("/")


def admin_headers(token_file: str | None) -> dict[str, str]:
    """
    ``Authorization: Bearer`` with the admin token from ``token_file``, else
    ``$IOP_ADMIN_TOKEN``; none when neither is given. Errors name the file, never the token.
    """
    if token_file is not None:
        try:
            with open(token_file, encoding="utf-8") as f:
                token = f.read(MAX_TOKEN_BYTES + 1).strip()
        except (OSError, UnicodeDecodeError) as e:
            reason = getattr(e, "strerror", None) or type(e).__name__
            raise CommandError(f"cannot read the admin token file {token_file}: {reason}") from None
        where = f"the admin token file {token_file}"
    else:
        token = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
        if not token:
            return {}
        where = f"${ADMIN_TOKEN_ENV}"
    if not token:
        raise CommandError(f"{where} is empty")
    if len(token) > MAX_TOKEN_BYTES or any(ord(c) < 0x21 or ord(c) == 0x7F for c in token):
        raise CommandError(f"{where} does not hold one token (one line, no spaces)")
    return {"authorization": f"Bearer {token}"}


def run_refresh(args: argparse.Namespace, report: Report) -> int:
    mode = "dry_run" if args.dry_run else "apply"
    url = admin_url(args.admin) + "/config/refresh"
    headers = admin_headers(args.admin_token_file)
    try:
        status, raw = http_post(url, json.dumps({"mode": mode}).encode(), TIMEOUT_SEC, headers)
    except OSError as e:
        reason = getattr(e, "reason", None) or e.strerror or type(e).__name__
        raise CommandError(f"cannot reach the Edge admin listener at {url}: {reason}") from None
    document = _document(url, status, raw)
    if args.json:
        print(json.dumps(document, indent=2), file=report.out)
    else:
        for line in summary(document):
            print(line, file=report.out)
    return EXIT_CODES[document["result"]]


def _document(url: str, status: int, raw: bytes) -> dict[str, Any]:
    try:
        document = json.loads(raw)
    except ValueError:
        document = None
    if status != 200 or not isinstance(document, dict) or "result" not in document:
        message = ""
        if isinstance(document, dict) and isinstance(document.get("error"), dict):
            message = str(document["error"].get("message", ""))
        text = f"{url} answered HTTP {status}" + (f": {message}" if message else "")
        if status == 401:
            text += f" (give the admin token: --admin-token-file FILE or ${ADMIN_TOKEN_ENV})"
        raise CommandError(text)
    if document["result"] not in ("applied", "restart_required", "rejected"):
        raise CommandError(f"{url} answered an unknown result {document['result']!r}")
    return document


def summary(document: dict[str, Any]) -> list[str]:
    """The human form of a result document."""
    result, mode = document["result"], document.get("mode", "")
    if mode == "dry_run":
        head = {
            "applied": "dry run: would apply",
            "restart_required": "dry run: restart required (nothing would be applied)",
            "rejected": "dry run: rejected",
        }[result]
    else:
        head = {
            "applied": "applied",
            "restart_required": "restart required: nothing was applied",
            "rejected": "rejected: nothing was applied",
        }[result]
    reports = document.get("reports") or []
    lines = [f"{head} ({_count(len(reports), 'change')})"]
    lines += [f"  error: {e}" for e in document.get("errors") or []]
    for r in reports:
        line = f"  {r['path']}: {r['old']} → {r['new']} ({r['change_class']})"
        if r.get("detail"):
            line += f": {r['detail']}"
        lines.append(line)
    for push in document.get("node_pushes") or []:
        line = f"  node {push['node_id']}: {push['outcome']}"
        if push.get("reason"):
            line += f": {push['reason']}"
        lines.append(line)
    return lines


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"
