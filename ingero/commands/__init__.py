"""One module per ingero subcommand; cli.py assembles them."""
