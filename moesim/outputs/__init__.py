"""Safe output files and run folders: every command that writes files goes through here.

- :mod:`moesim.outputs.files`: names (:func:`check_name`), the default folder of a run
  (:func:`default_run_dir`), checks before long work (:func:`check_file_target`,
  :func:`check_dir_target`), atomic writes (:func:`write_file`, :func:`write_text`,
  :func:`save_figure`);
- :mod:`moesim.outputs.folder`: a run's folder, held by one run at a time
  (:func:`claim`), checked before and under the claim (:func:`check_run_folder`), its
  files written atomically with ``summary.json`` last and marked as the run's own
  (:class:`Outputs`, :data:`MARKER`).

Operating-system errors become :class:`moesim.errors.InputError` (one line, exit 2).
"""

from moesim.outputs.files import (
    NAME_MAX,
    check_figure_target,
    check_file_target,
    check_name,
    default_run_dir,
    figure_formats,
    is_temporary,
    make_dir,
    os_error,
    save_figure,
    write_file,
    write_text,
)
from moesim.outputs.folder import (
    LOCK_NAME,
    MARKER,
    Outputs,
    busy_holder,
    check_dir_target,
    check_run_folder,
    claim,
    foreign_files,
    identity_key,
    marker,
    owned_files,
    register,
    run_manifest,
    set_command,
)

__all__ = [
    "LOCK_NAME", "MARKER", "NAME_MAX", "Outputs", "busy_holder", "check_dir_target",
    "check_figure_target", "check_file_target", "check_name", "check_run_folder", "claim",
    "default_run_dir", "figure_formats", "foreign_files", "identity_key", "is_temporary",
    "make_dir", "marker", "os_error", "owned_files", "register", "run_manifest",
    "save_figure", "set_command", "write_file", "write_text",
]
