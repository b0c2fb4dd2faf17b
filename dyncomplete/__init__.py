"""dyncomplete: code completion that spends compute only where a token needs it."""

__version__ = "0.1.0"
