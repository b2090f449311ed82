"""Model adapter layer: one interface, one module per wire protocol."""

from . import anthropic, openai, prompt_tools, rules  # noqa: F401  (register the adapters)
from .base import ADAPTERS, EndpointConfig, ModelAdapter, ModelError, adapter_for

__all__ = ["ADAPTERS", "EndpointConfig", "ModelAdapter", "ModelError", "adapter_for"]
