"""Not the package: the top folder of a clone of the inloop_eval repository.

Python imports this file only when it runs from the folder that holds a clone named `inloop_eval`: the clone
then shadows the package inside it (`inloop_eval/inloop_eval/`), even with an editable install, and without
this file it would import as an empty namespace package ("cannot import name ... (unknown location)").
"""

from pathlib import Path

if __name__ == "inloop_eval":  # pytest imports this file as its root folder's package: let it
    raise ImportError(
        f"'inloop_eval' resolved to {Path(__file__).resolve().parent}, the clone of the repository, not the "
        "package inside it: Python looked in the current folder first, which holds the clone. Run Python "
        "from another folder (or from inside the clone), or give the clone another name."
    )
