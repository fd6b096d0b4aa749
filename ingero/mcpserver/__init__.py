"""`ingero mcp`: an MCP server (official SDK) answering from the tracer or the DB file."""
