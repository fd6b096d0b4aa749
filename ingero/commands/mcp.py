"""`ingero mcp`: an MCP server over stdio for AI assistants (explain, query, status, check, stacks, sessions)."""

from __future__ import annotations

from pathlib import Path

import click

from ingero.commands.options import db_option, resolve_db


@click.command("mcp")
@db_option
def command(db_path: Path | None) -> None:
    """Serve ingero's answers to an MCP client over stdin/stdout.

    \b
    Tools: explain, query (read-only SQL, row and time limits), status, check,
    stacks, list_sessions; prompt: investigate.  Answers come from the running
    tracer over its socket when one writes the database, else from the file
    opened read-only.  Nothing can write; no tool takes a file path.
    \b
      ingero mcp                                   the default database
      ingero mcp --db /var/lib/ingero/ingero.duckdb
    \b
    A client configuration (Claude Desktop, VS Code ...):
      {"mcpServers": {"ingero": {"command": "ingero", "args": ["mcp"]}}}
    """
    from ingero.mcpserver.server import serve

    serve(resolve_db(db_path))
