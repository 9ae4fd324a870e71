import sys

from gcache.cli import main

sys.exit(main())
