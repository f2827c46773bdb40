"""Regenerate the report screenshots in docs/popvision/ (light ResNet-50 on one Mk2 IPU, with a
compare view against availableMemoryProportion 0.05).

    python scripts/popvision_screenshots.py [OUT_DIR]

Runs ``openipu run light_resnet50 --report`` twice, ``openipu report ... --compare``, then opens
the page in headless chromium (playwright) and saves one PNG per view.
"""

import os
import sys
import tempfile

from openipu import cli
from openipu.popvision.browser import check_page

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main(argv):
    out = argv[0] if argv else os.path.join(ROOT, "docs", "popvision")
    with tempfile.TemporaryDirectory() as d:
        a, b = os.path.join(d, "amp0.6"), os.path.join(d, "amp0.05")
        assert cli.main(["run", "light_resnet50", "--report", a]) == 0
        assert cli.main(["run", "light_resnet50", "--report", b, "--available-memory-proportion", "0.05"]) == 0
        page = os.path.join(d, "report.html")
        assert cli.main(["report", a, "-o", page, "--compare", b]) == 0
        res = check_page(page, out, compare=True, width=1200)
    if res["errors"] or not all(res["rendered"].values()):
        print(res, file=sys.stderr)
        return 1
    print("\n".join(res["screenshots"]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
