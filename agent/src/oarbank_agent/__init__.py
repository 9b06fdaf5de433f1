"""oarbank-agent: the node agent."""
