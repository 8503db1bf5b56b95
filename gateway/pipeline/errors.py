"""One place that turns every error into an OpenAI-shaped JSON body with the right status."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import msgspec
from litestar import Request, Response
from litestar.exceptions import HTTPException, NotFoundException, ValidationException

from policies.errors import AuthenticationFailed, PermissionDenied, TierGateError

_encoder = msgspec.json.Encoder()


class ClientGone(TierGateError):
    """The client closed the connection before the answer was ready (nginx's 499)."""

    status = 499
    error_type = "client_closed_request"


class BodyTimedOut(TierGateError):
    """The request's body stalled past ``server.body_timeout_s``: the edge answered 408."""

    status = 408
    error_type = "invalid_request_error"


_STATUS_TYPES = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    415: "invalid_request_error",
    429: "rate_limit_error",
}


def error_body(message: str, error_type: str, param: str | None, code: object) -> bytes:
    """The OpenAI error envelope, encoded."""
    return _encoder.encode(
        {"error": {"message": message, "type": error_type, "param": param, "code": code}}
    )


def error_response(
    status: int,
    message: str,
    *,
    error_type: str | None = None,
    param: str | None = None,
    code: object = None,
    headers: dict[str, str] | None = None,
) -> Response[bytes]:
    """An OpenAI-shaped error response."""
    kind = error_type or _STATUS_TYPES.get(status, "server_error")
    return Response(
        content=error_body(message, kind, param, code),
        status_code=status,
        media_type="application/json",
        headers=headers,
    )


def _domain(_request: Request[Any, Any, Any], exc: TierGateError) -> Response[bytes]:
    # The inference endpoints render their own errors (gateway/pipeline/replies.py); these come from
    # the admin and key routes.
    return error_response(
        exc.status,
        exc.message,
        error_type=exc.error_type,
        param=exc.param,
        code=exc.code,
        headers=dict(exc.headers),
    )


def _http(request: Request[Any, Any, Any], exc: HTTPException) -> Response[bytes]:
    status = exc.status_code
    if status == 413:
        return error_response(413, "The request body is too large.", code="request_too_large")
    if isinstance(exc, NotFoundException):
        return error_response(404, f"Unknown path: {request.url.path[:200]}", code="not_found")
    if isinstance(exc, ValidationException):
        return error_response(400, "The request is invalid.", code="invalid_request")
    message = exc.detail if isinstance(exc.detail, str) and status < 500 else "Request failed."
    return error_response(status, message, headers=dict(exc.headers or {}))


def _unexpected(request: Request[Any, Any, Any], exc: Exception) -> Response[bytes]:
    # The last line of defence: a bug must not leak a traceback or secrets to the caller.
    request.logger.exception("request.unhandled_error")
    return error_response(500, "Internal gateway error.", code="internal_error")


EXCEPTION_HANDLERS: dict[type[Exception] | int, Any] = {
    TierGateError: _domain,
    HTTPException: _http,
    Exception: _unexpected,
}

# What is told of a refused credential: the path, the error code and the client's address.
Refused = Callable[[str, object, "str | None"], None]


def refused_credential(exc: TierGateError) -> bool:
    """A missing or wrong credential (401), or an API key where the admin token is needed."""
    if isinstance(exc, AuthenticationFailed):
        return True
    return isinstance(exc, PermissionDenied) and exc.code == "admin_required"


def exception_handlers(refused: Refused) -> dict[type[Exception] | int, Any]:
    """:data:`EXCEPTION_HANDLERS`, telling ``refused`` of every refused credential."""

    def domain(request: Request[Any, Any, Any], exc: TierGateError) -> Response[bytes]:
        if refused_credential(exc):
            client = request.client
            refused(request.url.path, exc.code, client.host if client is not None else None)
        return _domain(request, exc)

    return {**EXCEPTION_HANDLERS, TierGateError: domain}
