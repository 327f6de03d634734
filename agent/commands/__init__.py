"""One module per ``voxline`` command: ``add_parser(subparsers)`` and ``main(args) -> int``."""
