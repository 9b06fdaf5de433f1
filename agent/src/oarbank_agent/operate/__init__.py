"""Running the agent: its command line, config, control socket, state dir, logs, drain, reload, demo.

Each file in one sentence: ``README.md`` here.
"""
