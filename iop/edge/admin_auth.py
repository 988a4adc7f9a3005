# -*- test-case-name: iop.test.edge.test_admin_auth -*-
"""
The admin listener's access control: ``admin.auth`` in edge.yaml, a bearer token.

:func:`protect` wraps the admin listener's whole resource tree (every route, today's and any
added later) in :class:`BearerAuthResource` when a token is configured; without one the tree is
served as it is (the config loader allows that only on loopback). A request must carry exactly
one ``Authorization: Bearer <token>`` header; the presented token's sha256 is compared with the
configured digest in constant time (:func:`hmac.compare_digest`). Anything else is answered 401
``{"error": {"message", "code"}}`` with ``WWW-Authenticate: Bearer`` before any route sees it.
Neither the presented token nor the configured digest is logged or echoed.
"""

from __future__ import annotations

import hashlib
import json
from hmac import compare_digest

from twisted.web.iweb import IRequest
from twisted.web.resource import IResource, Resource
from zope.interface import implementer

from iop.config.model import AdminConfig, NodeToken

__all__ = ["REALM", "BearerAuthResource", "UnauthorizedResource", "protect"]

REALM = "iop-admin"


def protect(resource: IResource, admin: AdminConfig) -> IResource:
    """``resource`` behind the bearer-token check when ``admin.auth`` is set, else as it is."""
    if admin.auth is None:
        return resource
    return BearerAuthResource(resource, admin.auth)


def presented_token(request: IRequest) -> bytes | None:
    """The token of the request's one ``Authorization: Bearer`` header, else ``None``."""
    values: list[bytes] = list(request.requestHeaders.getRawHeaders(b"authorization") or [])
    if len(values) != 1:
        return None
    scheme, _, token = values[0].strip().partition(b" ")
    token = token.strip()
    if scheme.lower() != b"bearer" or not token:
        return None
    return token


def token_matches(expected: NodeToken, token: bytes) -> bool:
    """Constant-time: the presented token's digest against the configured one."""
    return compare_digest(expected.sha256, hashlib.sha256(token).digest())


class UnauthorizedResource(Resource):
    """401 for any method and path, JSON, with the Bearer challenge (RFC 6750)."""

    isLeaf = True

    def __init__(self, presented: bool) -> None:
        super().__init__()
        self._presented = presented

    def render(self, request: IRequest) -> bytes:
        challenge = f'Bearer realm="{REALM}"'
        if self._presented:
            challenge += ', error="invalid_token"'
            message = "the admin bearer token is not valid"
        else:
            message = "the admin listener requires Authorization: Bearer <admin token>"
        request.setResponseCode(401)
        request.setHeader(b"www-authenticate", challenge.encode())
        request.setHeader(b"content-type", b"application/json")
        request.setHeader(b"cache-control", b"no-store")
        body = json.dumps({"error": {"message": message, "code": 401}}, indent=2)
        return body.encode() + b"\n"


@implementer(IResource)
class BearerAuthResource:
    """
    ``wrapped`` (the admin app's resource) for requests with the admin token; every other
    request gets :class:`UnauthorizedResource`. The check runs once per request, at the root,
    before resource traversal reaches any route.
    """

    isLeaf = False

    def __init__(self, wrapped: IResource, token: NodeToken) -> None:
        self._wrapped = wrapped
        self._token = token

    def _authorized(self, request: IRequest) -> IResource:
        token = presented_token(request)
        if token is not None and token_matches(self._token, token):
            return self._wrapped
        return UnauthorizedResource(presented=token is not None)

    def getChildWithDefault(self, path: bytes, request: IRequest) -> IResource:
        # Hand the path segment back: the wrapped tree traverses the whole path itself.
        request.postpath.insert(0, request.prepath.pop())
        return self._authorized(request)

    def render(self, request: IRequest) -> bytes | int:
        result: bytes | int = self._authorized(request).render(request)
        return result

    def putChild(self, path: bytes, child: IResource) -> None:
        raise NotImplementedError("the admin tree is the wrapped resource's")

    def __repr__(self) -> str:
        return "BearerAuthResource(token=***)"
