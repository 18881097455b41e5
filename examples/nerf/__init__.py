"""NeRF example for tf-metal-ops.

Importable as the package ``nerf`` when ``examples/`` is on ``sys.path`` (``train.py`` and the tests do this), so
the scene generator, loaders and models can be tested on their own.
"""
