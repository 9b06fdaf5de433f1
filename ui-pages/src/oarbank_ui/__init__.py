"""oarbank-ui: the portal side."""
