"""The completion server: OpenAI-compatible HTTP API, prefix cache, model worker, web page."""

from .app import Settings, create_app

__all__ = ["Settings", "create_app"]
