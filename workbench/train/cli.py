"""`workbench train-*` commands (filled in by the training recipe)."""


def add_subcommands(sub) -> None:
    pass
