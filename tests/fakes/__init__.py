"""Fakes that speak real wire protocols (model providers) for tests."""
