import sys

from loop.worker.jobs import main

sys.exit(main())
