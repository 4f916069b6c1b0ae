from ps_baseline.cli import main

raise SystemExit(main())
