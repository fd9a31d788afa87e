from harness.gate.cli import main

raise SystemExit(main())
