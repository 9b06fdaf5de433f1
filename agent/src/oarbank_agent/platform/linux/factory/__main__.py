"""``python -I -m oarbank_agent.platform.linux.factory fd:<n> [--confine]``: the agent's process factory."""

import sys

from oarbank_agent.platform.linux.factory.server import main

sys.exit(main(sys.argv[1:]))
