from __future__ import annotations

import sys

from harness.e2e.cli import main

sys.exit(main())
