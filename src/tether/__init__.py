"""tether: delegate work between agent threads and always get the answer back."""

__version__ = "0.1.0"
