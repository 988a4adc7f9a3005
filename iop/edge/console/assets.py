# -*- test-case-name: iop.test.edge.test_console -*-
"""
The console's static shell: the page (``GET /``) and its assets (``GET /console/<name>``), read
from the package (``iop/edge/console/static``), with the headers that keep them to themselves.

Every asset is served with a Content-Security-Policy that allows nothing but this origin
(:data:`CSP`: no inline script or style, no other host for scripts, styles, images, fonts or
connections, no framing), ``nosniff``, no referrer and ``no-cache``. Nothing in the shell names
another host: it works air-gapped.

With ``admin.auth`` on, a browser cannot send the bearer token when it navigates, so
:func:`public_shell` serves this shell — the same static bytes every install ships, no data —
without the token; every other route, ``/status`` and ``/events`` included, still requires it.
The page asks for the token and sends it itself (see ``console.js``).
"""

from __future__ import annotations

import json
from importlib import resources

from twisted.web.iweb import IRequest
from twisted.web.resource import IResource
from zope.interface import implementer

PAGE = "index.html"
# Asset name → content type. Only these are served.
ASSETS = {
    PAGE: "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
# The asset prefix: /console/<name>.
PREFIX = b"console"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-cache"),
)

_cache: dict[str, bytes] = {}


def asset_bytes(name: str) -> bytes:
    """The shipped bytes of asset ``name`` (one of :data:`ASSETS`)."""
    if name not in _cache:
        _cache[name] = resources.files(__package__).joinpath("static", name).read_bytes()
    return _cache[name]


def render_asset(request: IRequest, name: str) -> bytes:
    """Asset ``name`` with its content type and :data:`SECURITY_HEADERS`; 404 if unknown."""
    content_type = ASSETS.get(name)
    if content_type is None:
        request.setResponseCode(404)
        request.setHeader(b"content-type", b"application/json")
        body = {"error": {"message": f"no console asset {name!r}", "code": 404}}
        return json.dumps(body).encode() + b"\n"
    for header, value in SECURITY_HEADERS:
        request.setHeader(header, value)
    request.setHeader(b"content-type", content_type.encode())
    return asset_bytes(name)


_SHELL_ASSETS = frozenset(name.encode() for name in ASSETS)


def is_shell_request(path: bytes, request: IRequest) -> bool:
    """
    A ``GET``/``HEAD`` of exactly the page (``/``) or one asset (``/console/<name>`` for a
    name in :data:`ASSETS`): ``path`` is the first segment, ``request.postpath`` the rest.
    Nothing else is public, whatever a router might make of ``..`` or empty segments.
    """
    if request.method not in (b"GET", b"HEAD"):
        return False
    rest = request.postpath
    if path == b"":
        return not rest
    return path == PREFIX and len(rest) == 1 and rest[0] in _SHELL_ASSETS


@implementer(IResource)
class PublicShell:
    """
    The admin root when ``admin.auth`` is on: the static shell from ``app`` without the token,
    everything else through ``protected`` (the same app behind the bearer check).
    """

    isLeaf = False

    def __init__(self, protected: IResource, app: IResource) -> None:
        self.protected = protected
        self._app = app

    def getChildWithDefault(self, path: bytes, request: IRequest) -> IResource:
        # Hand the path segment back: whichever tree answers traverses the whole path itself.
        shell = is_shell_request(path, request)
        request.postpath.insert(0, request.prepath.pop())
        return self._app if shell else self.protected

    def render(self, request: IRequest) -> bytes | int:
        result: bytes | int = self.protected.render(request)
        return result

    def putChild(self, path: bytes, child: IResource) -> None:
        raise NotImplementedError("the admin tree is the wrapped resource's")


def public_shell(protected: IResource, app: IResource) -> IResource:
    """The admin root: ``app`` itself when it is not protected, else a :class:`PublicShell`."""
    if protected is app:
        return app
    return PublicShell(protected, app)
