"""Moves: every change of a session's state, each one `build_step` + `metered_commit`
(turn.py: the turn's own moves; approval, ask_user, takeover and the pre-run checkpoint
beside it)."""
