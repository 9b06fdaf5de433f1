"""Running the agent: its command line, config, control socket, state dir, logs, drain, reload, demo.

Files (one sentence each):

- ``cli.py``: ``oarbank-agent``: run | submit | status | drain | reload | protect | demo.
- ``config.py``: ``--config FILE``: the node's ``run`` options in one TOML file a config
  management tool owns.
- ``control.py``: The control socket: ``<state>/control.sock``, mode 0600, JSON lines.
- ``demo.py``: ``oarbank-agent demo``: N generate jobs through one warm model service.
- ``demo_cold.py``: ``oarbank-agent demo --compare``: the same N jobs run cold, measured.
- ``drain.py``: Drain: how the agent stops when asked (SIGTERM, ``oarbank-agent drain``).
- ``logsetup.py``: The agent's own log: where it goes (stderr, or a file rotated by size), its
  level, and its format (``text``, or ``json``: one object per line an
  operator's log shipper can index).
- ``logtail.py``: Why a child failed, in one short line: ``oarbank_sdk.logtail`` (shared with
  ``conform``, so both say the same line).
- ``module_cli.py``: ``oarbank-agent module list | add DIR | disable ID [--now] | enable ID |
  remove ID [--now] [--wait]``: modules on a running agent.
- ``nodeid.py``: The node's id, kept in the state dir after the first run.
- ``optiontable.py``: The README's table of ``run`` options, generated from the parser so the two
  never differ.
- ``protect_cli.py``: Command line of host protection: the ``run`` options and ``oarbank-agent
  protect``.
- ``reload.py``: Reload: SIGHUP or ``oarbank-agent reload`` while the agent runs.
- ``statedir.py``: The agent's state dir is the agent's alone: its user's, mode 0700, one agent
  at a time.
"""
