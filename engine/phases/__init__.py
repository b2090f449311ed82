"""Phases: the model step and the tool step, peers that never import each other; each is a
short list of gates ending in one move."""
