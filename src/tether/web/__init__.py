"""The web page of ``tether serve`` (SPEC §10)."""
