"""``python -m arbor_cli.view RUN_DIR``: the same as ``arbor-view RUN_DIR``."""

import sys

from arbor_cli.view import main

sys.exit(main())
