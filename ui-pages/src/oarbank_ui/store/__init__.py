"""The heartbeat store: SQLite or PostgreSQL, its schema and migrations, the group commit that
writes reports and claims, the one writer of reports, the metrics history, node credentials."""
