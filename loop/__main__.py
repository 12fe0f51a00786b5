import sys

from loop.cli import main

sys.exit(main())
