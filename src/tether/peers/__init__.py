"""Links to other environments and A2A agents: one HTTP client (``client``), one link
(``peer``: follower, pusher, calls), the directory of links (``directory``)."""

from tether.peers.directory import Peers
from tether.peers.peer import Origin, Peer

__all__ = ["Origin", "Peer", "Peers"]
