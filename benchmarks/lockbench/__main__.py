"""``python -m benchmarks.lockbench``."""

import sys

from . import main

sys.exit(main())
