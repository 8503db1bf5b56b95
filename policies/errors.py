"""The domain error tree. Every error the gateway shows a caller starts here.

Each error knows its HTTP status and its OpenAI error ``type``/``code`` so that one handler in
the gateway can render ``{"error": {"message", "type", "param", "code"}}`` for all of them.
Messages must never contain secrets: callers build them from safe values only.
"""

from __future__ import annotations

_MAX_MESSAGE = 2000
_MAX_PARAM = 128


def _bounded(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class TierGateError(Exception):
    """Base of every error rendered to a caller.

    Messages and ``param`` often quote what the caller sent (a field name, a model); both are
    bounded here, so a 500 kB field name is never echoed back (or logged) in full.
    """

    status: int = 500
    error_type: str = "server_error"
    default_code: str | None = None
    # Longer, still secret-free words on what went wrong (e.g. each replica's state), used
    # when several failures are summed up in one message.
    detail: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        detail: str | None = None,
    ) -> None:
        message = _bounded(message, _MAX_MESSAGE)
        super().__init__(message)
        self.message = message
        self.param = _bounded(param, _MAX_PARAM) if param is not None else None
        self.code = code if code is not None else self.default_code
        self.headers: dict[str, str] = dict(headers or {})
        if detail is not None:
            self.detail = detail


class InvalidRequest(TierGateError):
    """The request body or a parameter is invalid (400)."""

    status = 400
    error_type = "invalid_request_error"


class PayloadTooLarge(TierGateError):
    """The request body is larger than the configured limit (413)."""

    status = 413
    error_type = "invalid_request_error"
    default_code = "request_too_large"


class UnsupportedMediaType(TierGateError):
    """The request body is sent in an encoding the gateway does not read (415)."""

    status = 415
    error_type = "invalid_request_error"
    default_code = "unsupported_content_encoding"


class ModelNotFound(TierGateError):
    """The ``model`` names no tier, served model or ``auto`` (404)."""

    status = 404
    error_type = "invalid_request_error"
    default_code = "model_not_found"


class AuthenticationFailed(TierGateError):
    """Missing, unknown, disabled or expired key (401)."""

    status = 401
    error_type = "invalid_request_error"
    default_code = "invalid_api_key"


class PermissionDenied(TierGateError):
    """The key may not do this, e.g. use that tier (403)."""

    status = 403
    error_type = "permission_error"
    default_code = "permission_denied"


class RateLimited(TierGateError):
    """The key is over one of its limits (429)."""

    status = 429
    error_type = "rate_limit_error"
    default_code = "rate_limit_exceeded"


class Overloaded(TierGateError):
    """Every replica that could serve the request is saturated (503)."""

    status = 503
    error_type = "server_error"
    default_code = "overloaded"


class UpstreamUnavailable(TierGateError):
    """No replica could be reached or answered in time (502/503/504)."""

    status = 502
    error_type = "server_error"
    default_code = "upstream_unavailable"

    def __init__(
        self,
        message: str,
        *,
        status: int = 502,
        code: str | None = None,
        headers: dict[str, str] | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message, code=code, headers=headers, detail=detail)
        self.status = status


class UpstreamBadAnswer(TierGateError):
    """The backend answered 200 with something the gateway cannot pass on (502); another tier
    would be asked to generate the answer again, so there is no fallback."""

    status = 502
    error_type = "server_error"
    default_code = "bad_upstream_answer"


class UpstreamRejected(TierGateError):
    """The backend refused the request with a 4xx; its message is passed through."""

    error_type = "invalid_request_error"

    def __init__(
        self,
        message: str,
        *,
        status: int,
        param: str | None = None,
        code: str | None = None,
        detail: str | None = None,
    ) -> None:
        super().__init__(message, param=param, code=code, detail=detail)
        self.status = status
