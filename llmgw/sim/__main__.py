"""`python -m llmgw.sim`: run the simulated engine (same flags as `llmgw sim`)."""

import sys

from llmgw.sim.server import main

sys.exit(main())
