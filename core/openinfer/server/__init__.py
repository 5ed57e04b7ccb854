"""The OpenAI-compatible HTTP server (starlette + uvicorn): one process, several models."""
from .app import create_app
from .host import Engine, ModelHost, ServedModel
from .run import serve

__all__ = ["Engine", "ModelHost", "ServedModel", "create_app", "serve"]
