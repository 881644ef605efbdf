"""The `rlalloc` command line: `main` dispatches to one module per subcommand in this package.

Commands are the top layer: they may import every other package; nothing imports them.
"""
