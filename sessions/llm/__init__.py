"""Model adapter layer: one interface, one module per wire protocol."""

from . import rules  # noqa: F401  (registers the adapter)
from .base import ADAPTERS, EndpointConfig, ModelAdapter, ModelError, adapter_for

__all__ = ["ADAPTERS", "EndpointConfig", "ModelAdapter", "ModelError", "adapter_for"]
