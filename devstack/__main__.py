"""python -m devstack {up,down,status,env}"""

from devstack.cli import main

raise SystemExit(main())
