import sys

from ringtrain.bench.cli import main

sys.exit(main())
