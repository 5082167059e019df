"""``python -m ringreduce``: the same as the ``ringreduce`` command."""

import sys

from .cli import main

sys.exit(main())
