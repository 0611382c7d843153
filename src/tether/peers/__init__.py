"""Linked environments (SPEC §6): links out to peers, and the feed we follow from each."""

from tether.peers.links import Peer, Peers

__all__ = ["Peer", "Peers"]
