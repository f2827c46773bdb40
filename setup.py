"""Ships ``openipu-tensorflow.pth`` at the root of site-packages (setuptools reads the rest from
pyproject.toml). The .pth line ``import openipu_tf_hook`` registers the finder that answers
``from tensorflow.python import ipu``; it imports nothing else and steps aside when Graphcore's
own TensorFlow is installed (see src/openipu_tf_hook.py)."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "openipu-tensorflow.pth"


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        self.copy_file(os.path.join("src", PTH), os.path.join(self.build_lib, PTH), preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]

    def get_output_mapping(self):
        mapping = super().get_output_mapping()
        mapping[os.path.join(self.build_lib, PTH)] = os.path.join("src", PTH)
        return mapping


setup(cmdclass={"build_py": BuildPyWithPth})
