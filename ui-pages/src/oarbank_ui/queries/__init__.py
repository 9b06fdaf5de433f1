"""The host queries (``services``, ``nodes``, ``node_metrics``): their rules, shaping and
reads, free of HTTP and of the view."""
