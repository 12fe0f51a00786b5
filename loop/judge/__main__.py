import os
import sys

if sys.argv[1:2] == ["--host"]:  # the run's judge host, which forks a judge per measurement
    from loop.judge.host import main as host

    code = host(sys.argv[1:])
else:
    from loop.judge.entry import main

    code = main()
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)  # the result is out: the interpreter's and CUDA's orderly teardown would only delay the orchestrator
