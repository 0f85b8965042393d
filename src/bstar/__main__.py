import sys

from bstar.cli import main

sys.exit(main())
