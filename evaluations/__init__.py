"""Evaluations: recorded turns replayed on a candidate (a model endpoint, a system prompt),
scored beside the record, and the rollout gate that asks for a passing one."""
