"""`python -m fleet.agent --controller URL ...`: the agent without Django."""

import sys

from fleet.agent.cli import main

sys.exit(main())
