"""A small synchronous HTTP client for the CLI and the demo."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx

DEFAULT_URL = "http://127.0.0.1:8765"


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status, self.code, self.message = status, code, message


def resolve_token(token: str | None, data: Path | None) -> str | None:
    if token:
        return token
    if os.environ.get("TETHER_TOKEN"):
        return os.environ["TETHER_TOKEN"]
    for directory in (data, Path("./tether-data")):
        if directory is not None and (directory / "admin.token").exists():
            return (directory / "admin.token").read_text().strip()
    return None


class Client:
    def __init__(self, url: str, token: str | None, timeout: float = 60.0) -> None:
        self.url = url.rstrip("/")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def request(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._http.request(method, path, **kwargs)
        if response.status_code >= 400:
            try:
                error = response.json()["error"]
                raise ApiError(response.status_code, error["code"], error["message"])
            except (ValueError, KeyError, TypeError):
                raise ApiError(response.status_code, "error", response.text) from None
        return response.json()

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params={k: v for k, v in params.items() if v is not None})

    def post(self, path: str, body: dict[str, Any] | None = None) -> Any:
        return self.request("POST", path, json=body or {})
