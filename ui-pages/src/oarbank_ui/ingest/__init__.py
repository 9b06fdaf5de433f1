"""What a node reports and how reports become transactions: validation, the report as the
store takes it, group commit. Free of HTTP and of SQL."""
