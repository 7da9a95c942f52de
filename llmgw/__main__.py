"""`python -m llmgw` is the `llmgw` command."""

import sys

from llmgw.cli import main

sys.exit(main())
