"""`python -m holdfast.cli`: the `holdfast` command, for interpreters without the console script."""

import sys

from holdfast.cli.main import main

sys.exit(main())
