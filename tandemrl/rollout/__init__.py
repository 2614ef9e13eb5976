"""Multi-turn tool-calling rollouts: the agent loop (a state machine per trajectory), tool-call formats, the tool
registry and the Python sandbox."""
