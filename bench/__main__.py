from bench.suite import main

raise SystemExit(main())
