"""An exception raised by the user's model code, as the user needs to read it.

When ``build_model`` or ``simulate`` raises, the useful frames are the model file's (and those of
the helper modules beside it): the line of ``model.py`` that failed. The frames above them are
batchfit's, and those below are mostly PyMC's and PyTensor's internals; of those only the last
PyMC frame is kept, which names the PyMC function that refused the model. Every surface
(``batchfit check``, ``batchfit debug``, the notebook functions, a fit's failure record and log)
shows this trimmed traceback (`ModelCodeError`); the fit log keeps the full one as well.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from types import TracebackType

from batchfit.errors import ModelCodeError, one_line

_INSTALLED = ("site-packages", "dist-packages")


def _in_folder(filename: str, folder: Path) -> bool:
    """Whether ``filename`` is a file of the model's folder (not an installed package kept there, e.g. a venv)."""
    try:
        relative = Path(filename).resolve().relative_to(folder)
    except (OSError, ValueError):
        return False
    return not any(part in _INSTALLED for part in relative.parts)


def _pymc_folder() -> Path | None:
    pymc = sys.modules.get("pymc")
    file = getattr(pymc, "__file__", None)
    return Path(file).resolve().parent if file else None


def _is_pymc(filename: str, pymc: Path | None) -> bool:
    if pymc is None:
        return False
    try:
        Path(filename).resolve().relative_to(pymc)
    except (OSError, ValueError):
        return False
    return True


def _kept(tb: TracebackType | None, folder: Path) -> list[TracebackType]:
    """The traceback entries of the model's folder, and the last PyMC one after the last of them."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    user = [i for i, entry in enumerate(entries) if _in_folder(entry.tb_frame.f_code.co_filename, folder)]
    if not user:
        return []
    pymc = _pymc_folder()
    below = [i for i in range(user[-1] + 1, len(entries)) if _is_pymc(entries[i].tb_frame.f_code.co_filename, pymc)]
    return [entries[i] for i in [*user, *below[-1:]]]


def _chain(entries: list[TracebackType]) -> TracebackType | None:
    """A traceback of ``entries`` alone (the same frames and lines), outermost first."""
    chained = None
    for entry in reversed(entries):
        chained = TracebackType(chained, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return chained


def user_frames(exc: BaseException, model_file: Path) -> list[traceback.FrameSummary]:
    """The frames of ``exc``'s traceback in the model file's folder, and the last PyMC frame below them."""
    folder = Path(model_file).resolve().parent
    return list(traceback.extract_tb(_chain(_kept(exc.__traceback__, folder))))


def user_traceback(exc: BaseException, model_file: Path) -> TracebackType | None:
    """``exc``'s traceback cut to the model folder's frames (no PyMC frame): where ``pdb.post_mortem``
    stops at the user's line. None when no frame of the model's folder is in it."""
    folder = Path(model_file).resolve().parent
    return _chain([e for e in _kept(exc.__traceback__, folder) if _in_folder(e.tb_frame.f_code.co_filename, folder)])


def location(exc: BaseException, model_file: Path) -> str:
    """``model.py:14``: the deepest line of the model's folder in ``exc``'s traceback ('' if none), named
    relative to that folder."""
    folder = Path(model_file).resolve().parent
    frames = [f for f in user_frames(exc, model_file) if _in_folder(f.filename, folder)]
    if not frames:
        return ""
    return f"{Path(frames[-1].filename).resolve().relative_to(folder)}:{frames[-1].lineno}"


def format_user_traceback(exc: BaseException, model_file: Path) -> str:
    """``exc`` as Python prints it, with only the model folder's frames (file, line and source line)
    and the last PyMC frame below them."""
    frames = user_frames(exc, model_file)
    head = ("Traceback (the model's own frames; batchfit's and PyMC's internals left out, but for the last "
            "PyMC frame):\n")
    return head + "".join([*traceback.format_list(frames), *traceback.format_exception_only(exc)])


def model_code_error(exc: Exception, model_file: Path, what: str) -> ModelCodeError:
    """The error for ``exc`` raised by the user's code in ``what`` (e.g. "build_model failed for dataset 'x'
    (data/x.csv)"): a one-line message ending in the failing line's place, the trimmed traceback, and the
    full one. ``exc`` keeps only the model's frames and the last PyMC one in its own traceback, so that
    Python (a notebook) prints just those as the cause."""
    full = "".join(traceback.format_exception(exc))
    trimmed = format_user_traceback(exc, model_file)
    where = location(exc, model_file)
    reason = f"{type(exc).__name__}: {one_line(exc)}" + (f" at {where}" if where else "")
    kept = _kept(exc.__traceback__, Path(model_file).resolve().parent)
    if kept:
        exc.with_traceback(_chain(kept))
    error = ModelCodeError(f"{what}: {reason}", reason=reason, user_traceback=trimmed, full_traceback=full,
                           location=where)
    error.__cause__ = exc
    return error
