"""``python -m oarbank_agent`` = ``oarbank-agent``."""

from __future__ import annotations

import sys

from oarbank_agent.operate.cli import main

sys.exit(main())
