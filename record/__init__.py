"""The record: the agent_sessions app's tables (Agent, Session, Message, ToolCall, Transition,
Checkpoint, Event ...), the state table, the event contract, the errors, the batched rows, the
publisher, the dispatch port and the size limits. Imports only runtime and observability."""
