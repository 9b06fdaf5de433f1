"""The service's exec (every op): runs ``upstream_model_service.py`` next to it.

A file of its own so that op processes (a ``fingerprint`` right after a stop, say) do not carry
``model_service.py`` in their command line: the scenarios find the service's daemon by that
name, as they do for fastmodel (whose ops run as ``with_helper.py``).
"""

from __future__ import annotations

import os
import runpy
import sys

target = os.path.join(os.path.dirname(os.path.abspath(__file__)), "upstream_model_service.py")
sys.argv = [target, *sys.argv[1:]]
runpy.run_path(target, run_name="__main__")
