"""What a node reports: validation, and the report as the store takes it (the group commit
that writes it is ``store/group_commit.py``). Free of HTTP and of SQL."""
