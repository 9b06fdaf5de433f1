"""The heartbeat store: SQLite or PostgreSQL, its schema and migrations, the one writer of
reports, the metrics history, node credentials."""
