"""One module per ``hccc`` subcommand (``hccc.commands.<name>``), each with ``configure(parser)`` and
``run(args) -> int``; ``hccc.cli`` finds them by name and never is imported by them (shared argument types: ``hccc.args``)."""
