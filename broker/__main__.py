import sys

from kbroker.broker.cli import main

sys.exit(main())
