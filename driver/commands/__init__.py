"""One module per ``hccc`` subcommand (``hccc.commands.<name>``), each with ``configure(parser)`` and
``run(args) -> int``; ``hccc.cli`` finds them by name."""
