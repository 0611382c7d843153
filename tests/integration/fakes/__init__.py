"""Fake outside services the integration tests talk to over real loopback sockets."""
