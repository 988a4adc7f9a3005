# -*- test-case-name: iop.test.edge.test_admin -*-
"""
The small admin HTTP surface (Klein), loopback by default: ``/healthz`` and ``/status``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from klein import Klein
from twisted.web.iweb import IRequest
from twisted.web.resource import IResource


def _json(request: IRequest, body: Any, code: int = 200) -> bytes:
    request.setResponseCode(code)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(body, indent=2, sort_keys=False).encode() + b"\n"


class AdminApp:
    app = Klein()

    def __init__(self, statusSnapshot: Callable[[], dict[str, Any]]) -> None:
        self._snapshot = statusSnapshot

    @app.route("/healthz", methods=["GET"])
    def healthz(self, request: IRequest) -> bytes:
        return _json(request, {"status": "ok"})

    @app.route("/status", methods=["GET"])
    def status(self, request: IRequest) -> bytes:
        return _json(request, self._snapshot())

    @app.handle_errors(Exception)
    def error(self, request: IRequest, failure: Any) -> bytes:
        from werkzeug.exceptions import HTTPException

        exc = failure.value
        if isinstance(exc, HTTPException):
            return _json(
                request, {"error": {"message": exc.description, "code": exc.code}}, exc.code or 500
            )
        return _json(request, {"error": {"message": "internal error", "code": 500}}, 500)

    def resource(self) -> IResource:
        return self.app.resource()  # type: ignore[no-any-return]
