"""The one-line ``.pth`` files of openipu's start-up hooks (:mod:`openipu_tf_hook`,
:mod:`openipu_pyg_hook`): wheels ship them; an editable install (``pip install -e``) does not, so
``python -m <hook> install`` writes them. Imported only by that command, never at start-up."""

import os
import sys


def write_pth(filename: str, module: str, site_dir=None) -> str:
    """Write ``filename`` (one line: ``import <module>``) into ``site_dir`` (default: this
    environment's site-packages) and return its path. Raises ``OSError`` when the directory is
    not writable."""
    import sysconfig
    path = os.path.join(site_dir or sysconfig.get_paths()["purelib"], filename)
    with open(path, "w") as f:
        f.write(f"import {module}\n")
    return path


def main(filename: str, module: str) -> None:
    """``python -m <module> install``: write the hook's ``.pth`` and print its path; anything
    else prints the usage and exits with status 2."""
    if sys.argv[1:] == ["install"]:
        print(write_pth(filename, module))
    else:
        print(f"usage: python -m {module} install   (writes {filename} into site-packages)")
        sys.exit(2)
