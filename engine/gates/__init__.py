"""Gates: each reads what it needs and returns a verdict (a call may not run, the turn must
stop, credits are short) or a contribution to the step (a note, a context block, metering
statements). A gate makes no move of its own: the phase that consults it does."""
