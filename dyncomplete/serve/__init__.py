"""The completion server: OpenAI-compatible HTTP API, prefix cache, model worker, web page."""

from .app import create_app
from .state import Settings

__all__ = ["Settings", "create_app"]
