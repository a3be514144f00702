import sys

from trinity.cli.main import main

sys.exit(main())
