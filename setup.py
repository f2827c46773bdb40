"""Ships the start-up hooks' ``.pth`` files at the root of site-packages (setuptools reads the
rest from pyproject.toml):

* ``openipu-tensorflow.pth`` (``import openipu_tf_hook``) registers the finder that answers
  ``from tensorflow.python import ipu``; it steps aside when Graphcore's own TensorFlow is
  installed (src/openipu_tf_hook.py).
* ``openipu-pyg.pth`` (``import openipu_pyg_hook``) gives PyG's ``ClusterData`` /
  ``NeighborSampler`` openipu's partitioner and sampler when neither pyg-lib nor torch-sparse is
  installed, whether or not ``poptorch_geometric`` was imported first (src/openipu_pyg_hook.py).
* ``openipu-horovod.pth`` (``import openipu_hvd_hook``) lets ``import horovod.torch`` give
  openipu's stand-in when no real Horovod is installed (src/openipu_hvd_hook.py).

All import nothing else at start-up."""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

PTHS = ("openipu-tensorflow.pth", "openipu-pyg.pth", "openipu-horovod.pth")


class BuildPyWithPth(build_py):
    def run(self):
        super().run()
        for pth in PTHS:
            self.copy_file(os.path.join("src", pth), os.path.join(self.build_lib, pth), preserve_mode=0)

    def get_outputs(self, include_bytecode=1):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, pth) for pth in PTHS]

    def get_output_mapping(self):
        mapping = super().get_output_mapping()
        for pth in PTHS:
            mapping[os.path.join(self.build_lib, pth)] = os.path.join("src", pth)
        return mapping


setup(cmdclass={"build_py": BuildPyWithPth})
