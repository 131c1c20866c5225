"""``python -m cugraphrt``: the same as the ``cugraphrt`` command."""

import sys

from cugraphrt.cli import main

sys.exit(main())
