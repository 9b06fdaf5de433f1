"""The programs that drive the project from the outside: e2e/, nodes/, bench/, tools/."""
