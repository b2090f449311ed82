"""The run loop and its lease."""
