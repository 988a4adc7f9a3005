# -*- test-case-name: iop.test.edge.ingress.test_auth -*-
"""
Who may call the client surfaces, and for which models.

Either header works on either surface: ``Authorization: Bearer <key>`` (the OpenAI SDK) or
``x-api-key: <key>`` (the Anthropic SDK). No key or an unknown key is ``401``
(:func:`authenticate`); a key whose ``models`` list does not include the requested model is
``403`` (:func:`authorize`) — whether or not that model exists, so a restricted key learns
nothing about the rest of the catalog. Keys are compared in constant time
(:meth:`~iop.config.model.ClientAPIConfig.key_for`). With ``openai.auth.enabled: false`` (only
allowed on a loopback listener) nothing is checked.
"""

from __future__ import annotations

from twisted.web.iweb import IRequest

from iop.config.model import ClientAPIConfig, ClientKey
from iop.edge.ingress.errors import ApiError
from iop.edge.ingress.http import header

__all__ = ["authenticate", "authorize", "presented_keys"]


def presented_keys(request: IRequest) -> list[str]:
    """The API keys a request presents: a bearer token and/or an ``x-api-key``."""
    keys: list[str] = []
    authorization = header(request, "authorization")
    if authorization:
        scheme, _, value = authorization.strip().partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            keys.append(value.strip())
    api_key = header(request, "x-api-key")
    if api_key and api_key.strip():
        keys.append(api_key.strip())
    return keys


def authenticate(request: IRequest, config: ClientAPIConfig) -> ClientKey | None:
    """
    The client key the request presents; None when auth is off. Raises a 401 :class:`ApiError`
    for a missing or unknown key.
    """
    if not config.auth:
        return None
    keys = presented_keys(request)
    if not keys:
        raise ApiError(
            401,
            "missing API key: send 'Authorization: Bearer <key>' or 'x-api-key: <key>'",
            code="missing_api_key",
        )
    for presented in keys:
        found = config.key_for(presented)
        if found is not None:
            return found
    raise ApiError(401, "invalid API key", code="invalid_api_key")


def authorize(key: ClientKey | None, model: str) -> None:
    """403 when ``key`` may not use ``model`` (checked before whether the model exists)."""
    if key is not None and not key.allows(model):
        raise ApiError(403, f"this API key may not use model {model!r}", code="model_not_allowed")
