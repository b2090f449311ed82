"""The model request and its call: the context assembled within its budget, summaries,
the environment the tools run in, the call itself with fallback, its deltas and usage."""
