import sys

from kbroker_tools.admin.main import main

sys.exit(main())
