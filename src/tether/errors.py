"""Errors every surface understands: the API turns them into HTTP answers, the tool surface
into ``{code, message}`` results. Codes are stable; messages say what is wrong."""

from __future__ import annotations


class TetherError(Exception):
    status = 400
    code = "bad_request"

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code:
            self.code = code

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class Invalid(TetherError):
    status = 422
    code = "invalid"


class Unauthorized(TetherError):
    status = 401
    code = "unauthorized"


class Forbidden(TetherError):
    status = 403
    code = "forbidden"


class NotFound(TetherError):
    status = 404
    code = "not_found"


class Conflict(TetherError):
    status = 409
    code = "conflict"


class Unavailable(TetherError):
    status = 503
    code = "unavailable"
