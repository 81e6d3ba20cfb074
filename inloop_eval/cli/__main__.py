"""`python -m inloop_eval.cli`."""

import sys

from inloop_eval.cli.main import main

sys.exit(main())
