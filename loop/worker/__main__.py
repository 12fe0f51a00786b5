import sys

if sys.argv[1:2] == ["--zygote"]:  # the judge's zygote of kernel processes (`loop.worker.zygote`)
    from loop.worker.zygote import main as zygote

    sys.exit(zygote(int(sys.argv[2])))

from loop.worker.entry import main

sys.exit(main())
