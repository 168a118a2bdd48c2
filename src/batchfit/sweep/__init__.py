"""The sweep as a whole: its plan, the stages the rules and the CLI run, status, check and SBC."""
