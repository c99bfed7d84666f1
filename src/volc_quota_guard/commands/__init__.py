"""One module per `volc-quota-guard` subcommand (see `cli.py`)."""
