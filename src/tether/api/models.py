"""Request bodies. Validation failures become 422 with a message naming the field."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

_Id = Field(default=None, max_length=200)


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class CreateThread(_Body):
    provider: str = Field(min_length=1, max_length=100)
    model: str | None = Field(default=None, max_length=200)
    title: str | None = Field(default=None, max_length=500)
    message: str | None = None
    clientRequestId: str | None = _Id


class PostMessage(_Body):
    text: str = Field(min_length=1)
    mode: Literal["auto", "queue", "now"] = "auto"
    clientRequestId: str | None = _Id
    origin: dict[str, Any] | None = None


class Credentials(_Body):
    ttlSeconds: int | None = Field(default=None, ge=1, le=30 * 24 * 3600)


class CancelTask(_Body):
    reason: str | None = Field(default=None, max_length=2000)


class Interrupt(_Body):
    stop: bool = False


class LinkTokenRequest(_Body):
    label: str = Field(min_length=1, max_length=200)
    access: str | None = None


class LinkRequest(_Body):
    url: str = Field(min_length=1, max_length=2000)
    #: Needed for a tether environment; an A2A agent may take none.
    token: str | None = Field(default=None, min_length=1, max_length=500)
    label: str | None = Field(default=None, max_length=200)
    insecure: bool = False
    kind: Literal["tether", "a2a"] = "tether"
