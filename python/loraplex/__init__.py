"""loraplex: a Python client of loraplex-server's gRPC API."""

from loraplex.client import Client, LoraplexError

__all__ = ["Client", "LoraplexError"]
__version__ = "0.1.0"
