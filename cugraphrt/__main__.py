"""``python -m cugraphrt``: the same as the ``cugraphrt`` command."""

import sys

from .cli import main

sys.exit(main())
