from ringtrain.cli import main

raise SystemExit(main())
