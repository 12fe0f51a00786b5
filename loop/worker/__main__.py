import sys

from loop.worker.entry import main

sys.exit(main())
