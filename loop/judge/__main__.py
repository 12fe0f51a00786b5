import sys

from loop.judge.entry import main

sys.exit(main())
