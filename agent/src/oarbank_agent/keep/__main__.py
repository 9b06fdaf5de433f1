"""``python -I -m oarbank_agent.keep STATE_DIR`` runs the keeper (started by the agent)."""

import sys

from oarbank_agent.keep.keeper import main

sys.exit(main(sys.argv[1:]))
