"""`workbench batch`: papermill grids over the notebooks (filled in with the notebooks)."""


def add_subcommands(sub) -> None:
    pass
