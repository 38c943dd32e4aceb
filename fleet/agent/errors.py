"""The agent's one error for the operator: something only they can fix, said in a sentence."""


class AgentError(Exception):
    """The agent says this and stops: a spent join token, a 401, an unreadable agent.json."""
