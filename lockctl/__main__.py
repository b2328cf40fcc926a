"""``python -m lockctl``: the same as the ``lockctl`` command."""

import sys

from . import main

sys.exit(main())
