"""``python -I -m oarbank_agent.factory fd:<n> [--confine]``: the agent's process factory."""

import sys

from .server import main

sys.exit(main(sys.argv[1:]))
