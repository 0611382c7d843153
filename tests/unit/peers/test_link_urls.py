"""Which URLs a link may point at: http(s) only, and plain http only to loopback and
private addresses unless the person says ``--insecure`` (a link token is as powerful as
an SSH key; it must not cross the internet in clear text by accident)."""

from __future__ import annotations

import pytest

from tether.errors import Invalid
from tether.peers.directory import check_url


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8765",
        "http://localhost:1/",
        "http://10.1.2.3:80",
        "http://192.168.0.7",
        "http://[::1]:9000",
        "https://tether.example.com",
    ],
)
def test_secure_or_private_urls_are_accepted_without_a_trailing_slash(url: str) -> None:
    assert check_url(url, insecure=False) == url.rstrip("/")


@pytest.mark.parametrize("url", ["http://tether.example.com", "http://8.8.8.8:8765"])
def test_plain_http_to_a_public_address_needs_insecure(url: str) -> None:
    with pytest.raises(Invalid, match="--insecure"):
        check_url(url, insecure=False)
    assert check_url(url, insecure=True) == url


@pytest.mark.parametrize("url", ["ftp://host/x", "file:///etc/passwd", "localhost:8765", "http://", ""])
def test_what_is_not_an_http_url_is_refused_even_with_insecure(url: str) -> None:
    with pytest.raises(Invalid, match="not an http"):
        check_url(url, insecure=True)
